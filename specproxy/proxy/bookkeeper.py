"""The bookkeeper: all that the proxy does besides relaying, fed by the relays' events.

One per upstream engine, whatever the number of relays, so that the counter ledger sees every stream of its engine.
From each relay's events (:mod:`specproxy.proxy.events`) it rebuilds what the relay saw (request facts and body,
response head, each read with its arrival time, the outcome) and drives the :class:`~specproxy.recorder.recorder.
Recorder` with it: request-body parsing (bounded), workload rules, SSE and JSON interpretation, the ledger and its
fit, scrapes, records. It answers the proxy's own endpoints (``/specproxy/status``, ``/specproxy/metrics``) for
every relay, with the relays' own counters (shed, lost, in flight) added, and tells the relays whether records can
be written (``--fail-closed``). The features beside recording are addons (:mod:`specproxy.proxy.addons`): the
bookkeeper hands each the records and the inference requests, and adds their sections and metrics to its own.

One module: the relays' events in and what goes back to them (answers, acknowledgements, the watermark a settle
waits for) are one object's state per relay, read in one place.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy.core.inference import is_inference
from specproxy.core.otlp_proto import parse_traceparent
from specproxy.core.request_body import inspect_body
from specproxy.core.workload_rules import WorkloadResolver, last_user_message
from specproxy.proxy.addons import REGISTRY
from specproxy.proxy.addons.base import Addon
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.events import (
    ACK,
    BEGIN,
    CHUNK,
    FINISH,
    HEAD,
    HEALTH,
    QUERY,
    REFUSED,
    REPLY,
    STATS,
    FrameError,
    FrameReader,
    frame,
    reply_payload,
    split_begin,
)
from specproxy.proxy.link import TRACE_HEADER
from specproxy.recorder.recorder import Recorder
from specproxy.recorder.trace import RequestMeta, Trace

log = logging.getLogger("specproxy.bookkeeper")

SHED_FLAG = "bookkeeping_shed"
RETRIED_FLAG = "upstream_retried"  # sent again on a new connection after a reused one failed before any answer
HEALTH_CHECK_S = 0.25
CATCH_UP_MAX_S = 1.0  # the longest a scrape's settle waits for the relays' chunks of its interval
CATCH_UP_POLL_S = 0.005
STAMPED = frozenset({BEGIN, HEAD, CHUNK, FINISH, STATS})  # event kinds whose time is a relay's perf_counter_ns


class Connection:
    """One relay's events, as they arrive; ``send`` carries answers back to that relay."""

    def __init__(self, keeper: Bookkeeper, send: Callable[[bytes], None]) -> None:
        self.keeper = keeper
        self.send = send
        self.traces: dict[int, Trace] = {}
        self.stats: dict[str, Any] = {}
        self._reader = FrameReader()
        self.open = True
        # the latest relay stamp among its events so far: the relay appends events in the order it stamps them, so
        # every chunk it read before this time has arrived (its periodic STATS carry a stamp too, for idle streams)
        self.seen_ns = 0
        # its inference requests begun here, and what became of their records; "late": after its relay stopped
        # (it ended, or died) and could not hear of it any more, so the bookkeeper says it at its own end
        self.begun = 0
        self.written = 0
        self.dropped = 0
        self.late_written = 0
        self.late_dropped = 0

    def ack(self, seq: int, written: bool) -> None:
        """Tell the relay that a record of its is written (or dropped by the sink): it counts the loss exactly."""
        if written:
            self.written += 1
        else:
            self.dropped += 1
        if self.open:
            self.send(frame(ACK, seq, int(written)))
        elif written:
            self.late_written += 1
        else:
            self.late_dropped += 1

    def final(self) -> dict[str, int]:
        keys = ("begun", "written", "dropped", "late_written", "late_dropped")
        return {k: getattr(self, k) for k in keys} | {"lost": int(self.stats.get("lost_records", 0))}

    def received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except FrameError as e:
            log.error("a relay's events are garbled (%s): dropping its channel", e)
            self.lost("its events were garbled")
            return
        handle = self.keeper.handle
        for kind, seq, t, payload in frames:
            if kind in STAMPED and t > self.seen_ns:
                self.seen_ns = t
            try:
                handle(self, kind, seq, t, payload)
            except Exception:  # one bad event must not stop the others, nor lose a record silently
                log.exception("bookkeeping event %d of request %d failed", kind, seq)
                if kind == FINISH and seq in self.traces:
                    self.keeper.recorder.finish(self.traces.pop(seq), "proxy_error", "bookkeeping failed")

    def lost(self, why: str) -> None:
        """The relay is gone: requests it never finished are recorded as cut by its end."""
        if not self.open:
            return
        self.open = False
        for trace in self.traces.values():
            self.keeper.recorder.finish(trace, "proxy_error", f"relay ended mid-request: {why}")
        self.traces.clear()
        self.stats["in_flight"] = 0


class Bookkeeper:
    @classmethod
    def create(
        cls, cfg: ProxyConfig, session: aiohttp.ClientSession, addons: Sequence[type[Addon]] = REGISTRY
    ) -> Bookkeeper:
        """The bookkeeper of ``cfg``, its recorder on ``session``, with each of ``addons`` that ``cfg`` turns on:
        each hears the records and the inference requests, and adds its section to the status and its families to
        the metrics."""
        running: list[Addon] = []
        collectors = []
        for addon in addons:
            one = addon.create(cfg)
            if one is not None:
                running.append(one)
            collector = addon.collector(one)
            if collector is not None:
                collectors.append(collector)
        observers = tuple(a.observe for a in running)
        rcfg = replace(cfg.recorder, observers=(*cfg.recorder.observers, *observers))
        keeper = cls(cfg, Recorder(rcfg, session), running)
        texts = [a.response_text for a in running if type(a).response_text is not Addon.response_text]
        if texts:
            keeper.recorder.on_text = texts[0] if len(texts) == 1 else functools.partial(_each, texts)
        for collector in collectors:
            keeper.recorder.metrics.registry.register(collector)
        return keeper

    def __init__(self, cfg: ProxyConfig, recorder: Recorder, addons: Sequence[Addon] = ()) -> None:
        self.cfg = cfg
        self.recorder = recorder
        self.addons = tuple(addons)
        self.resolver = WorkloadResolver(cfg.rules)
        self.connections: list[Connection] = []
        self._health: asyncio.Task[None] | None = None
        self._healthy = True
        self.restarts: dict[str, int] = {}  # processes the supervisor restarted, by role (--workers N)
        recorder.metrics.registry.register(_RelayCollector(self))
        recorder.scraper.catch_up = self.caught_up
        self._owners: dict[str, tuple[Connection, int]] = {}  # request id -> its relay and number there
        # each record's relay hears when it is written or dropped; the moment records start failing, the relays hear
        # of it (--fail-closed); recovery is seen by the watch
        recorder.sink.follow = self._follow
        recorder.sink.add_error_listener(self._push_health)

    def _follow(self, rec: Any) -> Callable[[bool], None] | None:
        """A record put to the sink: the acknowledgement its relay is owed, if a relay sent its request."""
        owner = self._owners.pop(str(rec.get("request_id")), None)
        return None if owner is None else functools.partial(owner[0].ack, owner[1])

    def reopen(self) -> None:
        """SIGHUP: the record file is reopened. The sink opens it by name for every append, so the next records go
        to the file the name now points to (logrotate's rename then create, or none: created); said, for the log."""
        sink = self.recorder.sink
        if sink.path is not None:
            log.warning("record file reopened: the next records go to %s", sink.path)

    async def start(self) -> None:
        await self.recorder.start()
        for addon in self.addons:
            await addon.start(self.recorder)
        self._health = asyncio.get_running_loop().create_task(self._watch_health())

    async def caught_up(self, t_ns: int) -> bool:
        """Wait until every relay with a request in flight has sent its events stamped up to ``t_ns`` (so each chunk
        it read by then is in the ledger), for at most :data:`CATCH_UP_MAX_S`; whether it had to wait. On a busy
        host the relays' events can reach this process well after they were read; a scrape settled before they
        arrive finds fewer chunks than the engine counted steps and gives the rest of its delta to nobody."""
        loop = asyncio.get_running_loop()
        end = loop.time() + CATCH_UP_MAX_S
        waited = False
        while any(c.open and (c.traces or c.stats.get("in_flight")) and c.seen_ns < t_ns for c in self.connections):
            if loop.time() >= end:
                break
            waited = True
            await asyncio.sleep(CATCH_UP_POLL_S)
        return waited

    def connect(self, send: Callable[[bytes], None]) -> Connection:
        conn = Connection(self, send)
        self.connections.append(conn)
        return conn

    # -- events ------------------------------------------------------------------------------------------------------
    def handle(self, conn: Connection, kind: int, seq: int, t: int, payload: bytes) -> None:
        if kind == CHUNK:
            trace = conn.traces.get(seq)
            if trace is not None:
                trace.feed(t, payload)
        elif kind == BEGIN:
            conn.traces[seq] = trace = self._begin(t, payload)
            if not trace.passthrough:  # its record is acknowledged to the relay once written
                self._owners[trace.meta.request_id] = (conn, seq)
                conn.begun += 1
        elif kind == HEAD:
            trace = conn.traces.get(seq)
            if trace is not None:
                status, content_type, encoding = orjson.loads(payload)
                trace.response_started(status, content_type, encoding, t_ns=t)
        elif kind == FINISH:
            trace = conn.traces.pop(seq, None)
            if trace is not None:
                outcome, error, ov_ns, ov_max, ov_n, shed, retried = orjson.loads(payload)
                trace.overhead_ns, trace.overhead_max_ns, trace.overhead_count = ov_ns, ov_max, ov_n
                if shed and SHED_FLAG not in trace.flags:
                    trace.flags.append(SHED_FLAG)
                if retried:  # the relay sent it again after a reused connection failed (proxy/upstream.Pool.request)
                    trace.flags.append(RETRIED_FLAG)
                self.recorder.finish(trace, outcome, error, end_ns=t)
        elif kind == REFUSED:
            self.recorder.refused(t)
        elif kind == STATS:
            conn.stats = orjson.loads(payload)
        elif kind == QUERY:
            status, content_type, body = self.answer(payload.decode("utf-8", "replace"))
            conn.send(frame(REPLY, seq, status, reply_payload(content_type, body)))
        else:
            log.warning("unknown bookkeeping event kind %d", kind)

    def _begin(self, start_ns: int, payload: bytes) -> Trace:
        doc, body = split_begin(payload)
        size = int(doc["size"])
        if size > len(body):  # only its head came (over --capture-max-bytes, or shed): model and stream by pattern
            facts = replace(inspect_body(body, -1), size=size)
        else:
            facts = inspect_body(body, self.cfg.recorder.capture_max_bytes)
        parsed = facts.parsed
        resolver = self.resolver
        message = last_user_message(parsed if isinstance(parsed, dict) else None) if resolver.needs_message else None
        path = str(doc["p"])
        workload = resolver.resolve(doc["wh"], path, facts.model, doc["h"], message)
        meta = RequestMeta(
            method=str(doc["m"]),
            path=path,
            workload=workload,
            model=facts.model,
            body=parsed if parsed is not None else facts.text(body),
            body_bytes=facts.size if facts.over_limit else None,
            stream_requested=facts.stream,
            request_id=str(doc["rid"]),
            started_at=float(doc["at"]),
            start_ns=start_ns,
            trace_parent=tp if parse_traceparent(tp := doc["h"].get(TRACE_HEADER)) is not None else None,
        )
        keep_text = False
        if self.addons and is_inference(meta.method, meta.path):
            for addon in self.addons:
                keep_text = addon.request(meta) or keep_text
        trace = self.recorder.begin(meta, keep_text=keep_text)
        if doc.get("shed"):
            trace.flags.append(SHED_FLAG)
        return trace

    # -- what the proxy says about itself ----------------------------------------------------------------------------
    def answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/specproxy/status":
            return 200, "application/json", orjson.dumps(self.status())
        if path == "/specproxy/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.recorder.metrics.registry)
        return 404, "text/plain", b"not an own endpoint\n"

    def final(self) -> dict[str, Any]:
        """What the bookkeeper tells the main process as it ends: per relay (by pid) what became of the records of
        its requests, also those it could not be told of any more (it had stopped, or died)."""
        return {"per_relay": {str(c.stats["pid"]): c.final() for c in self.connections if "pid" in c.stats}}

    def relay_totals(self) -> dict[str, Any]:
        relays = [c.stats for c in self.connections if c.stats]
        live = [c.stats for c in self.connections if c.stats and c.open]
        shed: dict[str, int] = {}
        for s in relays:
            for kind, n in s.get("shed", {}).items():
                shed[kind] = shed.get(kind, 0) + int(n)
        over = sum(int(s.get("overhead_ns", 0)) for s in relays)
        count = sum(int(s.get("overhead_count", 0)) for s in relays)
        return {
            "pid": os.getpid(),
            "relays": len(self.connections),
            "relays_gone": sum(1 for c in self.connections if not c.open),
            "relay_pids": sorted(int(s["pid"]) for s in live if "pid" in s),  # the relays alive now
            "restarts": {"bookkeeper": 0, "relay": 0, **self.restarts},
            "relay_in_flight": sum(int(s.get("in_flight", 0)) for s in relays),
            # requests the relays' fast lane read, and connections it handed to aiohttp (proxy/frontdoor.py)
            "fast_lane_requests": sum(int(s.get("fast_lane", 0)) for s in relays),
            "handed_to_aiohttp": sum(int(s.get("handed", 0)) for s in relays),
            "shed": shed,
            "shed_requests": sum(int(s.get("shed_requests", 0)) for s in relays),
            "lost_records": sum(int(s.get("lost_records", 0)) for s in relays),
            "backlog_bytes": sum(int(s.get("backlog_bytes", 0)) for s in relays),
            "relay_overhead_mean_s": over / count / 1e9 if count else None,
            "per_relay": [{k: s.get(k) for k in ("pid", "requests", "in_flight", "lost_records")} for s in live],
        }

    def status(self) -> dict[str, Any]:
        st = self.recorder.status()
        st["bookkeeping"] = self.relay_totals()
        for addon in self.addons:
            section = addon.status()
            if section is not None:
                st[addon.name] = section
        return st

    def _push_health(self) -> None:
        """Tell the relays when records can no longer (or can again) be written (``--fail-closed`` reads it)."""
        healthy = self.recorder.sink.healthy
        if healthy != self._healthy:
            self._healthy = healthy
            for conn in self.connections:
                if conn.open:
                    conn.send(frame(HEALTH, 0, int(healthy)))

    async def _watch_health(self) -> None:
        while True:
            self._push_health()
            await asyncio.sleep(HEALTH_CHECK_S)

    async def close(self) -> None:
        """Every relay has stopped: record what they left unfinished, then finish and write every record."""
        if self._health is not None:
            self._health.cancel()
        for conn in self.connections:
            conn.lost("the proxy stopped")
        for addon in self.addons:  # what an addon has in flight is recorded before the sink closes
            await addon.stop()
        await self.recorder.close()
        for addon in self.addons:
            await addon.close()


def _each(listeners: Sequence[Callable[[str, str], None]], request_id: str, text: str) -> None:
    for listener in listeners:
        listener(request_id, text)


class _RelayCollector(Collector):
    """The relays' counters in the proxy's own /metrics."""

    def __init__(self, keeper: Bookkeeper) -> None:
        self.keeper = keeper

    def collect(self) -> Iterator[Metric]:
        t = self.keeper.relay_totals()
        shed = CounterMetricFamily(
            "specproxy_bookkeeping_shed",
            "Bookkeeping events the relays shed because the bookkeeping fell behind, by kind (chunk, body).",
            labels=["kind"],
        )
        for kind in ("chunk", "body"):
            shed.add_metric([kind], t["shed"].get(kind, 0))
        yield shed
        yield CounterMetricFamily(
            "specproxy_bookkeeping_shed_requests",
            "Requests whose record is flagged bookkeeping_shed.",
            value=t["shed_requests"],
        )
        yield CounterMetricFamily(
            "specproxy_records_lost",
            "Requests relayed without a record: the bookkeeping could not take them (gone, or far behind).",
            value=t["lost_records"],
        )
        yield GaugeMetricFamily(
            "specproxy_bookkeeping_backlog_bytes", "Events the relays hold for the bookkeeping.", t["backlog_bytes"]
        )
        live = t["relays"] - t["relays_gone"]
        yield GaugeMetricFamily("specproxy_relays", "Relay processes (or loops) feeding this bookkeeping.", live)
        restarts = CounterMetricFamily(
            "specproxy_process_restarts",
            "Proxy processes that died and were restarted by the main process, by role (bookkeeper, relay).",
            labels=["role"],
        )
        for role, n in sorted(t["restarts"].items()):
            restarts.add_metric([role], n)
        yield restarts
