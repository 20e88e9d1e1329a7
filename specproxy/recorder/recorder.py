"""The recorder: one per proxy bookkeeper or load-generator run. It follows each request's response, shares the
engine's counter deltas among overlapping requests, picks the best acceptance figure per request and writes one record
each. In the proxy it runs in the bookkeeper (:mod:`specproxy.proxy.bookkeeper`), off the relays' loops: per upstream
read, :meth:`specproxy.recorder.trace.Trace.feed`; the rest (closing scrape, record, own metrics) in a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.analysis.figures.spans import SpanPool
from specproxy.analysis.report.spans import spans_json
from specproxy.attribution.choice import Evidence, decide
from specproxy.attribution.counts import SpecCounts, counts_of_block
from specproxy.attribution.ledger import CounterAttribution, CounterLedger
from specproxy.attribution.spans import span_block
from specproxy.core.dialects.engine import PER_TOKEN_ENGINES, decode_figure
from specproxy.core.errors import one_line
from specproxy.core.figures import step_gaps, token_gaps
from specproxy.core.inference import is_inference, kind_of
from specproxy.core.prom import NO_SPEC_COUNTERS
from specproxy.core.record import CORRECTION_PENDING, SCHEMA_VERSION, Overhead, Record, correction_line
from specproxy.core.redact import TOO_DEEP, TOO_MANY, capture_body, redact_values, too_large
from specproxy.core.timeline import TimelineResult
from specproxy.core.tokens import EXACT_SOURCES, SERVER_TOKENIZER, Tokenizer, load_model_tokenizer
from specproxy.recorder.config import RecorderConfig as RecorderConfig  # re-exported: its old home
from specproxy.recorder.engine_probe import EngineIdentity
from specproxy.recorder.metrics import OwnMetrics
from specproxy.recorder.scraper import Scraper
from specproxy.recorder.sink import RecordSink
from specproxy.recorder.tokenize import ServerTokenizer
from specproxy.recorder.trace import RequestMeta, Trace

log = logging.getLogger("specproxy.recorder")

ZERO_ACCEPTANCE_MIN_DRAFT_TOKENS = 100
CLOSE_SCRAPE_WAIT_S = 1.0  # at shutdown, how long pending records wait for their closing scrape
# Records awaiting their correction at once, at most (each holds its request's timeline): beyond it a record is
# written once, with the figure known when its request ended, flagged counters_unsettled as such a record always is.
MAX_HELD = 4096


class Recorder:
    def __init__(
        self,
        config: RecorderConfig,
        session: aiohttp.ClientSession,
        *,
        tokenizer: Tokenizer | None = None,
        sink: RecordSink | None = None,
    ) -> None:
        """``sink``: another recorder's, shared (a shadow candidate's records go to the proxy's file); that recorder
        starts and closes it."""
        self.config = config
        self.server_tokenizer = (
            ServerTokenizer(session, config.tokenize_url)
            if config.tokenizer == SERVER_TOKENIZER and config.tokenize_url is not None
            else None
        )
        if tokenizer is None and config.tokenizer and config.tokenizer != SERVER_TOKENIZER:
            tokenizer = load_model_tokenizer(config.tokenizer)  # the command checked it: a cached load
        self.tokenizer = tokenizer
        self.engine = EngineIdentity(session, config.engine, config.probe_url)
        self.metrics = OwnMetrics()
        self.ledger = CounterLedger()
        self.run_id = config.run_id or uuid.uuid4().hex[:12]
        self._owns_sink = sink is None
        self.sink = sink or RecordSink(
            Path(config.record_path) if config.record_path else None,
            rotate_bytes=config.rotate_bytes,
            keep=config.rotate_keep,
            max_pending_bytes=config.max_pending_bytes,
            on_written=self.metrics.records_written.inc,
            on_dropped=self.metrics.records_dropped.inc,
            on_error=self.metrics.sink_errors.inc,
            on_deleted=self.metrics.record_files_deleted.inc,
        )
        self.metrics.records_queued_bytes.set_function(lambda: self.sink.queued_bytes)
        self.scraper = Scraper(
            session,
            config.metrics_url,
            self.ledger,
            interval_s=config.scrape_interval_s,
            timeout_s=config.scrape_timeout_s,
            min_gap_s=config.scrape_min_gap_s,
            arrival_wait_s=config.scrape_arrival_wait_s,
            on_error=self.metrics.scrape_errors.inc,
            on_settle=self._check_calibration,
        )
        self._calibrated = asyncio.Event()  # the acceptance model is stable (ledger.model)
        self._drafting_calibrated = asyncio.Event()  # the drafting model is stable (ledger.drafting)
        self._finalizers: set[asyncio.Task[None]] = set()
        self.in_flight = 0
        self.held = 0  # records written whose correction waits for a per-workload model (--attribution-hold)
        self.workload_spec: dict[str, SpecCounts] = {}
        self.workload_spans: dict[str, SpanPool] = {}  # running sums per span type and output position
        self.workload_requests: dict[str, dict[str, int]] = {}
        self.refused_requests: dict[int, int] = {}
        self.passthrough: dict[str, dict[str, int]] = {}  # requests that are not inference: kind -> outcome -> n
        # told each record's request id and response text, where the trace kept it, before the observers see the
        # record (a shadow's lossless check compares texts that --capture may keep off the record)
        self.on_text: Callable[[str, str], None] | None = None

    async def start(self) -> None:
        if self._owns_sink:
            await self.sink.start()
        await self.scraper.start()
        self.engine.start()

    def begin(self, meta: RequestMeta, *, keep_text: bool = False) -> Trace:
        if not is_inference(meta.method, meta.path):
            return Trace(meta, tokenizer=None, keep_text=False, ledger=None, passthrough=True)
        self.in_flight += 1
        self.metrics.in_flight.inc()
        self.ledger.begin(meta.request_id, meta.workload)
        scraper = self.scraper
        scraper.kick()
        if scraper.enabled:
            scraper.prefill_started()  # no scrape starts on the engine until this request has its first token
        return Trace(
            meta,
            tokenizer=self.tokenizer,
            keep_text=keep_text or self.config.capture == "full" or self.server_tokenizer is not None,
            ledger=self.ledger if scraper.enabled else None,
            on_first_token=scraper.prefill_ended if scraper.enabled else None,
        )

    def refused(self, status: int) -> None:
        """The proxy answered a request itself before forwarding it (413, 408): counted, not recorded."""
        self.refused_requests[status] = self.refused_requests.get(status, 0) + 1
        self.metrics.refused.labels(str(status)).inc()

    @property
    def idle(self) -> bool:
        """No request in flight, no record waiting for its closing scrape, nothing queued for writing."""
        return self.in_flight == 0 and not self._finalizers and self.sink.queued == 0

    def finish(self, trace: Trace, outcome: str, error: str | None = None, *, end_ns: int | None = None) -> None:
        """Never raises and never blocks: the record is completed in a task after the closing scrape."""
        if trace.passthrough:
            self._passed(trace, outcome)
            return
        trace.prefill_over()  # one that ended without a token holds no scrape back any more
        end_ns = time.perf_counter_ns() if end_ns is None else end_ns
        self.in_flight -= 1
        self.metrics.in_flight.dec()
        tl = trace.timeline
        self.ledger.end(trace.meta.request_id, truncated=tl is not None and tl.finish_reason == "length")
        task = asyncio.get_running_loop().create_task(self._finalize(trace, outcome, error, end_ns))
        self._finalizers.add(task)
        task.add_done_callback(self._finalizers.discard)

    def _passed(self, trace: Trace, outcome: str) -> None:
        """A request that is not inference ended: counted by kind and outcome, not recorded (core.inference)."""
        if outcome == "ok" and trace.status is not None and trace.status >= 400:
            outcome = "upstream_error"
        kind = kind_of(trace.meta.method, trace.meta.path)
        per = self.passthrough.setdefault(kind, {})
        per[outcome] = per.get(outcome, 0) + 1
        self.metrics.passthrough.labels(kind, outcome).inc()

    async def _finalize(self, trace: Trace, outcome: str, error: str | None, end_ns: int) -> None:
        rid = trace.meta.request_id
        early: Record | None = None  # written before its figure was settled: a correction follows
        tokenize_failed = False
        try:
            own = trace.timeline is not None and trace.timeline.server_spec is not None
            self.scraper.request_figures(own)
            if trace.token_chunks > 1:
                await self._closing_scrape(rid)
            tl = trace.timeline.result(end_ns) if trace.timeline is not None else None
            if tl is not None and self.server_tokenizer is not None and not tl.completion_from_usage:
                tl, tokenize_failed = await self.server_tokenizer.recount(tl, trace.meta.model)
            # a share that rests on a per-workload model is written now, with the figure known now, and corrected
            # once that model is stable (at most the hold later); where the record's figure is another source's
            # (the engine's own), it is final now, and the counters' estimate beside it is the one known now
            waits = [
                event
                for needed, event in (
                    (self.ledger.needs_model(rid), self._calibrated),
                    (self.ledger.needs_draft_model(rid), self._drafting_calibrated),
                )
                if needed and not event.is_set()
            ]
            # the share as it stands; kept in the ledger only while a correction may follow
            counters = self.ledger.peek(rid) if waits else self.ledger.pop(rid)
            rec = self.build_record(trace, outcome, error, end_ns, counters, tl, tokenize_failed)
            spec = rec["spec"]
            if waits and self.held < MAX_HELD and spec is not None and spec["source"] == "counters":
                early = rec
                early["flags"].append(CORRECTION_PENDING)
                self.sink.put(early)
                self.held += 1
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            asyncio.gather(*(event.wait() for event in waits)), self.config.calibration_hold_s
                        )
                finally:
                    self.held -= 1
                rec = self.build_record(trace, outcome, error, end_ns, self.ledger.pop(rid), tl, tokenize_failed)
            elif waits:
                self.ledger.pop(rid)
        except Exception as e:  # bookkeeping must never lose the record: write what is known
            log.exception("building the record of %s failed", rid)
            with contextlib.suppress(Exception):  # the ledger may be what failed: forget the request all the same
                self.ledger.pop(rid)
            rec = self._minimal_record(trace, "proxy_error" if outcome == "ok" else outcome, f"{error or ''} {e}")
            if early is not None:  # what was written stands, no longer awaiting a correction
                rec = Record(**early)
                rec["flags"] = [f for f in early["flags"] if f != CORRECTION_PENDING]
        if early is None:
            self.sink.put(rec)
        else:
            self.sink.put_correction(correction_line(early, rec))
        try:
            if self.on_text is not None and trace.timeline is not None:
                text = trace.timeline.reply_text()  # None unless kept whole
                if text is not None:
                    self.on_text(rid, text)
            for observe in (self._observe, *self.config.observers):
                observe(rec)
        except Exception:
            log.exception("updating metrics for %s failed", rid)

    async def _closing_scrape(self, rid: str) -> None:
        """Wait for the scrapes that cover every chunk of ``rid`` (a delta whose chunks were still on their way is
        settled by the next scrape), at most ``finalize_wait_s``."""
        if not self.scraper.enabled:
            return
        deadline, give_up = time.monotonic() + self.config.finalize_wait_s, self.config.scrape_failures_wait
        while (left := deadline - time.monotonic()) > 0:
            fut = self.scraper.request()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), left)
            if not fut.done() or not self.ledger.pending_for(rid):
                break
            if not fut.result() and (self.scraper.closed or self.scraper.state.failing >= give_up):
                break  # /metrics is down; a single failure (a timeout on a busy host): wait for the next

    async def settle(self, trace: Trace) -> None:
        """Until the counters have covered every step of this finished request: a load generator sending one
        request at a time waits here before the next, so that no scrape interval holds two requests' steps and each
        request's counters' share is exact (at GPU speeds a request lasts about one scrape interval, so otherwise
        nearly every interval would be shared, and with ngram its hidden drafts modelled)."""
        if not trace.passthrough and trace.token_chunks > 1:
            await self._closing_scrape(trace.meta.request_id)

    async def boundary(self) -> None:
        """A scrape that starts now, at most ``finalize_wait_s`` waited for: what came before (unrecorded warm-up
        requests) falls in the intervals before it, what comes after in those after."""
        if self.scraper.enabled:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.scraper.request()), self.config.finalize_wait_s)

    def build_record(
        self,
        trace: Trace,
        outcome: str,
        error: str | None,
        end_ns: int,
        counters: CounterAttribution | None,
        tl: TimelineResult | None,
        tokenize_failed: bool = False,
    ) -> Record:
        meta = trace.meta
        if outcome == "ok" and tl is not None and tl.error is not None:
            outcome, error = "upstream_error", error or _one_line(tl.error)
        closed_at_end = outcome == "client_cancelled" and tl is not None and tl.done and tl.error is None
        if closed_at_end:  # the end of the answer was relayed: what the client did next is not a cancellation
            outcome, error = "ok", None
        rec: Record = self._minimal_record(trace, outcome, error)
        rec["e2e_s"] = (end_ns - meta.start_ns) / 1e9
        if tl is None:
            return rec
        engine = rec["engine"] = self.engine.of(tl.engine_hint, self.scraper.state.engine)
        counters = None if self.scraper.state.engine in NO_SPEC_COUNTERS else counters  # gauges only: no share
        choice = decide(
            Evidence(
                stream=tl.stream,
                tokens=[n for _, n in tl.chunks if n > 0],
                exact_counts=tl.chunk_token_source in EXACT_SOURCES,
                several_choices="several_choices" in tl.flags,
                k=float(self.config.k) if self.config.k else self.scraper.learned_k(),
                server_spec=tl.server_spec,
                llama_timings=tl.llama_timings,
                counters=counters,
                metrics_failing=self.scraper.enabled and self.scraper.state.errors > 0,
                engine_drafts_partially=self.ledger.partial_drafting,
                per_token_events=engine in PER_TOKEN_ENGINES,
            )
        )
        flags = [*rec["flags"], *tl.flags, *choice.flags]
        if tokenize_failed:
            flags.append("server_tokenize_failed")
        if closed_at_end:
            flags.append("client_closed_at_end")
        if tl.stream and outcome == "ok" and not tl.done:
            flags.append("no_done_marker")
        rec["upstream_id"] = tl.upstream_id
        rec["stream"] = tl.stream
        rec["finish_reason"] = tl.finish_reason
        rec["truncated"] = tl.finish_reason == "length"
        rec["prompt_tokens"] = tl.prompt_tokens
        rec["completion_tokens"] = tl.completion_tokens
        rec["cached_tokens"] = tl.cached_tokens
        rec["token_source"] = tl.token_source
        rec["chunk_token_source"] = tl.chunk_token_source
        rec["ttft_s"] = tl.ttft_s
        rec["decode_tok_s"], decode_flag = decode_figure(
            (engine, tl.engine_hint), tl.stream, tl.chunks, tl.decode_tok_s, tl.engine_timings
        )
        flags += [decode_flag] if decode_flag else []
        rec["engine_timings"] = tl.engine_timings
        rec["tpot_s"] = tl.tpot_s
        rec["upstream_headers_s"] = (trace.headers_ns - meta.start_ns) / 1e9 if trace.headers_ns else None
        rec["chunks"] = [(round(t, 6), n) for t, n in tl.chunks]
        rec["events"] = tl.events
        rec["reads"] = tl.reads
        rec["multi_event_reads"] = tl.multi_event_reads
        rec["buffer_sized_reads"] = tl.buffer_sized_reads
        rec["keepalives"] = tl.keepalives
        rec["chunks_are_steps"] = choice.chunks_are_steps
        rec["flags"] = flags
        if trace.overhead_count:
            rec["proxy_overhead_s"] = Overhead(
                mean=trace.overhead_ns / trace.overhead_count / 1e9,
                max=trace.overhead_max_ns / 1e9,
                count=trace.overhead_count,
            )
        rec["spec"] = choice.spec_block()
        if tl.stream:
            rec["spans"] = span_block(
                tl.chunks, tl.span_codes, chunks_are_steps=choice.chunks_are_steps, spec=rec["spec"]
            )
        if self.config.capture == "full" and tl.response_text is not None:
            rec["response_text"] = redact_values(tl.response_text)  # a model may echo a key it was given
        return rec

    def _minimal_record(self, trace: Trace, outcome: str, error: str | None) -> Record:
        """Every field, with what is known before the response is read: the record of a request that got none."""
        meta = trace.meta
        capture = self.config.capture in ("request", "full")
        if meta.body_bytes is not None:  # over capture_max_bytes: never parsed
            captured: Any = too_large(meta.body_bytes, self.config.capture_max_bytes) if capture else None
            flags = ["body_too_large"]
        else:
            captured = capture_body(meta.body) if capture else None
            flags = ["body_too_deep"] if captured == TOO_DEEP else ["body_too_large"] if captured == TOO_MANY else []
        flags += trace.flags
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
            "cached_tokens": None,
            "token_source": "none",
            "chunk_token_source": "none",
            "ttft_s": None,
            "e2e_s": (time.perf_counter_ns() - meta.start_ns) / 1e9,
            "decode_tok_s": None,
            "tpot_s": None,
            "upstream_headers_s": None,
            "chunks": [],
            "events": 0,
            "reads": 0,
            "multi_event_reads": 0,
            "buffer_sized_reads": 0,
            "keepalives": 0,
            "chunks_are_steps": False,
            "flags": flags,
            "proxy_overhead_s": None,
            "spec": None,
            "spans": None,
            "request": captured,
            "response_text": None,
            "replay_of": meta.replay_of,
            "shadow_of": meta.shadow_of,
            "conversation": meta.conversation,
            "turn": meta.turn,
            "engine": self.engine.of(None, self.scraper.state.engine),
            "engine_timings": None,
            "trace_parent": meta.trace_parent,
        }

    def _observe(self, rec: Record) -> None:
        m = self.metrics
        w = rec["workload"]
        m.requests.labels(w, rec["outcome"]).inc()
        per = self.workload_requests.setdefault(w, {})
        per[rec["outcome"]] = per.get(rec["outcome"], 0) + 1
        if rec["completion_tokens"]:
            m.generated_tokens.labels(w).inc(rec["completion_tokens"])
        if rec["ttft_s"] is not None and rec["stream"]:
            m.ttft.labels(w).observe(rec["ttft_s"])
        if rec["decode_tok_s"]:
            m.decode_tok_s.labels(w).observe(rec["decode_tok_s"])
        if rec["chunks"]:
            gaps = step_gaps(rec["chunks"])
            per_token = "chunks_not_steps_engine" in rec["flags"]  # one event per token: no steps seen
            m.inter_step.observe_many(w, [] if per_token else [g for g, _ in gaps])
            itl = token_gaps(gaps)
            m.inter_token.observe_many(w, [v for v, _ in itl], [n for _, n in itl])
        if (po := rec["proxy_overhead_s"]) is not None:
            m.overhead.observe(po["mean"])
        spans = self.workload_spans.get(w)
        if spans is None:
            spans = self.workload_spans[w] = SpanPool()
        spans.add(rec)
        spec = rec["spec"]
        if spec is not None and spec["source"]:
            got = counts_of_block(spec)
            for v, counter in (
                (got.accepted, m.spec_accepted),
                (got.drafts, m.spec_drafts),
                (got.draft_tokens, m.spec_draft_tokens),
            ):
                if v:
                    counter.labels(w).inc(v)
            acc = self.workload_spec[w] = self.workload_spec.get(w, SpecCounts()) + got
            m.spec_zero_acceptance.labels(w).set(1 if _zero_acceptance(acc) else 0)

    def status(self) -> dict[str, Any]:
        workloads: dict[str, Any] = {}
        for w in sorted(set(self.workload_requests) | set(self.workload_spec)):
            acc = self.workload_spec.get(w, SpecCounts())
            workloads[w] = {
                "requests": self.workload_requests.get(w, {}),
                "accepted": acc.accepted,
                "drafts": acc.drafts,
                "draft_tokens": acc.draft_tokens,
                "acceptance_rate": acc.acceptance_rate,
                "mean_acceptance_length": acc.mean_acceptance_length,
                "zero_acceptance": _zero_acceptance(acc),
                # where drafts land (span types, output positions), mean acceptance length pooled and per request
                "spans": spans_json(pool.result()) if (pool := self.workload_spans.get(w)) is not None else None,
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
                "name": self.engine.of(None, sc.engine),  # --engine, or what auto-detection found
                "acceptance_length_gauge": sc.accept_length_gauge,
                "scrapes_ok": sc.ok,
                # a scrape's flight (running mean), and the floor between scrapes it sets (engine time spared)
                "scrape_flight_ms": round(self.scraper.flight_s * 1e3, 3) if self.scraper.flight_s else None,
                "scrape_gap_s": round(self.scraper.gap_s, 3),
                "scrapes_deferred": self.scraper.deferred,  # held back until a request in prefill got its first token
                "scrapes_waited_for_relays": self.scraper.caught_up_late,  # settled once the relays' chunks had arrived
                "per_request_figures": self.scraper.per_request_figures,  # the engine's own: scraped seldom
                "scrape_errors": sc.errors,
                "counter_resets": sc.resets,
                "last_error": sc.last_error,
                "k_learned": self.scraper.learned_k(),
                "accepted": cum.accepted if cum else None,
                "draft_tokens": cum.draft_tokens if cum else None,
                # scrape intervals settled by the engine's step count, and those that fell back to a cut by time
                # (more steps counted than our chunks explain: another client, or chunks lagging the counters)
                "intervals_aligned": self.ledger.aligned,
                "intervals_cut_by_time": self.ledger.time_cut,
                # steps the engine sent merged into one chunk (its HTTP task behind), found and put back
                "steps_unmerged": round(self.ledger.unmerged),
                "unattributed_accepted": self.ledger.unattributed.accepted,
                # chunks read that no scrape interval has taken yet: a scrape's worth, unless the counters lag
                "chunks_waiting": self.ledger.pending_chunks,
                # the per-workload models records wait for (--attribution-hold), once stable for good
                "models_stable": {
                    "acceptance": self._calibrated.is_set(),
                    # None: not used, the engine drafts on every step (or too few steps seen to tell)
                    "drafting": self._drafting_calibrated.is_set() if self.ledger.partial_drafting else None,
                },
            },
            "records": {
                "written": self.sink.written,
                "dropped": self.sink.dropped,  # lost: never written, and never will be
                "queued": self.sink.queued,
                "queued_bytes": self.sink.queued_bytes,
                # written, their correction waiting for their workload's model to be stable (at most the hold)
                "held": self.held,
                "corrections": self.sink.corrections,
                "corrections_dropped": self.sink.corrections_dropped,
                "sink_errors": self.sink.errors,
                "files_deleted": self.sink.files_deleted,
            },
            "refused": {str(status): n for status, n in sorted(self.refused_requests.items())},  # answered, unrecorded
            "passthrough": {k: dict(sorted(v.items())) for k, v in sorted(self.passthrough.items())},  # unrecorded
        }

    def _check_calibration(self) -> None:
        if not self._calibrated.is_set() and self.ledger.settled(self.ledger.model):
            self._calibrated.set()
        # only a record of an engine that drafts on some steps (ngram) waits for the drafting model; where every step
        # drafts its fit is of no use, and refitting it at every scrape would cost the bookkeeper much CPU
        drafting = self.ledger.drafting
        if not self._drafting_calibrated.is_set() and self.ledger.partial_drafting and self.ledger.settled(drafting):
            self._drafting_calibrated.set()

    async def close(self) -> None:
        """Finish every pending record, then flush the sink. A closing scrape gets :data:`CLOSE_SCRAPE_WAIT_S`: one
        that has not answered by then (a hanging ``/metrics``) is abandoned, and its records are written without
        it, so that shutdown stays within what ``docker stop`` or Kubernetes allow after the drain."""
        self._calibrated.set()  # records held for the per-workload models take them as they stand
        self._drafting_calibrated.set()
        await self.engine.close()
        if self._finalizers:
            await asyncio.wait(list(self._finalizers), timeout=CLOSE_SCRAPE_WAIT_S)
        await self.scraper.close()  # waiting finalizers get "no scrape" and write what is known
        if self._finalizers:
            await asyncio.gather(*list(self._finalizers), return_exceptions=True)
        if self._owns_sink:
            await self.sink.close()


def _zero_acceptance(c: SpecCounts) -> bool:
    """Drafts produced and every one rejected: speculation is broken (a bad quantisation, a mismatched drafter)."""
    return c.draft_tokens >= ZERO_ACCEPTANCE_MIN_DRAFT_TOKENS and c.accepted == 0


def _one_line(err: Any) -> str:
    # the engine's own words, which may quote the request (bytes, URLs with keys): kept as one safe line
    if isinstance(err, Mapping):
        msg = err.get("message")
        if isinstance(msg, str):
            return one_line(msg, 500)
    return one_line(err, 500)
