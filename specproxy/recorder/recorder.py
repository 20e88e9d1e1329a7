"""The recorder: one per proxy process or load-generator run. It follows each request's response, shares the engine's
counter deltas among overlapping requests, picks the best acceptance figure per request and writes one record each.

Hot path (per upstream read): :meth:`Trace.feed`, an SSE scan and one small JSON parse per event. Everything else
(waiting for the closing scrape, building the record, own metrics) runs in a finalisation task off the relay path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.core.attribution import (
    SpecEstimate,
    from_chunks,
    from_llama_timings,
    from_server,
    tokens_per_step_histogram,
)
from specproxy.core.ledger import CounterLedger
from specproxy.core.record import SCHEMA_VERSION, Record, redact
from specproxy.core.stats import step_and_token_gaps
from specproxy.core.timeline import ResponseTimeline, TimelineResult
from specproxy.core.tokens import EXACT_SOURCES, Tokenizer
from specproxy.recorder.metrics import OwnMetrics
from specproxy.recorder.scraper import Scraper
from specproxy.recorder.sink import RecordSink

log = logging.getLogger("specproxy.recorder")

ZERO_ACCEPTANCE_MIN_DRAFT_TOKENS = 100


@dataclass(frozen=True, slots=True)
class RecorderConfig:
    record_path: str | None = None
    metrics_url: str | None = None
    label: str | None = None
    capture: str = "request"  # none | request | full
    k: int | None = None  # num_speculative_tokens, when known; else learned from the counters
    scrape_interval_s: float = 0.25
    scrape_timeout_s: float = 2.0
    scrape_min_gap_s: float = 0.1  # the floor between two scrapes, however many requests end
    finalize_wait_s: float = 5.0  # how long a finished request waits for its closing scrape
    # Without exact token counts, overlapping requests share counter deltas through a per-workload acceptance
    # model that improves with every scrape interval: their records wait for it to settle up to this long.
    calibration_hold_s: float = 60.0
    rotate_bytes: int = 256 * 1024 * 1024
    run_id: str | None = None


@dataclass(slots=True)
class RequestMeta:
    method: str
    path: str
    workload: str
    model: str | None = None
    body: Any = None  # the parsed JSON body, kept only per --capture
    stream_requested: bool = False
    replay_of: str | None = None
    repeat: int | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    started_at: float = field(default_factory=time.time)
    start_ns: int = field(default_factory=time.perf_counter_ns)


class Trace:
    """One request's side of the recorder."""

    __slots__ = (
        "_decode_steps_seen",
        "_recorder",
        "headers_ns",
        "meta",
        "overhead_count",
        "overhead_max_ns",
        "overhead_ns",
        "status",
        "timeline",
    )

    def __init__(self, recorder: Recorder, meta: RequestMeta) -> None:
        self._recorder = recorder
        self.meta = meta
        self.status: int | None = None
        self.headers_ns: int | None = None
        self.timeline: ResponseTimeline | None = None
        self._decode_steps_seen = 0
        self.overhead_ns = 0
        self.overhead_max_ns = 0
        self.overhead_count = 0

    def response_started(self, status: int, content_type: str | None, content_encoding: str | None = None) -> None:
        self.status = status
        self.headers_ns = time.perf_counter_ns()
        stream = bool(content_type and content_type.split(";", 1)[0].strip().lower() == "text/event-stream")
        self.timeline = ResponseTimeline(
            self.meta.start_ns,
            stream=stream,
            tokenizer=self._recorder.tokenizer,
            keep_text=self._recorder.config.capture == "full",
            content_encoding=content_encoding,
        )

    def feed(self, t_ns: int, data: bytes) -> None:
        tl = self.timeline
        if tl is None:
            return
        before = len(tl.chunks)
        tl.feed(t_ns, data)
        chunks = tl.chunks
        if len(chunks) != before and self._recorder.scraper.enabled:
            ledger = self._recorder.ledger
            rid = self.meta.request_id
            exact = tl.exact_counts
            for _, n in chunks[before:]:
                if n <= 0:
                    continue
                self._decode_steps_seen += 1
                # the first token-bearing chunk is the prefill step: tokens, but no speculative step
                ledger.tokens(rid, n, t_ns, exact=exact, decode=self._decode_steps_seen > 1)

    def add_overhead(self, ns: int) -> None:
        self.overhead_ns += ns
        self.overhead_count += 1
        if ns > self.overhead_max_ns:
            self.overhead_max_ns = ns


class Recorder:
    def __init__(
        self, config: RecorderConfig, session: aiohttp.ClientSession, *, tokenizer: Tokenizer | None = None
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.metrics = OwnMetrics()
        self.ledger = CounterLedger()
        self.run_id = config.run_id or uuid.uuid4().hex[:12]
        self.sink = RecordSink(
            Path(config.record_path) if config.record_path else None,
            rotate_bytes=config.rotate_bytes,
            on_written=self.metrics.records_written.inc,
            on_dropped=self.metrics.records_dropped.inc,
            on_error=self.metrics.sink_errors.inc,
        )
        self.scraper = Scraper(
            session,
            config.metrics_url,
            self.ledger,
            interval_s=config.scrape_interval_s,
            timeout_s=config.scrape_timeout_s,
            min_gap_s=config.scrape_min_gap_s,
            on_error=self.metrics.scrape_errors.inc,
            on_settle=self._check_calibration,
        )
        self._calibrated = asyncio.Event()
        self._finalizers: set[asyncio.Task[None]] = set()
        self.in_flight = 0
        self.workload_spec: dict[str, dict[str, float]] = {}
        self.workload_requests: dict[str, dict[str, int]] = {}

    async def start(self) -> None:
        await self.sink.start()
        await self.scraper.start()

    def begin(self, meta: RequestMeta) -> Trace:
        self.in_flight += 1
        self.metrics.in_flight.inc()
        self.ledger.begin(meta.request_id, meta.workload)
        self.scraper.kick()
        return Trace(self, meta)

    def finish(self, trace: Trace, outcome: str, error: str | None = None) -> None:
        """Never raises and never blocks: the record is completed in a task after the closing scrape."""
        end_ns = time.perf_counter_ns()
        self.in_flight -= 1
        self.metrics.in_flight.dec()
        tl = trace.timeline
        self.ledger.end(trace.meta.request_id, truncated=tl is not None and tl.finish_reason == "length")
        task = asyncio.get_running_loop().create_task(self._finalize(trace, outcome, error, end_ns))
        self._finalizers.add(task)
        task.add_done_callback(self._finalizers.discard)

    async def _finalize(self, trace: Trace, outcome: str, error: str | None, end_ns: int) -> None:
        rid = trace.meta.request_id
        try:
            if self.scraper.enabled and trace._decode_steps_seen > 1:
                # wait for the scrapes that cover every chunk of this request (a delta whose chunks were still
                # on their way is settled by the next scrape)
                deadline = time.monotonic() + self.config.finalize_wait_s
                while (left := deadline - time.monotonic()) > 0:
                    fut = self.scraper.request()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(fut), left)
                    if not fut.done() or not fut.result() or not self.ledger.pending_for(rid):
                        break
            if self.ledger.needs_model(rid) and not self._calibrated.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._calibrated.wait(), self.config.calibration_hold_s)
            counters = self.ledger.pop(rid)
            rec = self.build_record(trace, outcome, error, end_ns, counters)
        except Exception as e:  # bookkeeping must never lose the record: write what is known
            log.exception("building the record of %s failed", rid)
            self.ledger.pop(rid)
            rec = self._minimal_record(trace, "proxy_error" if outcome == "ok" else outcome, f"{error or ''} {e}")
        self.sink.put(rec)
        try:
            self._observe(rec)
        except Exception:
            log.exception("updating metrics for %s failed", rid)

    def build_record(self, trace: Trace, outcome: str, error: str | None, end_ns: int, counters: Any) -> Record:
        meta = trace.meta
        tl: TimelineResult | None = trace.timeline.result(end_ns) if trace.timeline is not None else None
        flags: list[str] = list(tl.flags) if tl else []
        if outcome == "ok" and tl is not None and tl.error is not None:
            outcome, error = "upstream_error", error or _one_line(tl.error)
        rec: Record = self._minimal_record(trace, outcome, error)
        rec["e2e_s"] = (end_ns - meta.start_ns) / 1e9
        if tl is None:
            return rec
        tokens = [n for _, n in tl.chunks if n > 0]
        k = float(self.config.k) if self.config.k else self.scraper.learned_k()
        chunks_are_steps = (
            tl.stream and bool(tokens) and tl.token_source in EXACT_SOURCES and "several_choices" not in flags
        )
        if chunks_are_steps and k is not None and tokens and max(tokens) > round(k) + 1:
            flags.append("stream_interval_suspected")  # more tokens in one chunk than one step can bring
            chunks_are_steps = False
        server = from_server(tl.server_spec) if tl.server_spec else None
        if server is None and tl.llama_timings:
            server = from_llama_timings(tl.llama_timings)
        chunk_est = from_chunks(tokens, k) if tl.stream and tokens else None
        counter_est: SpecEstimate | None = counters.estimate if counters is not None else None
        if counters is not None:
            if counters.reset:
                flags.append("counter_reset")
            # alone on the engine the counters are exact: chunks merged steps if they show fewer steps than drafts
            if (
                counter_est is not None
                and not counters.overlapped
                and counter_est.exact
                and chunk_est is not None
                and chunks_are_steps
                and counter_est.drafts > 1.05 * chunk_est.drafts + 1
            ):
                flags.append("chunks_fewer_than_steps")
                chunks_are_steps = False
        elif self.scraper.enabled and self.scraper.state.errors and tl.stream:
            flags.append("metrics_unavailable")
        alone = counters is not None and not counters.overlapped and counters.estimate.exact
        partial_drafting = (
            (k is not None and abs(k - round(k)) > 0.05)  # ngram proposes fewer than k tokens at times
            or self.ledger.partial_drafting  # and drafts on some steps only
            or (
                alone
                and chunk_est is not None
                and counter_est is not None
                and counter_est.drafts < 0.95 * chunk_est.drafts - 1
            )
        )
        if chunk_est is not None and partial_drafting:
            chunk_est = replace(chunk_est, exact=False)
            flags.append("partial_drafting")
        if chunk_est is not None and not chunks_are_steps:
            chunk_est = replace(chunk_est, exact=False)
        source, chosen = _choose(server, chunk_est, counter_est)
        if chosen is not None and chosen.draft_tokens and chosen.accepted == 0:
            flags.append("spec_zero_acceptance")
        rec.update(
            upstream_id=tl.upstream_id,
            stream=tl.stream,
            finish_reason=tl.finish_reason,
            truncated=tl.finish_reason == "length",
            prompt_tokens=tl.prompt_tokens,
            completion_tokens=tl.completion_tokens,
            token_source=tl.token_source,
            ttft_s=tl.ttft_s,
            decode_tok_s=tl.decode_tok_s,
            tpot_s=tl.tpot_s,
            upstream_headers_s=(trace.headers_ns - meta.start_ns) / 1e9 if trace.headers_ns else None,
            chunks=[[round(t, 6), n] for t, n in tl.chunks],
            events=tl.events,
            reads=tl.reads,
            multi_event_reads=tl.multi_event_reads,
            keepalives=tl.keepalives,
            chunks_are_steps=chunks_are_steps,
            flags=flags,
            proxy_overhead_s=(
                {
                    "mean": trace.overhead_ns / trace.overhead_count / 1e9,
                    "max": trace.overhead_max_ns / 1e9,
                    "count": trace.overhead_count,
                }
                if trace.overhead_count
                else None
            ),
            spec=_spec_block(source, chosen, server, chunk_est, counter_est, tokens, k),
        )
        if tl.stream and outcome == "ok" and not tl.done:
            rec["flags"].append("no_done_marker")
        if self.config.capture == "full":
            rec["response_text"] = tl.response_text
        return rec

    def _minimal_record(self, trace: Trace, outcome: str, error: str | None) -> Record:
        meta = trace.meta
        return {
            "schema_version": SCHEMA_VERSION,
            "request_id": meta.request_id,
            "upstream_id": None,
            "started_at": meta.started_at,
            "workload": meta.workload,
            "label": self.config.label,
            "run_id": self.run_id,
            "repeat": meta.repeat,
            "method": meta.method,
            "path": meta.path,
            "model": meta.model,
            "status": trace.status,
            "stream": meta.stream_requested,
            "outcome": outcome,
            "error": error,
            "finish_reason": None,
            "truncated": False,
            "prompt_tokens": None,
            "completion_tokens": None,
            "token_source": "none",
            "ttft_s": None,
            "e2e_s": (time.perf_counter_ns() - meta.start_ns) / 1e9,
            "decode_tok_s": None,
            "tpot_s": None,
            "upstream_headers_s": None,
            "chunks": [],
            "events": 0,
            "reads": 0,
            "multi_event_reads": 0,
            "keepalives": 0,
            "chunks_are_steps": False,
            "flags": [],
            "proxy_overhead_s": None,
            "spec": None,
            "request": redact(meta.body) if self.config.capture in ("request", "full") else None,
            "response_text": None,
            "replay_of": meta.replay_of,
        }

    def _observe(self, rec: Record) -> None:
        m = self.metrics
        w = rec["workload"]
        m.requests.labels(w, rec["outcome"]).inc()
        per = self.workload_requests.setdefault(w, {})
        per[rec["outcome"]] = per.get(rec["outcome"], 0) + 1
        if rec.get("completion_tokens"):
            m.generated_tokens.labels(w).inc(rec["completion_tokens"])
        if rec.get("ttft_s") is not None and rec.get("stream"):
            m.ttft.labels(w).observe(rec["ttft_s"])
        if rec.get("decode_tok_s"):
            m.decode_tok_s.labels(w).observe(rec["decode_tok_s"])
        chunks = rec.get("chunks") or []
        if chunks:
            steps, toks = step_and_token_gaps([(t, n) for t, n in chunks])
            step_h, tok_h = m.inter_step.labels(w), m.inter_token.labels(w)
            for g in steps:
                step_h.observe(g)
            for g in toks:
                tok_h.observe(g)
        po = rec.get("proxy_overhead_s")
        if po:
            m.overhead.observe(po["mean"])
        spec = rec.get("spec")
        if spec and spec.get("source"):
            acc = self.workload_spec.setdefault(w, {"accepted": 0.0, "drafts": 0.0, "draft_tokens": 0.0})
            for key, counter in (
                ("accepted", m.spec_accepted),
                ("drafts", m.spec_drafts),
                ("draft_tokens", m.spec_draft_tokens),
            ):
                v = spec.get(key)
                if v:
                    counter.labels(w).inc(v)
                    acc[key] += v
            zero = acc["draft_tokens"] >= ZERO_ACCEPTANCE_MIN_DRAFT_TOKENS and acc["accepted"] == 0
            m.spec_zero_acceptance.labels(w).set(1 if zero else 0)

    def status(self) -> dict[str, Any]:
        workloads: dict[str, Any] = {}
        for w in sorted(set(self.workload_requests) | set(self.workload_spec)):
            acc = self.workload_spec.get(w, {})
            dt, dr, ac = acc.get("draft_tokens", 0.0), acc.get("drafts", 0.0), acc.get("accepted", 0.0)
            workloads[w] = {
                "requests": self.workload_requests.get(w, {}),
                "accepted": ac,
                "drafts": dr,
                "draft_tokens": dt,
                "acceptance_rate": ac / dt if dt else None,
                "mean_acceptance_length": 1 + ac / dr if dr else None,
                "zero_acceptance": dt >= ZERO_ACCEPTANCE_MIN_DRAFT_TOKENS and ac == 0,
            }
        sc = self.scraper.state
        cum = sc.cumulative
        return {
            "run_id": self.run_id,
            "label": self.config.label,
            "in_flight": self.in_flight,
            "workloads": workloads,
            "engine": {
                "kind": sc.engine,
                "scrapes_ok": sc.ok,
                "scrape_errors": sc.errors,
                "counter_resets": sc.resets,
                "last_error": sc.last_error,
                "k_learned": self.scraper.learned_k(),
                "accepted": cum.accepted if cum else None,
                "draft_tokens": cum.draft_tokens if cum else None,
                "unattributed_accepted": self.ledger.unattributed.accepted,
            },
            "records": {"written": self.sink.written, "dropped": self.sink.dropped, "sink_errors": self.sink.errors},
        }

    def _check_calibration(self) -> None:
        if not self._calibrated.is_set() and self.ledger.model.stable():
            self._calibrated.set()

    async def close(self) -> None:
        """Finish every pending record (their closing scrapes included), then flush the sink."""
        self._calibrated.set()  # records held for the acceptance model take it as it stands
        if self._finalizers:
            await asyncio.gather(*list(self._finalizers), return_exceptions=True)
        await self.scraper.close()
        await self.sink.close()


def _choose(
    server: SpecEstimate | None, chunks: SpecEstimate | None, counters: SpecEstimate | None
) -> tuple[str | None, SpecEstimate | None]:
    if server is not None and server.drafts:
        return "server", server
    if chunks is not None and chunks.draft_tokens is not None and chunks.exact:
        return "chunks", chunks
    if counters is not None and counters.drafts:
        return "counters", counters
    if chunks is not None and chunks.draft_tokens is not None:
        return "chunks", chunks
    if server is not None:
        return "server", server
    return None, None


def _spec_block(
    source: str | None,
    chosen: SpecEstimate | None,
    server: SpecEstimate | None,
    chunks: SpecEstimate | None,
    counters: SpecEstimate | None,
    tokens: list[int],
    k: float | None,
) -> dict[str, Any] | None:
    if chosen is None and server is None and chunks is None and counters is None:
        return None
    base = chosen.as_dict() if chosen is not None else {}
    return {
        "source": source,
        "accepted": base.get("accepted"),
        "drafts": base.get("drafts"),
        "draft_tokens": base.get("draft_tokens"),
        "k": base.get("k") if base.get("k") is not None else k,
        "acceptance_rate": base.get("acceptance_rate"),
        "mean_acceptance_length": base.get("mean_acceptance_length"),
        "per_position": base.get("per_position", []),
        "tokens_per_step": tokens_per_step_histogram(tokens),
        "estimates": {
            "server": server.as_dict() if server else None,
            "chunks": chunks.as_dict() if chunks else None,
            "counters": counters.as_dict() if counters else None,
        },
    }


def _one_line(err: Any) -> str:
    if isinstance(err, Mapping):
        msg = err.get("message")
        if isinstance(msg, str):
            return " ".join(msg.split())[:500]
    return " ".join(str(err).split())[:500]
