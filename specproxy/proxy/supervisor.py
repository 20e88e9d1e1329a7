"""The main process of ``specproxy proxy --workers N`` once its children run: it relays SIGTERM/SIGINT as orders
(first: stop and drain; second: cut), restarts a child that died (a backoff per role, a limit after which the proxy
stops), hands the survivors new channels to it, and says how the whole stopped and what was lost, by cause."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from specproxy.proxy.children import open_control
from specproxy.proxy.workers import READY_WITHIN_S, Child, Ended, Workers, hand, pair, spawn_keeper, spawn_relay
from specproxy.serving import Cut, stop_signals

log = logging.getLogger("specproxy.proxy")

UNLISTEN_WITHIN_S = 5.0


# A dead child is restarted after BACKOFF_FIRST_S, doubled for each death of its role within RESTART_WINDOW_S (at most
# BACKOFF_MAX_S); past RESTART_LIMIT such deaths the proxy stops, exit 1, with one line that says so.
BACKOFF_FIRST_S = 0.1


BACKOFF_MAX_S = 5.0


RESTART_LIMIT = 5


RESTART_WINDOW_S = 60.0


def recent_deaths(deaths: list[float], now: float) -> list[float]:
    """A role's deaths (monotonic times) within :data:`RESTART_WINDOW_S` of ``now``, with the one at ``now``."""
    return [*(t for t in deaths if now - t < RESTART_WINDOW_S), now]


def restart_delay(deaths: int) -> float | None:
    """Seconds to wait before restarting a child whose role died ``deaths`` times within the window (this death
    included); None past :data:`RESTART_LIMIT`: not restarted, the proxy stops."""
    if deaths > RESTART_LIMIT:
        return None
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** (deaths - 1))


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
        self.gone: list[Child] = []  # children replaced: their last word, if any, still counts

    def children(self) -> list[Child]:
        return [self.w.keeper, *self.w.relays]

    def watch(self, c: Child) -> None:
        task = asyncio.ensure_future(self._watch(c))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _watch(self, c: Child) -> None:
        """Read what ``c`` says until it ends; an end before the stop is a failure, said at once, and mended."""
        while not c.ended:
            await _next(c)
        if self.stopping:
            return
        status = await _reap_soon(c)
        how = _how(status)
        if c.role == "bookkeeper":
            log.error(
                "the bookkeeper process %d ended (%s): relaying goes on; records of requests meanwhile are "
                "counted lost",
                c.pid,
                how,
            )
        else:
            log.error("the relay process %d ended (%s): its connections are lost, the other relays go on", c.pid, how)
        self._deaths[c.role] = deaths = recent_deaths(self._deaths[c.role], time.monotonic())
        delay = restart_delay(len(deaths))
        if delay is None:
            self.stop(f"the {c.role} process ended {len(deaths)} times within {RESTART_WINDOW_S:g} s: not restarted")
            return
        await asyncio.sleep(delay)
        if self.stopping:
            return
        await self._restart(c)

    async def _restart(self, dead: Child) -> None:
        w = self.w
        self.gone.append(dead)
        _close(dead)
        owned = [w.keeper.control, w.keeper.handoff, *(r.control for r in w.relays), *(r.handoff for r in w.relays)]
        if dead.role == "bookkeeper":
            live = [r for r in w.relays if not r.ended]
            pairs = [pair() for _ in live]
            c = spawn_keeper(w.cfg, [b for _, b in pairs], owned + [a for a, _ in pairs])
            for _, b in pairs:
                b.close()
            w.keeper = c
            for relay, (a, _) in zip(live, pairs, strict=True):
                hand(relay, a)  # it sends its events to the new bookkeeper from now on
        else:
            a, b = pair()
            c = spawn_relay(w.cfg, dead.index, a, [*owned, b])
            a.close()
            w.relays[w.relays.index(dead)] = c
            hand(w.keeper, b)  # the bookkeeper reads the new relay (when it is down, its successor gets one)
        self.restarts[c.role] += 1
        c.reader, c.writer = await open_control(c.control)
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


async def _reap_soon(c: Child, within_s: float = 5.0) -> int | None:
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


def _close(c: Child) -> None:
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
        c.reader, c.writer = await open_control(c.control)
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
            log.warning(
                "%s: stopping; requests in flight get up to %g s to finish (a second signal cuts them)", name, drain_s
            )
            begin_stop()
        elif not cut.event.is_set():
            log.warning("%s again: cutting the requests in flight; their records are written", name)
            cut.now(f"a second signal ({name})", signum)
            for c in sup.w.relays:
                _tell(c, do="cut", reason=cut.reason, signum=signum)
        else:
            log.warning("%s: already stopping, writing the last records (SIGKILL ends the process now)", name)

    def on_hup() -> None:
        log.warning(
            "SIGHUP: the record file is reopened: the next records go to a file by its name now (logrotate "
            "may have moved the old one); nothing else changes"
        )
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


async def _next(c: Child) -> dict[str, Any] | None:
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


async def _stop_after_unlisten(relays: list[Child]) -> None:
    """Stop in two steps once no relay listens any more: a client whose idle connection one relay closes must not
    find another relay still accepting."""

    async def unlistened(c: Child) -> None:
        while not (c.unlistened.is_set() or c.ended):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.unlistened.wait(), 0.05)

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(unlistened(c) for c in relays)), UNLISTEN_WITHIN_S)
    for c in relays:
        _tell(c, do="stop")


def _tell(c: Child, **msg: Any) -> None:
    if c.writer is not None and not c.ended:
        with contextlib.suppress(ConnectionError, RuntimeError):
            c.writer.write(orjson.dumps(msg) + b"\n")


async def _reap(children: list[Child]) -> None:
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
