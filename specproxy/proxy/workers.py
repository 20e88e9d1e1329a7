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
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
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
# A dead child is restarted after BACKOFF_FIRST_S, doubled for each death of its role within RESTART_WINDOW_S (at most
# BACKOFF_MAX_S); past RESTART_LIMIT such deaths the proxy stops, exit 1, with one line that says so.
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0


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
    lost: int = 0  # inference requests finished without a record written: finished - written
    lost_by: dict[str, int] = field(default_factory=dict)  # lost, by cause
    finished: int = 0  # inference requests relayed to their end (not passthrough: those are never recorded)
    failure: str | None = None  # a child that ended badly, or could not start
    restarts: dict[str, int] = field(default_factory=dict)  # children restarted, by role


# --- the children ------------------------------------------------------------------------------------------------


def _name_process(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and ``/proc/PID/stat`` show for this process (15 bytes at most, Linux)."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(name[:15])


def _close_sockets_but(keep: list[socket.socket], owned: list[socket.socket]) -> None:
    """Close every socket this new process inherited but ``keep``: the other processes' ends (EOF must reach their
    owners when those die), the main process's own (its event loop's, its ends of every control socket, however the
    loop duplicated them). Linux: every socket in /proc/self/fd; elsewhere the ``owned`` list."""
    mine = {s.fileno() for s in keep}
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        for s in owned:
            if s not in keep:
                s.close()
        return
    for fd in fds:
        if fd > 2 and fd not in mine:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    os.close(fd)


def _fork(
    name: str, main: Callable[[], Coroutine[Any, Any, int]], keep: list[socket.socket], owned: list[socket.socket]
) -> int:
    """Fork a proxy process running ``main`` on a loop of its own; before the main process's loop runs or from a
    callback of it (a restart): nothing of the parent's loop is used, its sockets are closed, its objects frozen
    (no collection in the child closes a descriptor number the child's own loop has reused)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        gc.freeze()
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)  # the parent's loop's: a signal here must not wake it
        _name_process(name)
        _close_sockets_but(keep, owned)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # group signals: orders come from the main process
            signal.signal(sig, signal.SIG_IGN)
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


async def _relay_main(cfg: ProxyConfig, channel: socket.socket, control: socket.socket, handoff: socket.socket) -> int:
    reader, writer = await _control(control)
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
    with contextlib.suppress(ValueError, OSError):
        loop.remove_reader(handoff.fileno())
    await _say(writer, cut=stopped.cut, reason=stopped.cut_reason, signum=stopped.signum, **link.final())
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


async def _bookkeeper_main(
    cfg: ProxyConfig, channels: list[socket.socket], control: socket.socket, handoff: socket.socket
) -> int:
    reader, writer = await _control(control)
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
    await _say(writer, written=sink.written, dropped=sink.dropped, path=path, **keeper.final())
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
    index: int  # the relay's number (0 for the bookkeeper)
    pid: int
    control: socket.socket
    handoff: socket.socket  # channels handed to it (SCM_RIGHTS)
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    said: dict[str, Any] | None = None  # its last message
    ended: bool = False
    reaped: bool = False
    unlistened: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # set when its control socket closed (it ended)


@dataclass(slots=True)
class Workers:
    """The processes of a proxy with ``--workers N``: the bookkeeper, the relays, and what starting more takes."""

    cfg: ProxyConfig  # its port fixed: the one every relay binds
    keeper: _Child
    relays: list[_Child]
    reservation: socket.socket  # holds the port until the relays listen on it


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def _spawn_keeper(cfg: ProxyConfig, channels: list[socket.socket], owned: list[socket.socket]) -> _Child:
    control, handoff = _pair(), _pair()
    keep = [*channels, control[1], handoff[1]]
    pid = _fork(BOOKKEEPER, lambda: _bookkeeper_main(cfg, channels, control[1], handoff[1]), keep, owned)
    control[1].close()
    handoff[1].close()
    return _Child("bookkeeper", 0, pid, control[0], handoff[0])


def _spawn_relay(cfg: ProxyConfig, i: int, channel: socket.socket, owned: list[socket.socket]) -> _Child:
    control, handoff = _pair(), _pair()
    keep = [channel, control[1], handoff[1]]
    pid = _fork(f"{RELAY_PREFIX}{i}", lambda: _relay_main(cfg, channel, control[1], handoff[1]), keep, owned)
    control[1].close()
    handoff[1].close()
    return _Child("relay", i, pid, control[0], handoff[0])


def start(cfg: ProxyConfig, workers: int) -> Workers:
    """Fork the bookkeeper and ``workers`` relays (call before any event loop runs). Raises OSError when the port
    cannot be had."""
    reservation = _reserve_port(cfg.host, cfg.port)
    cfg = replace(cfg, port=int(reservation.getsockname()[1]))
    channels = [_pair() for _ in range(workers)]
    owned = [reservation, *(s for pair in channels for s in pair)]
    keeper = _spawn_keeper(cfg, [b for _, b in channels], owned)
    relays = []
    for i, (relay_end, keeper_end) in enumerate(channels):
        keeper_end.close()
        relays.append(_spawn_relay(cfg, i, relay_end, [reservation, *(a for a, _ in channels), keeper.control]))
        relay_end.close()
    return Workers(cfg, keeper, relays, reservation)


def _hand(c: _Child, sock: socket.socket) -> bool:
    """Hand ``sock`` to ``c`` (its copy here is then closed); False when ``c`` cannot take it (it has ended)."""
    try:
        if c.ended:
            return False
        socket.send_fds(c.handoff, [b"c"], [sock.fileno()])
        return True
    except OSError:
        return False
    finally:
        sock.close()


class _Supervisor:
    """Restarts a dead child (after a backoff; past :data:`RESTART_LIMIT` deaths of one role within
    :data:`RESTART_WINDOW_S` the proxy stops instead) and reconnects the relays to a new bookkeeper."""

    def __init__(self, w: Workers, stop: Callable[[str], None]) -> None:
        self.w = w
        self.stopping = False
        self.stop = stop  # how to stop the proxy (as a first SIGTERM does), with the reason it gives up
        self.restarts = {"bookkeeper": 0, "relay": 0}
        self._deaths: dict[str, list[float]] = {"bookkeeper": [], "relay": []}
        self.tasks: set[asyncio.Future[Any]] = set()
        self.gone: list[_Child] = []  # children replaced: their last word, if any, still counts

    def children(self) -> list[_Child]:
        return [self.w.keeper, *self.w.relays]

    def watch(self, c: _Child) -> None:
        task = asyncio.ensure_future(self._watch(c))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _watch(self, c: _Child) -> None:
        """Read what ``c`` says until it ends; an end before the stop is a failure, said at once, and mended."""
        while not c.ended:
            await _next(c)
        if self.stopping:
            return
        status = await _reap_soon(c)
        how = _how(status)
        if c.role == "bookkeeper":
            log.error("the bookkeeper process %d ended (%s): relaying goes on; records of requests meanwhile are "
                      "counted lost", c.pid, how)  # fmt: skip
        else:
            log.error("the relay process %d ended (%s): its connections are lost, the other relays go on",
                      c.pid, how)  # fmt: skip
        now = time.monotonic()
        deaths = [t for t in self._deaths[c.role] if now - t < RESTART_WINDOW_S]
        deaths.append(now)
        self._deaths[c.role] = deaths
        if len(deaths) > RESTART_LIMIT:
            self.stop(f"the {c.role} process ended {len(deaths)} times within {RESTART_WINDOW_S:g} s: not restarted")
            return
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (len(deaths) - 1))
        await asyncio.sleep(delay)
        if self.stopping:
            return
        await self._restart(c)

    async def _restart(self, dead: _Child) -> None:
        w = self.w
        self.gone.append(dead)
        _close(dead)
        owned = [w.keeper.control, w.keeper.handoff, *(r.control for r in w.relays), *(r.handoff for r in w.relays)]
        if dead.role == "bookkeeper":
            live = [r for r in w.relays if not r.ended]
            pairs = [_pair() for _ in live]
            c = _spawn_keeper(w.cfg, [b for _, b in pairs], owned + [a for a, _ in pairs])
            for _, b in pairs:
                b.close()
            w.keeper = c
            for relay, (a, _) in zip(live, pairs, strict=True):
                _hand(relay, a)  # it sends its events to the new bookkeeper from now on
        else:
            a, b = _pair()
            c = _spawn_relay(w.cfg, dead.index, a, [*owned, b])
            a.close()
            w.relays[w.relays.index(dead)] = c
            _hand(w.keeper, b)  # the bookkeeper reads the new relay (when it is down, its successor gets one)
        self.restarts[c.role] += 1
        c.reader, c.writer = await _control(c.control)
        msg = await _next(c)
        if msg is None or "ready" not in msg:
            log.error("the restarted %s process did not start: %s", c.role, (msg or {}).get("error", "it ended"))
        else:
            log.warning("restarted the %s process: %d (restarts: %s)", c.role, c.pid, self.restarts)
            if c.role == "bookkeeper":
                _tell(c, do="go", restarts=self.restarts)
            elif self.stopping:  # the stop began while it started
                _tell(c, do="stop")
        for other in self.children():
            if other is not c or c.role == "relay":
                _tell(other, restarts=self.restarts)
        self.watch(c)


@contextlib.contextmanager
def _on_sighup(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> Iterator[None]:
    """SIGHUP reopens the record file (as nginx reopens its logs), so that logrotate works: it must not end the
    proxy, nor cut a stream."""
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGHUP, handler)
    try:
        yield
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGHUP)


def _how(status: int | None) -> str:
    if status is None:
        return "not reaped yet"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


async def _reap_soon(c: _Child, within_s: float = 5.0) -> int | None:
    """Reap a child whose control socket closed (it is ending): its status, or None if it lingers."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            pid, status = os.waitpid(c.pid, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG: never blocks)
        except ChildProcessError:
            c.reaped = True
            return None
        if pid:
            c.reaped = True
            return status
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.01)


def _close(c: _Child) -> None:
    if c.writer is not None:
        c.writer.close()
    c.handoff.close()


async def supervise(w: Workers, drain_s: float, on_ready: Callable[[int], None]) -> Ended:
    """Wait until every child is ready (``on_ready(port)``), then until SIGTERM/SIGINT, restarting a child that
    dies meanwhile; stop the relays in two steps, then the bookkeeper once they are gone; reap every child. Says
    how it went."""
    port = w.cfg.port
    ended = Ended(port=port)
    children = [w.keeper, *w.relays]
    for c in children:
        c.reader, c.writer = await _control(c.control)
    try:
        ready = await asyncio.wait_for(asyncio.gather(*(_next(c) for c in children)), READY_WITHIN_S)
    except TimeoutError:
        ready = [None]
    w.reservation.close()
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

    def begin_stop() -> None:
        sup.stopping = True
        stop.set()
        for c in sup.w.relays:
            _tell(c, do="unlisten")
        tasks.add(asyncio.ensure_future(_stop_after_unlisten(sup.w.relays)))

    def give_up(why: str) -> None:
        if not stop.is_set():
            log.error("%s: the proxy stops", why)
            ended.failure = why
            begin_stop()

    sup = _Supervisor(w, give_up)

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if not stop.is_set():
            log.warning("%s: stopping; requests in flight get up to %g s to finish (a second signal cuts them)",
                        name, drain_s)  # fmt: skip
            begin_stop()
        elif not cut.event.is_set():
            log.warning("%s again: cutting the requests in flight; their records are written", name)
            cut.now(f"a second signal ({name})", signum)
            for c in sup.w.relays:
                _tell(c, do="cut", reason=cut.reason, signum=signum)
        else:
            log.warning("%s: already stopping, writing the last records (SIGKILL ends the process now)", name)

    def on_hup() -> None:
        log.warning("SIGHUP: the record file is reopened: the next records go to a file by its name now (logrotate "
                    "may have moved the old one); nothing else changes")  # fmt: skip
        _tell(sup.w.keeper, do="reopen")

    loop = asyncio.get_running_loop()
    with stop_signals(on_signal), _on_sighup(loop, on_hup):
        on_ready(port)
        _tell(w.keeper, do="go", restarts=sup.restarts)
        for c in children:
            sup.watch(c)
        await stop.wait()
        # every relay stops (or has died); no restart from now on
        for r in sup.w.relays:
            await r.gone.wait()
        _tell(sup.w.keeper, do="finish")  # the bookkeeper's channels close as the relays have gone
        await sup.w.keeper.gone.wait()
        for t in list(sup.tasks):
            t.cancel()
    for c in sup.gone:
        if not c.reaped:
            await _reap([c])
    await _reap(sup.children())
    ended.restarts = dict(sup.restarts)
    said = sup.w.keeper.said or {}
    keeper_said = "written" in said
    if keeper_said:
        ended.dropped, ended.record_path = int(said["dropped"]), said["path"]
    else:
        ended.failure = ended.failure or "the bookkeeping process ended early: the records in its care are lost"
    per: dict[str, dict[str, int]] = said.get("per_relay", {})

    def lose(cause: str, n: int) -> None:
        if n > 0:
            ended.lost += n
            ended.lost_by[cause] = ended.lost_by.get(cause, 0) + n

    # every inference request a relay finished is, in the end, written or lost: what the relays were told, and
    # what the bookkeeper says of the records it wrote after they had gone
    doubtful: list[str] = []
    for c in sup.w.relays:
        said = c.said or {}
        if "cut" not in said:
            ended.failure = ended.failure or "a relay process ended without saying how"
            continue
        ended.cut += int(said["cut"])
        ended.finished += int(said.get("finished", 0))
        ended.written += int(said.get("written", 0))
        for cause, n in said.get("lost_by", {}).items():
            lose(cause, int(n))
        late = per.get(str(c.pid), {})
        ended.written += int(late.get("late_written", 0))
        lose("sink", int(late.get("late_dropped", 0)))
        if not keeper_said:
            lose("bookkeeper_died", int(said.get("pending", 0)))
        doubtful.extend(str(rid) for rid in said.get("doubtful", []))
        if said.get("reason"):
            ended.cut_reason = said["reason"]
        if said.get("signum") is not None:
            ended.signum = int(said["signum"])
    found = _written_after_all(ended.record_path, doubtful)
    if found:  # written by a bookkeeper just before it died: its acknowledgement died with it
        ended.written += found
        ended.lost -= found
        ended.lost_by["bookkeeper_died"] -= found
        if not ended.lost_by["bookkeeper_died"]:
            del ended.lost_by["bookkeeper_died"]
    for c in sup.gone:  # a relay that died: what the bookkeeper knows of it
        k = per.get(str(c.pid))
        if c.role != "relay" or k is None:
            continue
        ended.finished += int(k["begun"]) + int(k["lost"])
        ended.written += int(k["written"])
        lose("sink", int(k["dropped"]))
        lose("in_a_relay_that_died", int(k["lost"]))
    return ended


def _written_after_all(path: str | None, request_ids: list[str]) -> int:
    """How many of ``request_ids`` (counted lost with a bookkeeper that died) have a record in the record file
    (or the file it last rotated to) all the same: a death between a record's write and its acknowledgement."""
    if not request_ids or path is None:
        return 0
    wanted = {f'"request_id":"{rid}"'.encode() for rid in request_ids}
    found: set[bytes] = set()
    for name in (path + ".1", path):
        if not os.path.isfile(name):  # a device or a pipe (/dev/stdout): nothing to read back
            continue
        with contextlib.suppress(OSError), open(name, "rb") as f:
            for line in f:
                i = line.find(b'"request_id":"')
                if i >= 0 and (key := line[i : i + 31]) in wanted:
                    found.add(key)
    return len(found)


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
    c.gone.set()
    return None


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
        if c.reaped:
            continue
        try:
            _, status = await loop.run_in_executor(None, os.waitpid, c.pid, 0)
        except ChildProcessError:
            continue
        c.reaped = True
        if os.waitstatus_to_exitcode(status) != 0:
            log.error("the %s process %d ended with status %d", c.role, c.pid, os.waitstatus_to_exitcode(status))
