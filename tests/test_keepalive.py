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
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from specproxy.core.headers import CLIENT_KEEPALIVE_S
from specproxy.loadgen.target import Target
from tests.proxyutil import running_proxy
from tests.upstreams import content_length, serving

ENGINE_KEEPALIVE_S = CLIENT_KEEPALIVE_S + 0.3
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close as a server that closed this connection before the request reached it: the request arrives at a closed
    socket and the peer's kernel answers with a reset (SO_LINGER 0 makes the close one), never a clean end."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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
                    _reset(writer)
                    return
                await reader.readexactly(content_length(head))
                seen.append("answered")
                writer.write(ANSWER)
                await writer.drain()
                idle_since = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async with serving(serve) as url:
        yield url, seen


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
async def closing_upstream(
    drop_fresh_after: int, work_s: float = 0.0, *, read_whole: bool = False
) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP/1.1 server that answers the first request of each connection with ``{}`` and drops, unanswered, every
    later request on that connection: the race of a keep-alive close, made certain (a reset: the request met a
    closed socket). After ``drop_fresh_after`` answers in all, it drops the first request of new connections too (an
    upstream that is going away). With ``work_s`` or ``read_whole``, a request it drops is first read whole (and
    worked on ``work_s``), then the connection ends cleanly: an engine that read it and died on it."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = content_length(head)
                if served or seen.count("answered") >= drop_fresh_after:
                    seen.append("dropped")
                    if not (work_s or read_whole):
                        _reset(writer)
                        return
                    await reader.readexactly(length)
                    await asyncio.sleep(work_s)
                    writer.close()
                    return
                await reader.readexactly(length)
                seen.append("answered")
                served += 1
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async with serving(serve) as url:
        yield url, seen


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
    # the second send went out on a new connection, which went back to the pool; this upstream drops the third
    # request on it too, and that one is sent again as well
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


async def test_the_second_send_goes_out_on_a_new_connection_whatever_the_pool_holds(tmp_path: Path) -> None:
    """Three pooled connections, each of which the upstream will drop: the second send must not take another."""
    async with (
        closing_upstream(drop_fresh_after=99) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
        Target(px.url).session() as s,
    ):

        async def post() -> int:
            async with s.post(px.url + "/v1/chat/completions", data=BODY) as resp:
                await resp.read()
                return resp.status

        first = await asyncio.gather(*(post() for _ in range(3)))  # three connections upstream, back in the pool
        then = await post()
    assert first == [200, 200, 200] and then == 200, (first, then)
    assert seen.count("dropped") == 1 and seen.count("answered") == 4, seen


async def test_an_upstream_that_read_the_request_and_died_on_it_is_not_sent_it_again(tmp_path: Path) -> None:
    """A pooled connection that fails well after the request went out (an engine that died generating) is not a
    keep-alive race: the request is answered 502, not generated twice."""
    async with (
        closing_upstream(drop_fresh_after=99, work_s=1.5) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
    ):
        got = await _posts(px.url, 2)
        await px.flush()
        recs = sorted(px.records(), key=lambda r: r["started_at"])
    assert [status for status, _ in got] == [200, 502] and seen == ["answered", "dropped"], (got, seen)
    assert "upstream_retried" not in recs[1]["flags"] and "sent twice" not in (recs[1]["error"] or "")


async def test_a_post_the_upstream_read_whole_then_closed_on_is_not_sent_again(tmp_path: Path) -> None:
    """RFC 9110 9.2.2: a clean close right after the request was read whole may be an engine that crashed on it;
    a POST is not idempotent, so it is answered 502, never generated twice, however soon the close came."""
    async with (
        closing_upstream(drop_fresh_after=99, read_whole=True) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
    ):
        got = await _posts(px.url, 2)
        await px.flush()
        recs = sorted(px.records(), key=lambda r: r["started_at"])
    assert [status for status, _ in got] == [200, 502] and seen == ["answered", "dropped"], (got, seen)
    assert "upstream_retried" not in recs[1]["flags"] and recs[1]["outcome"] == "upstream_error", recs[1]


@pytest.mark.parametrize("read_whole", [False, True], ids=["reset", "read-whole-then-closed"])
async def test_a_get_is_sent_again_once_however_the_connection_failed(tmp_path: Path, read_whole: bool) -> None:
    """An idempotent request is sent once more on a new connection whether the pooled one was reset under it or
    closed after the upstream read it whole (a POST is resent only after a reset); never a third time."""
    async with (
        closing_upstream(drop_fresh_after=1, read_whole=read_whole) as (upstream, seen),
        running_proxy(upstream, tmp_path, metrics=False) as px,
        Target(px.url).session() as s,
    ):
        statuses = []
        for _ in range(2):
            async with s.get(px.url + "/v1/models") as resp:
                statuses.append(resp.status)
                last_body = await resp.read()
    assert statuses == [200, 502] and seen == ["answered", "dropped", "dropped"], (statuses, seen)
    assert b"sent twice" in last_body, last_body  # a GET is not recorded (core.inference): its 502 says it
