"""``specproxy proxy --workers N``: N relay processes on one port, one bookkeeper process, and a main process that
starts, stops and watches them.

- **Relays** (:func:`_relay_main`) each listen on the port with SO_REUSEPORT (the kernel spreads connections over
  them) and relay; their bookkeeping events go to the bookkeeper over a Unix socket pair each.
- **The bookkeeper** (:func:`_bookkeeper_main`) owns scrapes, attribution and records for the upstream engine: one
  per engine, so that the counter ledger sees every stream of it.
- **The main process** (:func:`supervise`) forks them before any event loop runs, relays SIGTERM/SIGINT as orders
  (first: stop and drain; second: cut), collects how each ended, and says how the whole stopped.

Children take orders only from the main process (a control socket pair each, one JSON line per message) and ignore
SIGINT and SIGTERM, which a terminal or a service manager may send to the whole group. When the main process dies,
however it dies, their control socket reads EOF: relays cut what is in flight (recorded with outcome ``shutdown``)
and exit; the bookkeeper writes every record once the relays have gone, and exits. No process outlives the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import uvloop

from specproxy.proxy.bookkeeper import Bookkeeper, Connection
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.names import BOOKKEEPER, RELAY_PREFIX
from specproxy.proxy.server import start_proxy, upstream_session
from specproxy.serving import Cut, stop_signals

log = logging.getLogger("specproxy.proxy")

MAX_DEFAULT_WORKERS = 8
READY_WITHIN_S = 60.0
UNLISTEN_WITHIN_S = 5.0


def default_workers() -> int:
    """One relay per core this process may run on, at most :data:`MAX_DEFAULT_WORKERS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


@dataclass(slots=True)
class Ended:
    """How the proxy stopped: what was cut and why, what was written, what was lost."""

    port: int = 0
    cut: int = 0
    cut_reason: str | None = None
    signum: int | None = None
    written: int = 0
    dropped: int = 0  # records the sink could not write
    record_path: str | None = None
    lost: int = 0  # requests relayed that the bookkeeping never got
    failure: str | None = None  # a child that ended badly, or could not start


# --- the children ------------------------------------------------------------------------------------------------


def _name_process(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and ``/proc/PID/stat`` show for this process (15 bytes at most, Linux)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(name[:15])


def _fork(
    name: str, main: Callable[[], Coroutine[Any, Any, int]], keep: list[socket.socket], owned: list[socket.socket]
) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _name_process(name)
        for s in owned:  # every other process's ends: EOF must reach their owners when those die
            if s not in keep:
                s.close()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = uvloop.run(main())
    except BaseException:
        log.exception("a proxy process failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


async def _control(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(sock=sock)


async def _say(writer: asyncio.StreamWriter, **msg: Any) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(orjson.dumps(msg) + b"\n")
        await writer.drain()


async def _relay_main(cfg: ProxyConfig, channel: socket.socket, control: socket.socket) -> int:
    reader, writer = await _control(control)
    try:
        handle = await start_proxy(cfg, channel, reuse_port=True)
    except OSError as e:
        await _say(writer, error=f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}")
        return 1
    await _say(writer, ready=os.getpid())
    cut = Cut()
    stop = asyncio.Event()

    async def orders() -> None:
        while line := await reader.readline():
            msg = orjson.loads(line)
            if msg.get("do") == "unlisten":  # every relay stops listening before any closes a connection
                for site in list(handle.runner.sites):
                    await site.stop()
                await _say(writer, unlistened=True)
                continue
            stop.set()
            if msg.get("do") == "cut":
                cut.now(msg["reason"], msg.get("signum"))
        stop.set()  # the main process is gone: so is this one, at once
        cut.now("the end of the main process")

    task = asyncio.get_running_loop().create_task(orders())
    await stop.wait()
    stopped = await handle.close(cut)
    task.cancel()
    await _say(writer, cut=stopped.cut, reason=stopped.cut_reason, signum=stopped.signum, lost=handle.link.lost)
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

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.lost("its relay process ended")
        if not self.closed.done():
            self.closed.set_result(None)


async def _bookkeeper_main(cfg: ProxyConfig, channels: list[socket.socket], control: socket.socket) -> int:
    reader, writer = await _control(control)
    loop = asyncio.get_running_loop()
    session = upstream_session(cfg)
    keeper = Bookkeeper.create(cfg, session)
    await _say(writer, ready=os.getpid())
    # scrapes (and what they may log) begin once the proxy has said where it listens; relays' events wait in their
    # channels meanwhile
    await reader.readline()
    await keeper.start()
    sides = []
    for sock in channels:
        _, side = await loop.create_unix_connection(lambda: _KeeperSide(keeper), sock=sock)
        sides.append(side)
    # every relay's channel closes when that relay has stopped (or died): then nothing more can come
    await asyncio.gather(*(s.closed for s in sides))
    await keeper.close()
    await session.close()
    sink = keeper.recorder.sink
    path = str(sink.path) if sink.path is not None else None
    await _say(writer, written=sink.written, dropped=sink.dropped, path=path)
    return 0


# --- the main process --------------------------------------------------------------------------------------------


def _reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT: port 0 becomes one port that every relay
    then binds too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class _Child:
    role: str
    pid: int
    control: socket.socket
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    said: dict[str, Any] | None = None  # its last message
    ended: bool = False
    unlistened: asyncio.Event = field(default_factory=asyncio.Event)


def start(cfg: ProxyConfig, workers: int) -> tuple[list[_Child], socket.socket]:
    """Fork the bookkeeper and ``workers`` relays (call before any event loop runs); also returns the socket that
    holds the port until the relays listen on it. Raises OSError when the port cannot be had."""
    reservation = _reserve_port(cfg.host, cfg.port)
    port = int(reservation.getsockname()[1])
    cfg = replace(cfg, port=port)
    channels = [socket.socketpair() for _ in range(workers)]
    controls = [socket.socketpair() for _ in range(workers + 1)]
    owned = [reservation, *(s for pair in channels + controls for s in pair)]
    keeper_ends = [b for _, b in channels]
    children = [
        _Child(
            "bookkeeper",
            _fork(
                BOOKKEEPER,
                lambda: _bookkeeper_main(cfg, keeper_ends, controls[0][1]),
                [*keeper_ends, controls[0][1]],
                owned,
            ),
            controls[0][0],
        )
    ]
    for i in range(workers):
        relay_end, control = channels[i][0], controls[i + 1][1]
        pid = _fork(f"{RELAY_PREFIX}{i}", lambda: _relay_main(cfg, relay_end, control), [relay_end, control], owned)  # noqa: B023
        children.append(_Child("relay", pid, controls[i + 1][0]))
    mine = {id(c.control) for c in children}
    for s in owned:
        if id(s) not in mine and s is not reservation:
            s.close()
    return children, reservation


async def supervise(
    children: list[_Child], reservation: socket.socket, drain_s: float, on_ready: Callable[[int], None]
) -> Ended:
    """Wait until every child is ready (``on_ready(port)``), then until SIGTERM/SIGINT; stop the relays in two steps,
    then the bookkeeper once they are gone; reap every child. Says how it went."""
    port = int(reservation.getsockname()[1])
    ended = Ended(port=port)
    relays = [c for c in children if c.role == "relay"]
    keeper = children[0]
    for c in children:
        c.reader, c.writer = await _control(c.control)
    try:
        ready = await asyncio.wait_for(asyncio.gather(*(_next(c) for c in children)), READY_WITHIN_S)
    except TimeoutError:
        ready = [None]
    reservation.close()
    if not all(m is not None and "ready" in m for m in ready):
        errors = [str(m["error"]) for m in ready if m is not None and "error" in m]
        ended.failure = errors[0] if errors else "a proxy process did not start"
        for c in children:
            _tell(c, do="cut", reason="a failed start")
        await _reap(children)
        return ended
    stop = asyncio.Event()
    cut = Cut()
    tasks: set[asyncio.Future[None]] = set()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if not stop.is_set():
            log.warning("%s: stopping; requests in flight get up to %g s to finish (a second signal cuts them)",
                        name, drain_s)  # fmt: skip
            stop.set()
            for c in relays:
                _tell(c, do="unlisten")
            tasks.add(asyncio.ensure_future(_stop_after_unlisten(relays)))
        elif not cut.event.is_set():
            log.warning("%s again: cutting the requests in flight; their records are written", name)
            cut.now(f"a second signal ({name})", signum)
            for c in relays:
                _tell(c, do="cut", reason=cut.reason, signum=signum)
        else:
            log.warning("%s: already stopping, writing the last records (SIGKILL ends the process now)", name)

    with stop_signals(on_signal):
        on_ready(port)
        _tell(keeper, do="go")
        watch = [asyncio.ensure_future(_watch(c, stop)) for c in children]
        relays_gone: asyncio.Future[list[None]] = asyncio.gather(*watch[1:])
        stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        await asyncio.wait([relays_gone, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():  # no relay left to serve: stop
            ended.failure = "every relay process ended"
            stop.set()
        stopping.cancel()
        await relays_gone  # every relay has stopped (or died): the bookkeeper's channels close
        await watch[0]
    await _reap(children)
    for c in relays:
        said = c.said or {}
        if "cut" not in said:
            ended.failure = ended.failure or "a relay process ended without saying how"
            continue
        ended.cut += int(said["cut"])
        ended.lost += int(said.get("lost", 0))
        if said.get("reason"):
            ended.cut_reason = said["reason"]
        if said.get("signum") is not None:
            ended.signum = int(said["signum"])
    said = keeper.said or {}
    if "written" in said:
        ended.written, ended.dropped, ended.record_path = int(said["written"]), int(said["dropped"]), said["path"]
    else:
        ended.failure = ended.failure or "the bookkeeping process ended early: the records in its care are lost"
    return ended


async def _next(c: _Child) -> dict[str, Any] | None:
    assert c.reader is not None
    with contextlib.suppress(ConnectionError):
        line = await c.reader.readline()
        if line:
            msg: dict[str, Any] = orjson.loads(line)
            if msg.get("unlistened"):
                c.unlistened.set()
            else:
                c.said = msg
            return msg
    c.ended = True
    return None


async def _watch(c: _Child, stop: asyncio.Event) -> None:
    """Read what ``c`` says until it ends; an end before the stop is a failure, said at once."""
    while not c.ended:
        await _next(c)
    if not stop.is_set():
        what = "relaying goes on without records (counted lost)" if c.role == "bookkeeper" else "others go on"
        log.error("the %s process %d ended on its own: %s", c.role, c.pid, what)


async def _stop_after_unlisten(relays: list[_Child]) -> None:
    """Stop in two steps once no relay listens any more: a client whose idle connection one relay closes must not
    find another relay still accepting."""

    async def unlistened(c: _Child) -> None:
        while not (c.unlistened.is_set() or c.ended):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.unlistened.wait(), 0.05)

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(unlistened(c) for c in relays)), UNLISTEN_WITHIN_S)
    for c in relays:
        _tell(c, do="stop")


def _tell(c: _Child, **msg: Any) -> None:
    if c.writer is not None and not c.ended:
        with contextlib.suppress(ConnectionError, RuntimeError):
            c.writer.write(orjson.dumps(msg) + b"\n")


async def _reap(children: list[_Child]) -> None:
    loop = asyncio.get_running_loop()
    for c in children:
        if c.writer is not None:
            c.writer.close()
        _, status = await loop.run_in_executor(None, os.waitpid, c.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            log.error("the %s process %d ended with status %d", c.role, c.pid, os.waitstatus_to_exitcode(status))
