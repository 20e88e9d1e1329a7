"""``--engine auto``'s one look at the upstream when the recorder starts: the well-known GET paths of each engine
(:data:`specproxy.core.dialects.engine.PROBES`) and the ``Server`` header of their answers. Off the relay path (a
task of its own), bounded (one request per path, a short timeout, at most 64 KiB read each), and never fatal:
an engine that answers none leaves the records' ``engine`` to what responses and ``/metrics`` show.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import orjson

from specproxy.core.dialects.engine import PROBES, from_metrics, from_probe, from_server_header, resolve
from specproxy.core.errors import shown_url

log = logging.getLogger("specproxy.recorder")

PROBE_READ_BYTES = 64 * 1024


async def probe_engine(session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = 2.0) -> str | None:
    base = base_url.rstrip("/")
    for path, _ in PROBES:
        try:
            async with session.get(
                base + path, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False
            ) as resp:
                by_header = from_server_header(resp.headers.get("Server"))
                if by_header is not None:
                    return by_header
                body = await resp.content.read(PROBE_READ_BYTES)
                try:
                    obj = orjson.loads(body)
                except orjson.JSONDecodeError:
                    continue
                found = from_probe(path, resp.status, obj)
                if found is not None:
                    return found
        except (aiohttp.ClientError, TimeoutError, OSError):
            continue
    return None


class EngineIdentity:
    """The engine a recorder's records name: ``--engine``, else (auto) what each response's shape shows, then the
    ``/metrics`` prefixes, then what the start probe found."""

    def __init__(self, session: aiohttp.ClientSession, configured: str, probe_url: str | None) -> None:
        self._session = session
        self.configured = configured
        self._probe_url = probe_url if configured == "auto" else None
        self.probed: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._probe_url:
            self._task = asyncio.get_running_loop().create_task(self._run(self._probe_url))

    async def _run(self, url: str) -> None:
        try:
            self.probed = await probe_engine(self._session, url)
        except Exception:  # a probe must never take the recorder down
            log.exception("probing the engine at %s failed", shown_url(url))  # no credentials in logs

    def of(self, response_hint: str | None, metrics_kind: str | None) -> str | None:
        return resolve(self.configured, response_hint, from_metrics(metrics_kind), self.probed)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
