"""The fast lane on real sockets: a plain POST is answered by it with the bytes aiohttp's front door would have sent;
a connection moves to aiohttp at the first request the fast lane does not take, and goes on working; pipelined
requests are answered in order; a client that leaves mid-stream cancels its request upstream; the stop closes what
is idle and records what it cuts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from pathlib import Path

import pytest

from specproxy.core.record import read_records
from specproxy.proxy.server import ProxyHandle
from tests.proxyutil import started_proxy
from tests.upstreams import Script, start_raw_upstream, start_upstream

BODY = b'{"model":"m","messages":[],"stream":true}'


def _post(path: str = "/v1/chat/completions", *, close: bool = False, extra: bytes = b"") -> bytes:
    fields = b"Host: proxy\r\nContent-Type: application/json\r\n" + (b"Connection: close\r\n" if close else b"")
    return b"POST %b HTTP/1.1\r\n%b%bContent-Length: %d\r\n\r\n%b" % (path.encode(), fields, extra, len(BODY), BODY)


async def _exchange(px: ProxyHandle, data: bytes, within_s: float = 10.0) -> bytes:
    """Send ``data`` on a new connection and read until the proxy closes it."""
    host, port = px.url.rsplit("/", 1)[-1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        async with asyncio.timeout(within_s):
            return await reader.read(-1)
    finally:
        writer.close()


def _served(px: ProxyHandle) -> int:
    """Requests the fast lane read."""
    return px.link.fast_lane


def _masked(answer: bytes) -> bytes:
    """An answer without what differs from one to the next: the date, the request's id."""
    answer = re.sub(rb"\r\nDate: [^\r]*", b"\r\nDate: -", answer)
    return re.sub(rb"\r\nX-Specproxy-Request-Id: [0-9a-f]+", b"\r\nX-Specproxy-Request-Id: -", answer)


REPLIES = {
    "event stream": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'e\r\ndata: {"a":1}\n\n\r\n0\r\n\r\n',
    "json with a length": b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}',
    "error": b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    "no content": b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",
    "no content type, chunked": b"HTTP/1.1 200 Fine\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "the engine's own fields": b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
    b"x-specproxy-request-id: theirs\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\n"
    b"Cache-Control: no-store\r\nContent-Type: text/event-stream; charset=utf-8\r\nContent-Length: 0\r\n\r\n",
}


GET_MODELS = b"GET /v1/models?x=%2F HTTP/1.1\r\nHost: proxy\r\nAccept: */*\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("method", ["POST", "GET"])
@pytest.mark.parametrize("reply", list(REPLIES), ids=list(REPLIES))
async def test_both_front_doors_send_the_same_bytes(tmp_path: Path, reply: str, method: str) -> None:
    up = await start_raw_upstream(REPLIES[reply])
    answers = {}
    try:
        for fast in (True, False):
            async with started_proxy(up.url, tmp_path / str(fast), fast_lane=fast) as px:
                answers[fast] = await _exchange(px, _post(close=True) if method == "POST" else GET_MODELS)
                assert _served(px) == (1 if fast else 0)
    finally:
        await up.close()
    assert answers[True].startswith(REPLIES[reply][:12])
    assert _masked(answers[True]) == _masked(answers[False])
    assert up.heads[0] == up.heads[1]  # what went upstream is the same too


async def test_the_own_endpoints_through_either_door(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    heads = {}
    try:
        for fast in (True, False):
            async with started_proxy(up.url, tmp_path / str(fast), fast_lane=fast) as px:
                for path in (b"/specproxy/status", b"/specproxy/metrics"):
                    get = b"GET %b HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n" % path
                    head, _, body = (await _exchange(px, get)).partition(b"\r\n\r\n")
                    heads[fast, path] = re.sub(rb"\r\nContent-Length: \d+", b"", _masked(head))
                    assert int(re.findall(rb"Content-Length: (\d+)", head)[0]) == len(body) > 0
                    if path.endswith(b"status"):
                        assert "bookkeeping" in json.loads(body)
                assert _served(px) == (2 if fast else 0)
    finally:
        await up.close()
    assert up.heads == []  # answered by the proxy, not relayed
    for path in (b"/specproxy/status", b"/specproxy/metrics"):
        assert heads[True, path] == heads[False, path] and heads[True, path].startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_connection_moves_to_aiohttp_and_goes_on(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    try:
        async with started_proxy(up.url, tmp_path) as px:
            # the fast lane's POST, then a HEAD it leaves to aiohttp, then a POST aiohttp now reads too
            data = _post() + b"HEAD /specproxy/status HTTP/1.1\r\nHost: proxy\r\n\r\n" + _post(close=True)
            answer = await _exchange(px, data)
            assert (px.link.fast_lane, px.link.handed) == (1, 1)
        first, status, last = answer.split(b"HTTP/1.1 200 OK\r\n")[1:]
        assert first.endswith(b"\r\n\r\nok") and last.endswith(b"\r\n\r\nok")
        assert b"Content-Type: application/json" in status and status.endswith(b"\r\n\r\n")  # HEAD: no body
        assert up.lines == [b"POST /v1/chat/completions HTTP/1.1"] * 2
    finally:
        await up.close()
    records = list(read_records(tmp_path / "records.jsonl"))
    assert [r["outcome"] for r in records] == ["ok", "ok"]


async def test_pipelined_posts_are_answered_in_order(tmp_path: Path) -> None:
    up = await start_upstream(lambda req, body: Script([req.path.encode()], headers={}, content_length=True))
    try:
        async with started_proxy(up.url, tmp_path) as px:
            data = _post("/v1/a") + _post("/v1/b") + _post("/v1/c", close=True)
            answer = await _exchange(px, data)
            assert _served(px) == 3
    finally:
        await up.server.close()
    bodies = [part.rsplit(b"\r\n\r\n", 1)[1] for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert bodies == [b"/v1/a", b"/v1/b", b"/v1/c"]
    assert answer.count(b"Connection: close") == 1


async def test_a_body_that_comes_after_its_head(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    try:
        async with started_proxy(up.url, tmp_path) as px:
            host, port = px.url.rsplit("/", 1)[-1].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                request = _post(close=True)
                writer.write(request[:-10])
                await writer.drain()
                for _ in range(20):  # the proxy has had its chance to read the head: nothing went upstream
                    await asyncio.sleep(0)
                assert up.heads == []
                writer.write(request[-10:])
                async with asyncio.timeout(10):
                    answer = await reader.read(-1)
            finally:
                writer.close()
            assert _served(px) == 1
    finally:
        await up.close()
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok")


@pytest.mark.parametrize("fast", [True, False], ids=["fast lane", "aiohttp"])
async def test_a_client_that_leaves_cancels_its_stream(tmp_path: Path, fast: bool) -> None:
    pieces = [b"data: {}\n\n"] * 200
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=0.05))
    try:
        async with started_proxy(up.url, tmp_path, fast_lane=fast) as px:
            host, port = px.url.rsplit("/", 1)[-1].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(_post())
            async with asyncio.timeout(10):
                await reader.readuntil(b"data: {}")  # the stream has begun
            writer.close()
            for _ in range(2000):  # the upstream sees the cut
                if up.cancelled:
                    break
                await asyncio.sleep(0.005)
            assert up.cancelled
            assert _served(px) == (1 if fast else 0)
    finally:
        await up.server.close()
    [record] = read_records(tmp_path / "records.jsonl")
    assert record["outcome"] == "client_cancelled"


@pytest.mark.parametrize("fast", [True, False], ids=["fast lane", "aiohttp"])
async def test_the_stop_closes_idle_connections_and_cuts_streams(tmp_path: Path, fast: bool) -> None:
    up = await start_upstream(lambda req, body: Script([b"data: {}\n\n"] * 400, pause_s=0.05))
    writers: list[asyncio.StreamWriter] = []
    try:
        async with started_proxy(up.url, tmp_path, drain_timeout_s=0.5, fast_lane=fast) as px:
            host, port = px.url.rsplit("/", 1)[-1].rsplit(":", 1)
            idle_r, idle_w = await asyncio.open_connection(host, int(port))
            stream_r, stream_w = await asyncio.open_connection(host, int(port))
            writers += [idle_w, stream_w]
            stream_w.write(_post())
            async with asyncio.timeout(10):
                await stream_r.readuntil(b"data: {}")
            assert _served(px) == (1 if fast else 0)
        async with asyncio.timeout(10):  # the stop (on leaving the block) closed both
            assert await idle_r.read(-1) == b""
            with contextlib.suppress(ConnectionResetError):
                await stream_r.read(-1)
    finally:
        for w in writers:
            w.close()
        await up.server.close()
    [record] = read_records(tmp_path / "records.jsonl")
    assert record["outcome"] == "shutdown"
