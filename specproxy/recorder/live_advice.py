"""What to run now: the k (draft tokens per step) that pays off per workload, from the last minutes of live traffic.

``specproxy advise``'s model (:mod:`specproxy.analysis.advise`) over the live records of a sliding window, refreshed
on a schedule by the proxy's bookkeeper, for its status and metrics. The engine runs one k; positions beyond it are
not measured, so the choice is among k = 0 (no speculation) up to the k that runs: "lower k would pay more" is what
live traffic can tell, a higher one only a run that measures it (``matrix``, ``sweep``, or a shadow candidate).
The cost model is advise's default draft cost unless the window holds runs at several k.

Pure but for the clock it is given; the bookkeeper computes in a thread (:meth:`LiveAdvice.compute` works on a
snapshot) so that a large window does not hold its loop.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy.analysis.advise.gather import build_advice
from specproxy.analysis.advise.model import WorkloadAdvice, asks_thinking, shows_thinking
from specproxy.core.record import Record
from specproxy.core.window import Window
from specproxy.recorder.live_bands import Band, Point, Schedule, band_json, compute_bands, point_of

WINDOW_S = 600.0
MAX_PER_WORKLOAD = 2000  # the latest records a workload keeps in the window
MAX_RECORDS = 8000  # the latest records all workloads keep together (up to 100 workloads would keep 200,000)
MAX_RECORD_BYTES = 16 * 2**20  # of their JSON: a record's path, model and error are clients' and engines', any length
MAX_POINTS = 8000  # the latest requests the bands keep (all workloads, any outcome)
MAX_POINT_BYTES = 4 * 2**20  # of their JSON: a point's path is a client's, any length


class LiveAdvice:
    def __init__(
        self,
        window_s: float = WINDOW_S,
        max_per_workload: int = MAX_PER_WORKLOAD,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule | None = None,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.window_s = window_s
        self.schedule = schedule  # the engine's k per batch size, to check against (--speculative-config)
        self._points: Window[Point] = Window(
            max_age_s=window_s, max_per_key=max_points, max_entries=max_points, max_bytes=MAX_POINT_BYTES, clock=clock
        )
        self.bands: list[Band] = []
        self._clock = clock
        self._records: Window[Record] = Window(
            max_age_s=window_s,
            max_per_key=max_per_workload,
            max_entries=MAX_RECORDS,
            max_bytes=MAX_RECORD_BYTES,
            clock=clock,
        )
        self.current: dict[str, dict[str, Any]] = {}
        self.changes: collections.Counter[str] = collections.Counter()
        self.refreshed_at: float | None = None
        self.refreshes = 0

    def observe(self, rec: Record) -> None:
        """Every live record (an observer of the recorder): kept (:func:`kept`) if it ended ok with drafts; and for the
        bands, whatever its end (a failed request was in flight too)."""
        if rec.get("started_at") is not None and rec.get("e2e_s") is not None:
            point = point_of(rec)
            self._points.add(None, point, len(orjson.dumps(point.rec)))
        spec = rec.get("spec")
        if rec.get("outcome") != "ok" or not spec or not spec.get("drafts"):
            return
        light = kept(rec)
        self._records.add(rec["workload"], light, len(orjson.dumps(light)))

    def snapshot(self) -> list[Record]:
        """The window's records, the older ones let go."""
        return self._records.entries()

    def band_points(self) -> list[Point]:
        """The window's requests for the bands, the older ones let go."""
        return self._points.entries()

    @staticmethod
    def compute(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
        """workload -> what to run now (:func:`summary`); workloads with too few records say so."""
        if not records:
            return {}
        deepest = max(len(spec["per_position"]) if (spec := r["spec"]) is not None else 0 for r in records)
        advice = build_advice(records, max_k=max(1, deepest))
        return {w.workload: summary(w) for w in advice.workloads}

    @staticmethod
    def compute_all(
        records: Sequence[Record], points: Sequence[Point], schedule: Schedule | None
    ) -> tuple[dict[str, dict[str, Any]], list[Band]]:
        """The advice per workload and the bands, from one snapshot (in a thread: neither holds the loop)."""
        return LiveAdvice.compute(records), compute_bands(points, schedule)

    def update(self, result: dict[str, dict[str, Any]], bands: list[Band] | None = None) -> None:
        if bands is not None:
            self.bands = bands
        for w, s in result.items():
            before = self.current.get(w)
            if before is not None and before["recommended_k"] != s["recommended_k"]:
                self.changes[w] += 1
        self.current = result
        self.refreshed_at = self._clock()
        self.refreshes += 1

    def status(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "refreshes": self.refreshes,
            "age_s": None if self.refreshed_at is None else round(self._clock() - self.refreshed_at, 1),
            "workloads": {w: {**s, "changes": self.changes[w]} for w, s in sorted(self.current.items())},
            "schedule": self.schedule.describe() if self.schedule is not None else None,
            "bands": [band_json(b) for b in self.bands],
        }


def kept(rec: Record) -> Record:
    """What the window keeps of a record: a copy without its chunks, and of its request body and response text only
    what the advice reads (whether thinking was asked for, and shown), so that the window's memory does not grow
    with the prompts (a whole record holds its body and text, up to ``--capture-max-bytes`` each)."""
    light = Record(**rec)
    light["chunks"] = []
    thinking = asks_thinking(rec.get("request"))
    light["request"] = {"chat_template_kwargs": {"enable_thinking": True}} if thinking else None
    text = rec.get("response_text")
    light["response_text"] = None if text is None else "<think>" if shows_thinking(text) else ""
    return light


def summary(w: WorkloadAdvice) -> dict[str, Any]:
    """One workload's advice as the status shows it: the recommended k, its predicted speedup over no speculation
    with its interval and verdict, and what the window measured."""
    best = next((p for p in w.predictions if p.k == w.recommended_k), None)
    running = next((p for p in w.predictions if p.k == w.measured_k), None)
    return {
        "recommended_k": w.recommended_k,
        "speedup": best.speedup if best is not None else None,
        "speedup_ci": [best.speedup_ci.lo, best.speedup_ci.hi] if best is not None and best.speedup_ci else None,
        "verdict": best.verdict if best is not None else "-",
        "running_k": w.measured_k,
        "running_speedup": running.speedup if running is not None else None,
        "speedups": {str(p.k): p.speedup for p in w.predictions},
        "acceptance_rate": w.acceptance_rate,
        "acceptance_ci": [w.acceptance_ci.lo, w.acceptance_ci.hi] if w.acceptance_ci else None,
        "requests": w.requests,
        "warnings": list(w.warnings),
    }


class LiveAdviceCollector(Collector):
    """``specproxy_recommended_k{workload}``, ``specproxy_recommended_speedup{workload,k}`` (predicted, over no
    speculation, for every k up to the one that runs), ``specproxy_running_k{workload}``,
    ``specproxy_recommendation_changes_total{workload}``; per band of requests in flight
    (:mod:`specproxy.recorder.live_bands`) ``specproxy_band_*{band}``."""

    def __init__(self, live: LiveAdvice | None) -> None:
        self._live = live

    def collect(self) -> Iterator[Metric]:
        rec_k = GaugeMetricFamily(
            "specproxy_recommended_k", "The k that pays off now per workload (0: none).", labels=["workload"]
        )
        speed = GaugeMetricFamily(
            "specproxy_recommended_speedup",
            "Predicted speedup over no speculation per k, from the live window.",
            labels=["workload", "k"],
        )
        changes = CounterMetricFamily(
            "specproxy_recommendation_changes", "Times the recommended k changed.", labels=["workload"]
        )
        running = GaugeMetricFamily(
            "specproxy_running_k",
            "The k the engine ran per workload, as the live window measured it.",
            labels=["workload"],
        )
        if self._live is not None:
            for w, s in self._live.current.items():
                if s["recommended_k"] is not None:
                    rec_k.add_metric([w], s["recommended_k"])
                if s["running_k"] is not None:
                    running.add_metric([w], s["running_k"])
                for k, v in s["speedups"].items():
                    speed.add_metric([w, k], v)
                changes.add_metric([w], self._live.changes[w])
        yield from (rec_k, speed, running, changes)
        yield from _band_metrics(self._live.bands if self._live is not None else [])


_BAND_GAUGES = (
    # (name, help, the band's figure)
    ("specproxy_band_in_flight", "Mean requests in flight during decode of the band's requests.", "in_flight"),
    ("specproxy_band_draft_k", "Draft tokens per drafting step at this band: the k that ran.", "draft_k"),
    ("specproxy_band_drafting_share", "Drafting steps per decode step at this band.", "drafting_share"),
    ("specproxy_band_acceptance", "Accepted over drafted tokens at this band.", "acceptance_rate"),
    ("specproxy_band_step_seconds", "Median decode step time at this band.", "step_s"),
    ("specproxy_band_decode_tokens_per_second", "The server's decode throughput at this band.", "server_tok_s"),
    ("specproxy_band_predicted_speedup", "Predicted speedup of the k that ran, from the band's acceptance.", "speedup"),
    ("specproxy_band_expected_k", "The k the given --speculative-config schedules at this band.", "expected_k"),
)


def _band_metrics(bands: Sequence[Band]) -> Iterator[Metric]:
    for name, doc, attr in _BAND_GAUGES:
        g = GaugeMetricFamily(name, doc, labels=["band"])
        for b in bands:
            v = getattr(b, attr)
            if v is not None:
                g.add_metric([b.label], float(v))
        yield g
    losing = GaugeMetricFamily(
        "specproxy_band_speculation_losing",
        "1 where speculation loses at this band of requests in flight (status says why).",
        labels=["band"],
    )
    mismatch = GaugeMetricFamily(
        "specproxy_band_schedule_mismatch",
        "1 where the engine does not run the k the given --speculative-config schedules at this band.",
        labels=["band"],
    )
    for b in bands:
        losing.add_metric([b.label], float(b.losing))
        if b.schedule_mismatch is not None:
            mismatch.add_metric([b.label], float(b.schedule_mismatch))
    yield from (losing, mismatch)
