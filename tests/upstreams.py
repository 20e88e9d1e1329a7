"""Real aiohttp upstreams for proxy tests: they answer with exact bytes, so what reaches the client can be compared
byte for byte, and with the real vLLM captures so attribution can be checked against real figures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

DATA = Path(__file__).parent / "data"


@dataclass
class Script:
    """What the scripted upstream sends for a request: status, headers, and body pieces with pauses."""

    pieces: list[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/event-stream; charset=utf-8"})
    pause_s: float = 0.0
    reset_after: int | None = None  # abort the connection after this many pieces
    stall_s: float = 0.0  # before the headers
    content_length: bool = False


@dataclass
class Upstream:
    server: TestServer
    seen: list[dict[str, object]]
    cancelled: list[float]
    metrics_texts: list[str]
    completed: list[int]

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


def capture_pieces(name: str) -> list[bytes]:
    raw = (DATA / name).read_bytes()
    return [blk + b"\n\n" for blk in raw.split(b"\n\n") if blk]


async def start_upstream(
    script_for: Callable[[web.Request, bytes], Script], metrics: list[str] | None = None
) -> Upstream:
    seen: list[dict[str, object]] = []
    cancelled: list[float] = []
    metrics_texts = list(metrics or [])
    completed = [0]  # streams finished so far: /metrics shows metrics[completed] like an engine that counted them

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append({"method": request.method, "path": request.path_qs, "headers": dict(request.headers), "body": body})
        script = script_for(request, body)
        try:
            if script.stall_s:
                await asyncio.sleep(script.stall_s)
            resp = web.StreamResponse(status=script.status, headers=script.headers)
            if script.content_length:
                resp.content_length = sum(len(p) for p in script.pieces)
            await resp.prepare(request)
            for i, piece in enumerate(script.pieces):
                if script.reset_after is not None and i >= script.reset_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                await resp.write(piece)
                if script.pause_s:
                    await asyncio.sleep(script.pause_s)
            await resp.write_eof()
            completed[0] += 1
            return resp
        except asyncio.CancelledError:
            cancelled.append(asyncio.get_running_loop().time())
            raise

    async def metrics_handler(request: web.Request) -> web.Response:
        if not metrics_texts:
            return web.Response(text="", content_type="text/plain")
        return web.Response(text=metrics_texts[min(completed[0], len(metrics_texts) - 1)], content_type="text/plain")

    app = web.Application(client_max_size=1024**3)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app, host="127.0.0.1", port=0, handler_cancellation=True)
    await server.start_server()
    return Upstream(server, seen, cancelled, metrics_texts, completed)


@dataclass
class RawUpstream:
    """An upstream below HTTP libraries: it keeps each request line and head exactly as their bytes arrived (no URL
    parsing on the way) and answers every request with ``reply``, on a kept-alive connection."""

    server: asyncio.Server
    lines: list[bytes]
    heads: list[bytes] = field(default_factory=list)  # each request's head, whole, as it arrived

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


OK_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def content_length(head: bytes) -> int:
    """The Content-Length of a request head read up to its blank line (0 when it has none)."""
    for field_line in head.split(b"\r\n")[1:]:
        name, _, value = field_line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@asynccontextmanager
async def serving(
    on_connection: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A raw TCP server on 127.0.0.1 port 0 for the block: its URL."""
    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def start_raw_upstream(reply: bytes | list[bytes] = OK_REPLY, *, close_after: bool = False) -> RawUpstream:
    """``reply``: its bytes, or pieces written 50 ms apart (each its own read); ``close_after``: close the
    connection after the reply (a body delimited by the close, as in HTTP/1.0)."""
    pieces = reply if isinstance(reply, list) else [reply]
    lines: list[bytes] = []
    heads: list[bytes] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines.append(head.split(b"\r\n", 1)[0])
                heads.append(head)
                await reader.readexactly(content_length(head))
                for i, piece in enumerate(pieces):
                    if i:
                        await asyncio.sleep(0.05)
                    writer.write(piece)
                    await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return RawUpstream(server, lines, heads)
