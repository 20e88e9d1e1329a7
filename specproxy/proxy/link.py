"""The relay's side of the bookkeeping channel: what a relay does per request besides relaying, and nothing more.

Per request the relay appends a few frames (:mod:`specproxy.proxy.events`) to one buffer: BEGIN with the request's
facts and its body (whole up to ``--capture-max-bytes``, else only its head), HEAD, one CHUNK per upstream read (its
arrival time and its bytes), FINISH with the outcome. The buffer goes out once per event-loop iteration, as one
write. Interpreting any of it is the bookkeeper's work (:mod:`specproxy.proxy.bookkeeper`), in another process or,
for library use and tests, on the same loop through the same bytes (:meth:`EventLink.attach_local`).

Bounded, and the relay never waits: past ``soft_bytes`` of events not yet taken by the bookkeeper, chunk events
and large request bodies are shed (per request, from the first shed chunk on: a stream with a hole cannot be
interpreted), counted per kind, and the request's record is flagged ``bookkeeping_shed``. Past ``hard_bytes`` a new
request is not handed to the bookkeeping at all: counted as a lost record, which makes the proxy exit non-zero, as
records the sink cannot write do. The same when the bookkeeper is gone: relaying goes on, records are counted lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from specproxy.core.inference import is_inference
from specproxy.core.request_body import SCAN_BYTES, Body
from specproxy.proxy.events import (
    ACK,
    BEGIN,
    CHUNK,
    FINISH,
    HEAD,
    HEADER,
    HEALTH,
    QUERY,
    REFUSED,
    REPLY,
    STATS,
    FrameError,
    FrameReader,
    begin_payload,
    split_reply,
)

log = logging.getLogger("specproxy.proxy")

STATS_INTERVAL_S = 0.5
# Events to a bookkeeper process go out at most this often (and at once past FLUSH_BYTES): one write to its socket
# per loop iteration costs a relay much CPU at hundreds of streams, and wakes the bookkeeper as often. Times are the
# relay's own stamps, so the delay changes no figure; records come this much later.
FLUSH_EVERY_S = 0.005
FLUSH_BYTES = 256 * 1024
STATUS_PATH = "/specproxy/status"
# How long a relay waits for its bookkeeper's answer before answering with what it knows itself, marked partial.
# Status is read by probes (a Kubernetes httpGet probe gives up after 1 s by default) and people: a stalled
# bookkeeper must not make them wait. A scraper waits longer (Prometheus: up to its interval), and a partial scrape
# drops every bookkeeping series for that scrape, so the metrics wait more.
STATUS_WAIT_S = 0.5
QUERY_WAIT_S = 2.0  # every other own endpoint (/specproxy/metrics)
MAX_LATE_QUERIES = 64  # queries answered partially whose late answers are still awaited (a late status is kept)
GONE = 0  # a query's answer when the bookkeeper went away before it answered
MAX_DOUBTFUL = 100_000
TRACE_HEADER = "traceparent"  # W3C Trace Context: sent to the bookkeeper when spans are exported (--otlp-endpoint)


def header_names(rule_headers: Iterable[str], *, trace: bool) -> tuple[str, ...]:
    """The request headers a relay sends to its bookkeeper with each request: those the workload rules read, and
    with ``trace`` the client's ``traceparent`` (its span's parent). The relay forwards every one of them to the
    engine unchanged either way."""
    return tuple(sorted({h.lower() for h in rule_headers} | ({TRACE_HEADER} if trace else set())))


class Relayed:
    """One request as its relay follows it: a number, an id, and what is known without reading anything."""

    __slots__ = (
        "cause",
        "finished",
        "inference",
        "lost",
        "ov_max",
        "ov_n",
        "ov_ns",
        "request_id",
        "retried",
        "seq",
        "shed",
        "start_ns",
    )

    def __init__(self, seq: int, start_ns: int) -> None:
        self.seq = seq
        self.start_ns = start_ns
        self.request_id = uuid.uuid4().hex[:16]
        self.shed = False  # some of its bookkeeping was shed: its record is flagged
        self.lost = False  # not handed to the bookkeeping (or its bookkeeper died): no record, counted
        self.cause = ""  # why it is lost
        self.inference = True  # False: not inference (core.inference), never recorded, so never lost
        self.finished = False
        self.ov_ns = 0  # time the relay spent on bookkeeping for this request (appending its events)
        self.ov_max = 0
        self.ov_n = 0
        self.retried: str | None = None  # sent a second time upstream, and why


class _SocketSide(asyncio.Protocol):
    """The channel's socket, as the event loop drives it."""

    def __init__(self, link: EventLink) -> None:
        self.link = link
        self.transport: asyncio.WriteTransport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # above this many bytes not taken by the bookkeeper, the loop says so (pause_writing): chunks are then shed
        self.transport.set_write_buffer_limits(high=self.link.soft_bytes)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.link.received(data)

    def pause_writing(self) -> None:
        self.link.congested = True

    def resume_writing(self) -> None:
        self.link.congested = False

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.gone("the bookkeeping process closed the channel" if exc is None else f"channel broke: {exc}")
        if not self.closed.done():
            self.closed.set_result(None)


class EventLink:
    """A relay's channel to its bookkeeper, with the relay's own counters."""

    def __init__(self, *, soft_bytes: int, hard_bytes: int, capture_max_bytes: int, header_names: tuple[str, ...]):
        self.soft_bytes = soft_bytes
        self.hard_bytes = max(hard_bytes, soft_bytes)
        self.capture_max_bytes = capture_max_bytes
        self.header_names = header_names  # request headers the workload rules read
        self.congested = False
        self.alive = False  # attached and not gone
        self.healthy = True  # the bookkeeper can write records (its sink said so last)
        self.in_flight = 0
        self.requests = 0
        self.fast_lane = 0  # requests the fast lane read (proxy/frontdoor.py)
        self.handed = 0  # connections it handed to aiohttp's server
        self.shed = {"chunk": 0, "body": 0}
        self.shed_requests = 0
        self.lost = 0
        self.overhead_ns = 0
        self.overhead_count = 0
        self._buf = bytearray()
        self._scheduled: asyncio.Handle | None = None
        self._every_s = 0.0  # 0: flushed once per loop iteration (a bookkeeper on this loop)
        self._seq = 0
        # queries awaiting the bookkeeper's answer, with their paths; a late one stays (bounded) for its answer
        self._queries: dict[int, tuple[str, asyncio.Future[tuple[int, bytes]]]] = {}
        self._last_full: tuple[bytes, float] | None = None  # the last whole status the bookkeeper sent, and when
        self._reader = FrameReader()
        self._send: Callable[[bytes], None] | None = None
        self._buffered: Callable[[], int] = lambda: 0
        self._side: _SocketSide | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._last_stats: tuple[Any, ...] = ()
        self._closing = False
        self.attached = 0  # channels attached so far (more than one: a bookkeeper was restarted)
        self.restarts: dict[str, int] = {}  # the supervisor's count, by role
        # inference requests handed to the bookkeeper now attached whose records it has not acknowledged yet
        self._handed: dict[int, Relayed] = {}
        self.finished = 0  # inference requests finished: each one is, in the end, either written or lost
        self.written = 0  # records the bookkeeper acknowledged as written
        self.lost_by: dict[str, int] = {}  # lost records by cause
        self.pending = 0  # at the end: records handed over, not acknowledged before the channel closed
        self.doubtful: list[str] = []  # request ids counted lost with a dead bookkeeper that it may have written

    # -- attaching ---------------------------------------------------------------------------------------------------
    def attach_local(self, send: Callable[[bytes], None]) -> None:
        """A bookkeeper on this loop: each batch is handed to ``send`` (its reader) as the socket would carry it."""
        self._start(send, lambda: 0)

    async def attach_socket(self, sock: Any) -> None:
        """A channel to a bookkeeper process: the first, or one to a bookkeeper started after the last one died
        (requests it had not finished recording are lost with it, counted)."""
        if self._closing:
            sock.close()
            return
        old = self._side
        if old is not None and old.transport is not None:
            self.gone("a new bookkeeping process took over")
            old.transport.abort()
        loop = asyncio.get_running_loop()
        _, side = await loop.create_unix_connection(lambda: _SocketSide(self), sock=sock)
        self._side = side
        transport = side.transport
        assert transport is not None
        self._every_s = FLUSH_EVERY_S
        self._reader = FrameReader()
        self._buf.clear()
        self.congested = False
        self.healthy = True
        if self.attached:
            log.warning("bookkeeping back: a new bookkeeping process takes this relay's events")
        self._start(transport.write, transport.get_write_buffer_size)

    def _start(self, send: Callable[[bytes], None], buffered: Callable[[], int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._send, self._buffered = send, buffered
        self.alive = True
        self.attached += 1
        if self._ticker is not None:
            self._ticker.cancel()
        self._last_stats = ()  # a new bookkeeper hears this relay's figures at once, even an idle relay's
        self._tick()

    @property
    def backlog(self) -> int:
        """Bytes of events the bookkeeper has not taken yet (beyond what the kernel holds for it)."""
        return len(self._buf) + self._buffered()

    # -- per request (the hot path) ----------------------------------------------------------------------------------
    def begin(self, method: str, path: str, headers: Any, workload_header: str | None, whole: Body) -> Relayed:
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        r = Relayed(seq, time.perf_counter_ns())
        self.in_flight += 1
        self.requests += 1
        r.inference = is_inference(method, path)
        if not self.alive:
            r.lost, r.cause = True, "no_bookkeeper"
            return r
        backlog = self.backlog
        if backlog > self.hard_bytes:
            r.lost, r.cause = True, "backlog"
            return r
        size = whole.size
        doc: dict[str, Any] = {
            "rid": r.request_id,
            "m": method,
            "p": path,
            "wh": workload_header,
            "h": {n: v for n in self.header_names if (v := headers.get(n)) is not None},
            "at": time.time(),
            "size": size,
        }
        if size > self.capture_max_bytes:
            body = whole.head(SCAN_BYTES)  # the bookkeeper reads model and stream from its head, no more
        elif (backlog + size > self.soft_bytes or self.congested) and size > SCAN_BYTES:
            body = whole.head(SCAN_BYTES)
            doc["shed"] = True
            r.shed = True
            self.shed["body"] += 1
            self.shed_requests += 1
        else:
            body = whole.whole()  # at most --capture-max-bytes (1 MiB by default): a copy the loop can afford
        self._append(BEGIN, seq, r.start_ns, begin_payload(doc, body))
        if r.inference:
            self._handed[seq] = r
        return r

    def head(self, r: Relayed, status: int, content_type: str | None, content_encoding: str | None) -> None:
        if not r.lost:
            self._append(HEAD, r.seq, time.perf_counter_ns(), orjson.dumps([status, content_type, content_encoding]))

    def chunk(self, r: Relayed, t_ns: int, data: bytes) -> None:
        if r.shed or r.lost:
            if r.shed:
                self.shed["chunk"] += 1
            return
        buf = self._buf
        if self.congested or len(buf) > self.soft_bytes:
            r.shed = True
            self.shed["chunk"] += 1
            self.shed_requests += 1
            return
        buf += HEADER.pack(CHUNK, r.seq, t_ns, len(data))
        buf += data
        if self._scheduled is None:
            self._schedule()
        elif len(buf) > FLUSH_BYTES:
            self.flush()

    def finish(self, r: Relayed, outcome: str, error: str | None) -> None:
        end_ns = time.perf_counter_ns()
        self.in_flight -= 1
        self.overhead_ns += r.ov_ns
        self.overhead_count += r.ov_n
        r.finished = True
        if r.inference:
            self.finished += 1
        if r.lost or not self.alive:
            if r.inference:
                self._lose(r.cause or "bookkeeper_died")
            return
        doc = orjson.dumps([outcome, error, r.ov_ns, r.ov_max, r.ov_n, r.shed, r.retried])
        self._append(FINISH, r.seq, end_ns, doc)

    def refused(self, status: int) -> None:
        if self.alive:
            self._append(REFUSED, 0, status)

    # -- the own endpoints -------------------------------------------------------------------------------------------
    async def query(self, path: str) -> tuple[int, str, bytes]:
        """Ask the bookkeeper for an own endpoint's answer: (status, content type, body). A bookkeeper that is gone
        (restarting) or stalled does not make the endpoint wait: within :data:`STATUS_WAIT_S` (status) or
        :data:`QUERY_WAIT_S` the answer is what this relay knows itself, marked partial."""
        if not self.alive:
            return self.partial(path, "the bookkeeping process is gone (being restarted)", 0.0)
        self._seq = qid = (self._seq + 1) & 0xFFFFFFFF
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self._queries[qid] = (path, fut)
        self._stats(force=True)  # this relay's counters as of now come first
        self._append(QUERY, qid, 0, path.encode())
        self.flush()  # an answer is awaited: no batching delay
        wait_s = STATUS_WAIT_S if path == STATUS_PATH else QUERY_WAIT_S
        t0 = loop.time()
        late = False
        try:
            # shielded: on time out the query stays, so that a late status still becomes the last one known
            status, payload = await asyncio.wait_for(asyncio.shield(fut), wait_s)
        except TimeoutError:
            late = True
            if len(self._queries) > MAX_LATE_QUERIES:
                self._queries.pop(next(iter(self._queries)))
            return self.partial(path, f"the bookkeeping process did not answer within {wait_s:g} s", wait_s)
        finally:
            if not late:
                self._queries.pop(qid, None)
        if status == GONE:
            return self.partial(path, "the bookkeeping process is gone (being restarted)", loop.time() - t0)
        content_type, body = split_reply(payload)
        return status, content_type, body

    def partial(self, path: str, why: str, waited_s: float) -> tuple[int, str, bytes]:
        """What this relay knows without the bookkeeper (its own counters), marked ``partial``: the records, the
        engine and the other relays are the bookkeeper's. Status adds the last whole status this relay got, with
        its age."""
        s = self.stats()
        s["lost_by"] = dict(self.lost_by)
        s["restarts"] = restarts = {"bookkeeper": 0, "relay": 0, **self.restarts}
        if path == "/specproxy/metrics":
            lines = [
                "# HELP specproxy_status_partial 1: only this relay's own counters; the bookkeeping did not answer.",
                "# TYPE specproxy_status_partial gauge",
                "specproxy_status_partial 1.0",
                "# TYPE specproxy_bookkeeping_shed_total counter",
                *(f'specproxy_bookkeeping_shed_total{{kind="{k}"}} {float(v)}' for k, v in sorted(s["shed"].items())),
                "# TYPE specproxy_records_lost_total counter",
                f"specproxy_records_lost_total {float(self.lost)}",
                "# TYPE specproxy_bookkeeping_backlog_bytes gauge",
                f"specproxy_bookkeeping_backlog_bytes {float(s['backlog_bytes'])}",
                "# TYPE specproxy_process_restarts_total counter",
                *(f'specproxy_process_restarts_total{{role="{k}"}} {float(v)}' for k, v in sorted(restarts.items())),
            ]
            return 200, "text/plain; version=0.0.4; charset=utf-8", ("\n".join(lines) + "\n").encode()
        if path != STATUS_PATH:
            return 503, "text/plain", f"{why}\n".encode()
        last = self._last_full
        age = None if last is None else round(time.monotonic() - last[1], 3)
        doc = {
            "partial": True,
            "why": why,
            "bookkeeper": {"answered": False, "waited_s": round(waited_s, 3), "last_full_age_s": age},
            "bookkeeping": s | {"relay_pids": [s["pid"]]},
            "last_full": None if last is None else orjson.loads(last[0]),
        }
        return 200, "application/json", orjson.dumps(doc)

    def _lose(self, cause: str) -> None:
        self.lost += 1
        self.lost_by[cause] = self.lost_by.get(cause, 0) + 1

    def _forget_handed(self, cause: str) -> None:
        """The bookkeeper is gone: what it held of its requests (in flight, or finished and not yet written) died
        with it. Finished ones are counted lost now, the others when they finish."""
        for r in self._handed.values():
            if r.finished:
                self._lose(cause)
                if cause == "bookkeeper_died" and len(self.doubtful) < MAX_DOUBTFUL:
                    # it may have been written in the moment before the death, its acknowledgement lost with it:
                    # the main process looks for it in the record file at the end
                    self.doubtful.append(r.request_id)
            else:
                r.lost, r.cause = True, cause
        self._handed.clear()

    def final(self) -> dict[str, Any]:
        """What this relay tells the main process as it ends: every inference request it finished is either
        written (acknowledged) or lost, by cause."""
        return {
            "lost": self.lost,
            "lost_by": dict(self.lost_by),
            "finished": self.finished,
            "written": self.written,
            "pending": self.pending,
            "doubtful": self.doubtful,
        }

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "in_flight": self.in_flight,
            "requests": self.requests,
            "fast_lane": self.fast_lane,
            "handed": self.handed,
            "shed": dict(self.shed),
            "shed_requests": self.shed_requests,
            "lost_records": self.lost,
            "backlog_bytes": self.backlog,
            "overhead_ns": self.overhead_ns,
            "overhead_count": self.overhead_count,
        }

    # -- the channel -------------------------------------------------------------------------------------------------
    def _append(self, kind: int, seq: int, t: int, payload: bytes = b"") -> None:
        buf = self._buf
        buf += HEADER.pack(kind, seq, t, len(payload))
        buf += payload
        if self._scheduled is None:
            self._schedule()

    def _schedule(self) -> None:
        if self._loop is not None and self.alive:
            if self._every_s:
                self._scheduled = self._loop.call_later(self._every_s, self.flush)
            else:
                self._scheduled = self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Hand what is buffered to the channel: one write (at most every :data:`FLUSH_EVERY_S` to a process)."""
        if self._scheduled is not None:
            self._scheduled.cancel()  # when flushed before its time: no second, empty flush
            self._scheduled = None
        if not self._buf or self._send is None or not self.alive:
            self._buf.clear()
            return
        data = bytes(self._buf)
        self._buf.clear()
        try:
            self._send(data)
        except Exception as e:  # the channel's failure is not the stream's
            log.exception("handing events to the bookkeeping failed")
            self.gone(f"{type(e).__name__}: {e}")

    def received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as e:
            self.gone(str(e))
            return
        for kind, seq, t, payload in frames:
            if kind == HEALTH:
                self.healthy = bool(t)
            elif kind == ACK:
                r = self._handed.pop(seq, None)
                if r is not None:
                    if t:
                        self.written += 1
                    else:
                        self._lose("sink")
                        r.lost = True
            elif kind == REPLY:
                query = self._queries.pop(seq, None)
                if query is None:
                    continue
                path, fut = query
                if path == STATUS_PATH and t == 200:
                    self._last_full = (split_reply(payload)[1], time.monotonic())
                if not fut.done():
                    fut.set_result((t, payload))

    def gone(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        self.healthy = False
        if self._closing:
            return
        self._forget_handed("bookkeeper_died")
        log.error("bookkeeping lost (%s): relaying goes on, records are counted lost", why)
        for _, fut in self._queries.values():
            if not fut.done():
                fut.set_result((GONE, b""))
        self._queries.clear()

    def _stats(self, *, force: bool = False) -> None:
        s = self.stats()
        key = (s["in_flight"], s["requests"], s["shed_requests"], s["lost_records"], self.shed["chunk"])
        if force or key != self._last_stats:
            self._last_stats = key
            self._append(STATS, 0, time.perf_counter_ns(), orjson.dumps(s))  # the stamp: a watermark

    def _tick(self) -> None:
        if not self.alive or self._loop is None:
            return
        self._stats()
        self._ticker = self._loop.call_later(STATS_INTERVAL_S, self._tick)

    async def close(self, within_s: float = 30.0) -> None:
        """Send what is left (the last records' events) and close the channel; a bookkeeper that does not take them
        within ``within_s`` loses them (counted)."""
        if self._ticker is not None:
            self._ticker.cancel()
        self._closing = True
        if self.alive:
            self._stats(force=True)
        self.flush()
        side = self._side
        if side is None or side.transport is None:
            self.alive = False
            return
        # the end of the events, after what is buffered; acknowledgements still come until the bookkeeper closes
        if self.alive and side.transport.can_write_eof():
            side.transport.write_eof()
        else:
            side.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(side.closed), within_s)
        except TimeoutError:
            log.error("the bookkeeping process did not take the last events within %g s: records lost", within_s)
            self._forget_handed("unacknowledged")
            side.transport.abort()
        # records not acknowledged yet: the bookkeeper writes them after this relay has gone, and says so itself
        self.pending = sum(1 for r in self._handed.values() if r.finished)
        self.alive = False
