"""Two reference relays for the bench: what a Python relay costs before specproxy adds anything.

``python -m specproxy.bench.floors splice|aiohttp --upstream URL`` prints its URL on stderr and relays to ``URL``:

- ``splice``: a uvloop TCP splice. Each accepted connection gets its own upstream connection and bytes are copied
  both ways as they arrive, with flow control (a side whose peer's buffer is full stops reading). No HTTP parsing at
  all: the least any Python relay on uvloop can do per chunk (one read callback, one write call).
- ``aiohttp``: an HTTP pass-through in aiohttp, the way specproxy relays (client session, ``iter_any()``, a
  ``StreamResponse`` written read by read) with nothing recorded: what aiohttp itself costs per chunk.

Beside nginx and specproxy in ``specproxy bench --floors``, the rows split a relay's cost into the interpreter and
event loop, aiohttp, and specproxy's own work. Neither is a proxy to deploy: no limits, no timeouts, no errors handled
beyond closing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any
from urllib.parse import urlsplit

HIGH_WATER = 256 * 1024


class _Side(asyncio.Protocol):
    """One end of a splice: what it reads goes to ``peer``; it stops reading while ``peer`` cannot take more."""

    def __init__(self) -> None:
        self.transport: Any = None  # uvloop's TCPTransport is not an asyncio.Transport subclass
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # read before the peer was connected
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transport.set_write_buffer_limits(high=HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def splice(upstream: str) -> None:
    u = urlsplit(upstream)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    loop = asyncio.get_running_loop()

    class Front(_Side):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            assert self.transport is not None
            self.transport.pause_reading()
            self.connecting = loop.create_task(self._connect())

        async def _connect(self) -> None:
            try:
                _, back = await loop.create_connection(_Side, host, port)
            except OSError:
                if self.transport is not None:
                    self.transport.close()
                return
            back.peer, self.peer = self, back
            assert self.transport is not None and back.transport is not None
            for data in self.pending:
                back.transport.write(data)
            self.pending.clear()
            if self.closed:
                back.transport.close()
            else:
                self.transport.resume_reading()

    server = await loop.create_server(Front, "127.0.0.1", 0, backlog=1024)
    print(f"splice on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", file=sys.stderr, flush=True)
    await server.serve_forever()


async def aiohttp_relay(upstream: str) -> None:
    import aiohttp
    from aiohttp import web

    drop = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}
    session = aiohttp.ClientSession(
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
        connector=aiohttp.TCPConnector(limit=0),
    )

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in drop}
        async with session.request(request.method, upstream + request.raw_path, headers=headers, data=body) as up:
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in drop:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            return resp

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    print(f"aiohttp pass-through on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m specproxy.bench.floors", description=__doc__.split("\n", 1)[0])
    p.add_argument("kind", choices=("splice", "aiohttp"))
    p.add_argument("--upstream", required=True)
    a = p.parse_args(argv)
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(splice(a.upstream) if a.kind == "splice" else aiohttp_relay(a.upstream))


if __name__ == "__main__":
    main()
