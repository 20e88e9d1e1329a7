"""What proxy/server.py assumes of aiohttp beyond its documented API, checked on the installed version, so that an
upgrade which changes one fails here by name (pyproject bounds aiohttp below 4 for the same reason):

- a prepared ``web.StreamResponse`` has its status line and headers on the transport already, so bytes written
  straight to ``request.transport`` after ``prepare()`` (``client_sink``) follow them;
- ``prepare()`` sets ``Transfer-Encoding: chunked`` when it frames the body so (``_relay`` frames the chunks itself),
  and ``write_eof()`` then writes only the last chunk;
- ``request.writer.output_size`` is the count the response's ``body_length`` is taken from, and setting it to 0 after
  writing the interim ``100 Continue`` (``_expect``) keeps those bytes out of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def _serving(handler: Handler) -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _raw_get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await reader.read()  # to EOF: Connection: close
    writer.close()
    await writer.wait_closed()
    return data


async def test_bytes_written_to_the_transport_after_prepare_follow_the_headers() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_length = 5
        await resp.prepare(request)
        assert request.transport is not None
        request.transport.write(b"hello")
        await resp.write_eof()
        return resp

    async with _serving(handler) as port:
        data = await _raw_get(port)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 5" in head
    assert body == b"hello"


async def test_prepare_says_chunked_when_it_frames_so_and_write_eof_ends_the_chunks() -> None:
    seen: dict[str, str | None] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # no length: HTTP/1.1 gets chunked framing
        await resp.prepare(request)
        seen["te"] = resp.headers.get("Transfer-Encoding")
        assert request.transport is not None
        request.transport.write(b"3\r\nabc\r\n")  # framed by us, as client_sink does
        await resp.write_eof()
        return resp

    async with _serving(handler) as port:
        data = await _raw_get(port)
    assert seen["te"] == "chunked"
    _, _, body = data.partition(b"\r\n\r\n")
    assert body == b"3\r\nabc\r\n0\r\n\r\n"


async def test_output_size_is_what_body_length_counts_and_can_be_reset() -> None:
    lengths: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert request.writer.output_size == len(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0
        resp = web.StreamResponse()
        resp.content_length = 2
        await resp.prepare(request)
        await resp.write(b"ok")
        await resp.write_eof()
        lengths.append(resp.body_length)
        return resp

    async with _serving(handler) as port:
        data = await _raw_get(port)  # no Expect header: aiohttp would send its own 100
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\nok")
    (length,) = lengths
    head = data[len(b"HTTP/1.1 100 Continue\r\n\r\n") :].partition(b"\r\n\r\n")[0]
    assert length == len(head) + 4 + 2  # this response's head and body, not the 100 before it
