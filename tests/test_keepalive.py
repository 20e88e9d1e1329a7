"""Idle connections to an engine are ours to close first, and a request the engine never answered is not lost.

vLLM closes an idle keep-alive connection after 5 s. A POST sent on a pooled connection just as the engine closes it
fails before any response, and aiohttp retries only idempotent methods: through the proxy that was a 502 for the
client, in the load generator a failed request (seen in a run against real vLLM, where aiohttp's pool hands out its
oldest idle connection first, and aiohttp keeps idle connections 15 s). The first upstream here makes that race
certain: it drops, unanswered, a request that arrives on a connection idle longer than its own keep-alive, which is a
little longer than ours. An upstream whose keep-alive we cannot know (a balancer in front of it) can still close a
pooled connection as it is reused: the proxy then sends the request once more on a new connection (the second
upstream here closes every connection after one answer).
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


@asynccontextmanager
async def closing_upstream(drop_fresh_after: int) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP/1.1 server that answers the first request of each connection with ``{}`` and drops, unanswered, every
    later request on that connection: the race of a keep-alive close, made certain. After ``drop_fresh_after``
    answers in all, it drops the first request of new connections too (an upstream that is going away)."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if served or seen.count("answered") >= drop_fresh_after:
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
                served += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()
        await server.wait_closed()


async def _posts(url: str, n: int) -> list[tuple[int, bytes]]:
    out = []
    async with Target(url).session() as s:
        for _ in range(n):
            async with s.post(url + "/v1/chat/completions", data=BODY) as resp:
                out.append((resp.status, await resp.read()))
    return out


async def test_a_post_on_a_pooled_connection_the_upstream_closed_is_sent_again_once(tmp_path: Path) -> None:
    """Without the second send, the client gets a 502 for a request the engine never answered (the relay's pooled
    connection was closed under it)."""
    async with (
        closing_upstream(drop_fresh_after=99) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
    ):
        got = await _posts(px.url, 3)
        await px.flush()
        recs = px.records()
    assert [status for status, _ in got] == [200, 200, 200] and all(b == b"{}" for _, b in got), got
    assert seen == ["answered", "dropped", "answered", "dropped", "answered"], seen
    flags = [r["flags"] for r in sorted(recs, key=lambda r: r["started_at"])]
    assert ["upstream_retried" in f for f in flags] == [False, True, True], flags
    assert all(r["outcome"] == "ok" and r["status"] == 200 for r in recs)


async def test_a_second_failure_is_answered_and_never_retried_again(tmp_path: Path) -> None:
    async with (
        closing_upstream(drop_fresh_after=1) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
    ):
        got = await _posts(px.url, 2)
        await px.flush()
        recs = sorted(px.records(), key=lambda r: r["started_at"])
    assert [status for status, _ in got] == [200, 502], got
    assert seen == ["answered", "dropped", "dropped"], seen  # the reused connection, then one new one: no third send
    assert recs[1]["outcome"] == "upstream_error" and "sent twice" in (recs[1]["error"] or ""), recs[1]


async def test_a_post_that_fails_on_a_new_connection_is_not_sent_again(tmp_path: Path) -> None:
    async with (
        closing_upstream(drop_fresh_after=0) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
    ):
        got = await _posts(px.url, 1)
    assert [status for status, _ in got] == [502] and seen == ["dropped"], (got, seen)
