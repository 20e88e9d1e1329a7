"""What runs inside the child processes of ``specproxy proxy --workers N``: a relay (:func:`relay_main`) and the
bookkeeper (:func:`bookkeeper_main`), each taking orders from the main process on its control socket and new
channels on its handoff socket (a restarted peer's)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import orjson

from specproxy.proxy.bookkeeper import Bookkeeper, Connection
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.server import start_proxy, upstream_session
from specproxy.serving import Cut

log = logging.getLogger("specproxy.proxy")


def name_process(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and ``/proc/PID/stat`` show for this process (15 bytes at most, Linux)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(name[:15])


PARENT_CHECK_S = 0.5


async def open_control(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The control socket's streams; and a watch that ends its orders (EOF) when the main process is gone. The main
    process's end of the socket says so when it closes, but not while any other process still holds a copy of it;
    the parent's pid changing says it whatever holds what."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    parent = os.getppid()
    task = asyncio.get_running_loop().create_task(_watch_parent(parent, sock))
    _WATCHES.add(task)
    task.add_done_callback(_WATCHES.discard)
    return reader, writer


_WATCHES: set[asyncio.Task[None]] = set()


async def _watch_parent(parent: int, sock: socket.socket) -> None:
    while os.getppid() == parent:  # noqa: ASYNC110 - no event says a parent died: the kernel's answer is polled
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("the main process (pid %d) is gone: this process ends as it would at its orders' end", parent)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)  # the orders read their end: the same path as a main process that closed it


LAST_WORD_WAIT_S = 30.0


async def last_word(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, **msg: Any) -> None:
    """This process's last message on its control socket, then its end of it: the message, a half-close (the main
    process reads its end), and what the main process still sends read and dropped until it closes its end (it does
    once it has read this one), for at most :data:`LAST_WORD_WAIT_S`. A Unix socket closed with data unread resets
    its peer (ECONNRESET), and the main process's reader then raises before the line it had already received: an
    order that crossed the last message (a second signal's "cut" sent as a relay ended) made the main process lose
    it, and say the relay had ended without saying how (exit 1)."""
    await _say(writer, **msg)
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        await asyncio.wait_for(reader.read(), LAST_WORD_WAIT_S)


async def _say(writer: asyncio.StreamWriter, **msg: Any) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(orjson.dumps(msg) + b"\n")
        await writer.drain()


def _take_channels(handoff: socket.socket, attach: Callable[[socket.socket], None]) -> None:
    """Channels the main process hands over (SCM_RIGHTS, one byte each), as they come: a relay's to a new
    bookkeeper, the bookkeeper's to a new relay."""
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            data, fds, _, _ = socket.recv_fds(handoff, 64, 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        for fd in fds:
            attach(socket.socket(fileno=fd))
        if not data:  # the main process is gone; its control socket says the rest
            loop.remove_reader(handoff.fileno())

    handoff.setblocking(False)
    loop.add_reader(handoff.fileno(), readable)


async def relay_main(cfg: ProxyConfig, channel: socket.socket, control: socket.socket, handoff: socket.socket) -> int:
    reader, writer = await open_control(control)
    try:
        handle = await start_proxy(cfg, channel, reuse_port=True)
    except OSError as e:
        await _say(writer, error=f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}")
        return 1
    loop = asyncio.get_running_loop()
    link = handle.link
    attaching: set[asyncio.Task[None]] = set()

    def attach(sock: socket.socket) -> None:  # a new bookkeeper: the events go there from now on
        task = loop.create_task(link.attach_socket(sock))
        attaching.add(task)
        task.add_done_callback(attaching.discard)

    _take_channels(handoff, attach)
    await _say(writer, ready=os.getpid())
    cut = Cut()
    stop = asyncio.Event()

    async def orders() -> None:
        while line := await reader.readline():
            msg = orjson.loads(line)
            if "restarts" in msg:
                link.restarts = dict(msg["restarts"])
            if msg.get("do") == "unlisten":  # every relay stops listening before any closes a connection
                for site in list(handle.runner.sites):
                    await site.stop()
                await _say(writer, unlistened=True)
                continue
            if msg.get("do") in ("stop", "cut"):
                stop.set()
            if msg.get("do") == "cut":
                cut.now(msg["reason"], msg.get("signum"))
        stop.set()  # the main process is gone: so is this one, at once
        cut.now("the end of the main process")

    task = loop.create_task(orders())
    await stop.wait()
    stopped = await handle.close(cut)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # its read of the orders ends before the last word reads the rest
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(handoff.fileno())
    await last_word(reader, writer, cut=stopped.cut, reason=stopped.cut_reason, signum=stopped.signum, **link.final())
    return 0


class _KeeperSide(asyncio.Protocol):
    """One relay's channel, at the bookkeeper."""

    def __init__(self, keeper: Bookkeeper) -> None:
        self.keeper = keeper
        self.conn: Connection | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn = self.keeper.connect(transport.write)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.received(data)

    def eof_received(self) -> bool:
        """The relay stops (it half-closed: it still reads): acknowledgements from now on are the bookkeeper's to
        report at its end (late), and the channel closes; those sent before reach the relay."""
        if self.conn is not None:
            self.conn.lost("its relay stopped")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.lost("its relay process ended")
        if not self.closed.done():
            self.closed.set_result(None)


async def bookkeeper_main(
    cfg: ProxyConfig, channels: list[socket.socket], control: socket.socket, handoff: socket.socket
) -> int:
    reader, writer = await open_control(control)
    loop = asyncio.get_running_loop()
    session = upstream_session(cfg)
    keeper = Bookkeeper.create(cfg, session)
    await _say(writer, ready=os.getpid())
    # scrapes (and what they may log) begin once the proxy has said where it listens; relays' events wait in their
    # channels meanwhile
    go = orjson.loads(await reader.readline() or b"{}")
    keeper.restarts = dict(go.get("restarts", {}))
    await keeper.start()
    sides: list[_KeeperSide] = []

    async def attach_one(sock: socket.socket) -> None:
        _, side = await loop.create_unix_connection(lambda: _KeeperSide(keeper), sock=sock)
        sides.append(side)

    attaching: set[asyncio.Task[None]] = set()

    def attach(sock: socket.socket) -> None:  # a new relay (one restarted)
        task = loop.create_task(attach_one(sock))
        attaching.add(task)
        task.add_done_callback(attaching.discard)

    for sock in channels:
        await attach_one(sock)
    _take_channels(handoff, attach)
    # orders until the main process says every relay has ended ("finish"), or is gone itself (EOF: the relays cut
    # and end on their own); then every channel closes once its relay has stopped, and nothing more can come
    while line := await reader.readline():
        msg = orjson.loads(line)
        if "restarts" in msg:
            keeper.restarts = dict(msg["restarts"])
        if msg.get("do") == "reopen":
            keeper.reopen()
        if msg.get("do") == "finish":
            break
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(handoff.fileno())
    if attaching:
        await asyncio.gather(*attaching, return_exceptions=True)
    await asyncio.gather(*(s.closed for s in sides))
    await keeper.close()
    await session.close()
    sink = keeper.recorder.sink
    path = str(sink.path) if sink.path is not None else None
    await last_word(reader, writer, written=sink.written, dropped=sink.dropped, path=path, **keeper.final())
    return 0
