"""Talking to the target before a run: wait until it is ready, check it answers, find the model it serves.

Everything here fails with :class:`TargetError`, a one-line message, before any measured request is sent.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from specproxy.core.headers import CLIENT_KEEPALIVE_S
from specproxy.core.prom import MetricsParseError, detect_engine, parse_snapshot, spec_counters


class TargetError(Exception):
    """The target cannot be used; the message is one line naming it."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where requests go and how: the base URL, extra headers (authorization), connect and idle-read timeouts."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0

    def session(self) -> aiohttp.ClientSession:
        # No connection cap (aiohttp's default of 100 would cap concurrency) and no total timeout (long generations).
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout_s, sock_read=self.idle_timeout_s
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
        )


def _reason(e: BaseException) -> str:
    os_error = getattr(e, "os_error", e)
    if isinstance(os_error, OSError) and os_error.errno:
        return os.strerror(os_error.errno)  # "Connection refused", not the event loop's own wording
    if isinstance(e, TimeoutError):
        return "timed out"
    return " ".join(str(e).split()) or type(e).__name__


async def wait_ready(
    session: aiohttp.ClientSession, target: str, timeout_s: float, *, headers: Mapping[str, str] | None = None
) -> None:
    """Poll ``GET /health`` until it answers 200, for at most ``timeout_s`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = "no answer"
    while True:
        try:
            async with session.get(
                f"{target}/health", headers=headers, timeout=aiohttp.ClientTimeout(total=min(5.0, timeout_s) or 1.0)
            ) as resp:
                await resp.read()
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            last = _reason(e)
        left = deadline - loop.time()
        if left <= 0:
            raise TargetError(f"target {target} not ready after {timeout_s:g} s (last: {last})")
        await asyncio.sleep(min(0.5, left))


async def find_model(
    session: aiohttp.ClientSession,
    target: str,
    model: str | None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> str:
    """``model`` when given (after checking the target answers at all), else the first id of ``GET /v1/models``."""
    url = f"{target}/v1/models"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status = resp.status
            data = await resp.json(content_type=None) if status == 200 else None
    except (aiohttp.ClientConnectionError, TimeoutError, OSError) as e:
        raise TargetError(f"cannot reach target {target}: {_reason(e)}") from None
    except (aiohttp.ClientError, ValueError) as e:
        if model is not None:
            return model
        raise TargetError(f"cannot read the model list at {url}: {_reason(e)}; pass --model") from None
    if model is not None:
        return model
    if status != 200:
        raise TargetError(f"cannot find the served model: GET {url} answered HTTP {status}; pass --model")
    models = data.get("data") if isinstance(data, dict) else None
    first = models[0] if isinstance(models, list) and models else None
    mid = first.get("id") if isinstance(first, dict) else None
    if not isinstance(mid, str) or not mid:
        raise TargetError(f"GET {url} lists no model; pass --model")
    return mid


async def counters_k(session: aiohttp.ClientSession, metrics_url: str, *, timeout_s: float = 5.0) -> int | None:
    """``num_speculative_tokens`` from one scrape of the engine's cumulative counters (draft tokens / drafts since
    it started), or None when it has not speculated yet or cannot be read. ngram proposes up to k tokens, so the
    ratio can fall a little short of k: it is rounded up past a small tolerance."""
    try:
        async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
        snap = parse_snapshot(text)
    except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError, MetricsParseError):
        return None
    c = spec_counters(detect_engine(snap), snap.values)
    if not c.drafts or not c.draft_tokens:
        return None
    return max(1, math.ceil(c.draft_tokens / c.drafts - 0.05))
