"""One request that specproxy sends itself (the load generator's, a proxy's shadow), its reply fed to a
:class:`~specproxy.recorder.trace.Trace` read by read, and the outcome a record takes from how it ended.

Every ``iter_any()`` read is stamped with ``perf_counter_ns`` and fed as it comes; nothing else runs per read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import aiohttp

from specproxy.core.errors import one_line
from specproxy.recorder.trace import Trace


async def exchange(
    session: aiohttp.ClientSession, url: str, data: bytes, headers: Mapping[str, str], trace: Trace
) -> tuple[str, str | None]:
    """POST ``data`` to ``url`` and feed the reply to ``trace``; (outcome, error) for its record. Never raises but
    for cancellation (the caller records that as it sees fit)."""
    perf = time.perf_counter_ns
    started = False
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            trace.response_started(resp.status, resp.headers.get("Content-Type"))
            started = True
            async for chunk in resp.content.iter_any():
                trace.feed(perf(), chunk)
            if resp.status >= 400:
                return "upstream_error", f"HTTP {resp.status}"
            return "ok", None
    except TimeoutError:
        return "timeout", "connect or idle-read timeout"
    except aiohttp.ClientConnectorError as e:
        return "upstream_error", f"cannot connect: {e.os_error.strerror or short(e)}"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        if started:
            return "upstream_reset", f"connection broke mid-response: {short(e)}"
        return "upstream_error", f"connection failed: {short(e)}"
    except aiohttp.ClientError as e:
        return "upstream_error", short(e)
    except Exception as e:  # our own failure: still a record, never a crashed run
        return "proxy_error", f"{type(e).__name__}: {short(e)}"


def short(e: BaseException) -> str:
    return one_line(e, 300) or type(e).__name__
