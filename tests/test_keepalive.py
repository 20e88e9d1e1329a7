"""Idle connections to an engine are ours to close first.

vLLM closes an idle keep-alive connection after 5 s. A POST sent on a pooled connection just as the engine closes it
fails before any response, and nobody retries a POST: through the proxy that is a 502 for the client, in the load
generator a failed request (seen in a run against real vLLM, where aiohttp's pool hands out its oldest idle connection
first, and aiohttp keeps idle connections 15 s). The upstream here makes that race certain: it drops, unanswered, a
request that arrives on a connection idle longer than its own keep-alive, which is a little longer than ours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from specproxy.core.headers import CLIENT_KEEPALIVE_S
from specproxy.loadgen.target import Target
from tests.proxyutil import running_proxy

ENGINE_KEEPALIVE_S = CLIENT_KEEPALIVE_S + 0.3
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@asynccontextmanager
async def strict_keepalive_upstream() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP/1.1 server answering every request with ``{}``; a request on a connection idle longer than
    ENGINE_KEEPALIVE_S is dropped unanswered, as if it crossed the server's close."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        idle_since: float | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if idle_since is not None and time.monotonic() - idle_since > ENGINE_KEEPALIVE_S:
                    seen.append("dropped")
                    writer.transport.abort()
                    return
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                seen.append("answered")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


async def _two_requests(url: str) -> list[int]:
    """Two requests through one pooled session, the second after the first's connection sat idle past the
    upstream's keep-alive."""
    statuses = []
    async with Target(url).session() as s:
        for pause in (0.0, ENGINE_KEEPALIVE_S + 0.2):
            await asyncio.sleep(pause)
            async with s.post(url + "/v1/chat/completions", data=BODY) as resp:
                await resp.read()
                statuses.append(resp.status)
    return statuses


async def test_the_proxy_never_sends_on_a_connection_the_engine_may_have_closed(tmp_path: Path) -> None:
    async with strict_keepalive_upstream() as (upstream, seen), running_proxy(upstream, tmp_path, metrics=False) as px:
        statuses = await _two_requests(
            px.url
        )  # the client's own connection to the proxy is reused: only upstream's ages
    assert statuses == [200, 200] and seen == ["answered", "answered"], (statuses, seen)


async def test_the_load_generator_never_sends_on_a_connection_the_engine_may_have_closed() -> None:
    async with strict_keepalive_upstream() as (upstream, seen):
        statuses = await _two_requests(upstream)
    assert statuses == [200, 200] and seen == ["answered", "answered"], (statuses, seen)
