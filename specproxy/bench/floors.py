"""Two reference relays for the bench: what a Python relay costs before specproxy adds anything.

``python -m specproxy.bench.floors splice|aiohttp --upstream URL`` prints its URL on stderr and relays to ``URL``:

- ``splice``: a uvloop TCP splice. Each accepted connection gets its own upstream connection and bytes are copied
  both ways as they arrive, with flow control (a side whose peer's buffer is full stops reading). No HTTP parsing at
  all: the least any Python relay on uvloop can do per chunk (one read callback, one write call). With
  ``--processes N``, N splice processes on one port (SO_REUSEPORT, as ``specproxy proxy --workers N`` puts its
  relays), named ``sp-splice-I``: how far the least a relay can do scales over cores on the same machine and load,
  the reference for ``--workers N``'s ratios.
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
import os
import signal
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

HIGH_WATER = 256 * 1024
SPLICE_PREFIX = "sp-splice-"  # + the process's number: a splice process of ``--processes N``


def floor_rows(workers: list[int | None]) -> list[tuple[str, str, int]]:
    """The reference relays beside specproxy's rows of ``--workers`` ``workers`` (kind, row name, processes): the
    aiohttp pass-through and the splice, and the splice in as many processes as each row beyond one."""
    rows = [("aiohttp", "floor: aiohttp pass-through", 1), ("splice", "floor: uvloop TCP splice", 1)]
    return rows + [("splice", f"floor: uvloop TCP splice x{n}", n) for n in workers if n and n > 1]


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


async def splice(upstream: str, listen_port: int = 0, pipes: tuple[int, int] | None = None) -> None:
    """Relay to ``upstream`` on ``listen_port`` (0: any free one). With ``pipes`` (two pipes' ends: ready, life): one
    of several processes on a port shared with SO_REUSEPORT, which says on ``ready`` that it listens and ends when
    ``life`` reads end of file (the launcher, which holds its other end, is gone)."""
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

    server = await loop.create_server(Front, "127.0.0.1", listen_port, backlog=1024, reuse_port=pipes is not None)
    if pipes is None:
        print(f"splice on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", file=sys.stderr, flush=True)
        await server.serve_forever()
        return
    ready, life = pipes
    os.write(ready, b"1")
    os.close(ready)
    gone = asyncio.Event()
    loop.add_reader(life, gone.set)  # readable only at end of file: the launcher never writes
    await gone.wait()


def splice_processes(upstream: str, n: int) -> None:
    """``n`` splice processes on one port: this one holds the port (bound, never listening, so SO_REUSEPORT gives it
    no connection) until each has said it listens, then prints the URL and waits; a SIGTERM ends them all."""
    import uvloop

    from specproxy.proxy.children import name_process

    hold = socket.socket()
    hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    hold.bind(("127.0.0.1", 0))
    port = hold.getsockname()[1]
    life_r, life_w = os.pipe()  # the launcher holds the writing end until it ends, however it ends
    pids = []
    for i in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(life_w)
            hold.close()
            name_process(f"{SPLICE_PREFIX}{i}")
            with contextlib.suppress(KeyboardInterrupt):
                uvloop.run(splice(upstream, port, (w, life_r)))
            os._exit(0)
        os.close(w)
        pids.append(pid)
        if os.read(r, 1) != b"1":
            raise SystemExit(f"splice process {i} did not start")
        os.close(r)
    hold.close()
    os.close(life_r)

    def stop(*_: object) -> None:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"splice x{n} on http://127.0.0.1:{port}", file=sys.stderr, flush=True)
    os.waitpid(-1, 0)  # one of them ended by itself: end the rest
    stop()


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
    p.add_argument("--processes", type=int, default=1, help="splice only: this many processes on one port")
    a = p.parse_args(argv)
    if a.processes < 1 or (a.processes > 1 and a.kind != "splice"):
        p.error("--processes: at least 1, and more than 1 only for splice")
    if a.processes > 1:
        with contextlib.suppress(KeyboardInterrupt):
            splice_processes(a.upstream, a.processes)
        return
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(splice(a.upstream) if a.kind == "splice" else aiohttp_relay(a.upstream))


if __name__ == "__main__":
    main()
