"""``specproxy proxy --workers N``: N relay processes on one port, one bookkeeper process, and a main process that
starts, stops and watches them.

This module forks them (:func:`start`, :func:`spawn_relay`, :func:`spawn_keeper`); what runs inside each child is
:mod:`specproxy.proxy.children`, and what the main process does while they run is :mod:`specproxy.proxy.supervisor`.

- **Relays** (:func:`~specproxy.proxy.children.relay_main`) each listen on the port with SO_REUSEPORT (the
  kernel spreads connections over them) and relay; their bookkeeping events go to the bookkeeper over a Unix
  socket pair each.
- **The bookkeeper** (:func:`~specproxy.proxy.children.bookkeeper_main`) owns scrapes, attribution and records
  for the upstream engine: one per engine, so that the counter ledger sees every stream of it.
- **The main process** (:func:`~specproxy.proxy.supervisor.supervise`) forks them before any event loop runs, relays
  SIGTERM/SIGINT as orders (first: stop and drain; second: cut), restarts one that dies, collects how each ended,
  and says how the whole stopped.

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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import uvloop

from specproxy.proxy.children import bookkeeper_main, name_process, relay_main
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.memtrace import traced
from specproxy.proxy.names import BOOKKEEPER, RELAY_PREFIX

log = logging.getLogger("specproxy.proxy")

MAX_DEFAULT_WORKERS = 8
READY_WITHIN_S = 60.0


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
        name_process(name)
        _close_sockets_but(keep, owned)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # group signals: orders come from the main process
            signal.signal(sig, signal.SIG_IGN)
        code = uvloop.run(traced(main(), name))
    except BaseException:
        log.exception("a proxy process failed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


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
class Child:
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
    keeper: Child
    relays: list[Child]
    reservation: socket.socket  # holds the port until the relays listen on it


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def spawn_keeper(cfg: ProxyConfig, channels: list[socket.socket], owned: list[socket.socket]) -> Child:
    control, handoff = pair(), pair()
    keep = [*channels, control[1], handoff[1]]
    pid = _fork(BOOKKEEPER, lambda: bookkeeper_main(cfg, channels, control[1], handoff[1]), keep, owned)
    control[1].close()
    handoff[1].close()
    return Child("bookkeeper", 0, pid, control[0], handoff[0])


def spawn_relay(cfg: ProxyConfig, i: int, channel: socket.socket, owned: list[socket.socket]) -> Child:
    control, handoff = pair(), pair()
    keep = [channel, control[1], handoff[1]]
    pid = _fork(f"{RELAY_PREFIX}{i}", lambda: relay_main(cfg, channel, control[1], handoff[1]), keep, owned)
    control[1].close()
    handoff[1].close()
    return Child("relay", i, pid, control[0], handoff[0])


def start(cfg: ProxyConfig, workers: int) -> Workers:
    """Fork the bookkeeper and ``workers`` relays (call before any event loop runs). Raises OSError when the port
    cannot be had."""
    reservation = _reserve_port(cfg.host, cfg.port)
    cfg = replace(cfg, port=int(reservation.getsockname()[1]))
    channels = [pair() for _ in range(workers)]
    owned = [reservation, *(s for pair in channels for s in pair)]
    keeper = spawn_keeper(cfg, [b for _, b in channels], owned)
    relays = []
    for i, (relay_end, keeper_end) in enumerate(channels):
        keeper_end.close()
        relays.append(spawn_relay(cfg, i, relay_end, [reservation, *(a for a, _ in channels), keeper.control]))
        relay_end.close()
    return Workers(cfg, keeper, relays, reservation)


def hand(c: Child, sock: socket.socket) -> bool:
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
