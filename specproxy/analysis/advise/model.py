"""``specproxy advise``: from measured acceptance per draft position, which k (draft tokens per step) pays off.

Model. With conditional acceptance p_i (position i accepted given position i-1 was), a step that drafts k tokens
emits E(k) = 1 + sum_{j=1..k} prod_{i<j} p_i tokens on average. A step costs step(k) = base_step_s * (1 + c * k),
where c is the cost of one draft token as a fraction of a plain decode step (drafting plus verifying it). The
predicted speedup over no speculation is E(k) / (1 + c * k); the recommended k is the smallest within 1% of the best
(a draft that buys less than 1% is not worth its cost under load), or 0 ("don't speculate") if nothing beats 1.0.

c comes from ``--draft-cost``, else is fitted from the median step time of runs with different k (a run without
speculation counts as k = 0), else defaults to :data:`DEFAULT_DRAFT_COST`. A request's step time is what the engine
says (:func:`timed_step_s`): its decode span over its steps, the steps counted as decode tokens minus accepted
drafts (each step brings one token plus the drafts it accepted), from the counters or the engine's own figures.
Chunk gaps are the fallback: on a busy host two steps' events can arrive in one read and halve the median gap.
Step times depend on batch size, so only runs at the same concurrency should be fitted together. Pure: records in,
advice out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from specproxy.analysis.figures.acceptance import (
    UNSETTLED_MEANING,
    Acceptance,
    conditional_rates,
    expected_tokens_per_step,
    pool_acceptance,
)
from specproxy.analysis.figures.confidence import (
    Interval,
    acceptance_interval,
    bootstrap_many,
    speedup_verdict,
)
from specproxy.analysis.figures.records import is_ok
from specproxy.core.record import Record
from specproxy.core.stats import median

# A middle-of-the-road figure for what MTP heads and small draft models cost per drafted token at batch 1, as a
# share of a target step (the simulator's default profile is 20%). Measure it (--baseline-run) when it matters.
DEFAULT_DRAFT_COST = 0.15
DEFAULT_MAX_K = 8
TOLERANCE = 0.01
MIN_REQUESTS = 20
MIN_DRAFT_TOKENS = 1000
ZERO_ACCEPTANCE = 0.02

WARN_BROKEN_HEAD = "drafts produced, every one rejected: is the speculative head broken, e.g. by quantization?"


@dataclass(frozen=True, slots=True)
class CostModel:
    draft_cost: float
    base_step_s: float | None
    source: str  # "given", "fitted", "default" or "lowest load" (records at several batch sizes)
    points: tuple[tuple[int, float], ...]  # (k, median inter-step gap in seconds) per configuration


@dataclass(frozen=True, slots=True)
class KPrediction:
    k: int
    expected_tokens_per_step: float
    relative_step_cost: float
    speedup: float
    tok_s: float | None
    extrapolated: bool
    speedup_ci: Interval | None = None  # 95%, over the workload's requests (acceptance resampled; cost as fitted)

    @property
    def verdict(self) -> str:
        return speedup_verdict(self.speedup, self.speedup_ci) if self.k else "-"


@dataclass(frozen=True, slots=True)
class MeasuredK:
    """A k that was run and measured against the baseline (advise_measured.with_measurements)."""

    k: int
    speedup: float
    speedup_ci: Interval | None
    verdict: str
    agrees: bool  # the prediction for this k lies within the measurement's interval


@dataclass(frozen=True, slots=True)
class WorkloadAdvice:
    workload: str
    requests: int
    draft_tokens: float
    measured_k: int | None
    acceptance_rate: float | None
    conditional: tuple[float, ...]
    predictions: tuple[KPrediction, ...]
    recommended_k: int | None
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    acceptance_ci: Interval | None = None
    measured: tuple[MeasuredK, ...] = ()
    recommended_from: str = "prediction"  # or "measurement": the model disagreed with a measured k

    def measured_at(self, k: int) -> MeasuredK | None:
        return next((m for m in self.measured if m.k == k), None)


@dataclass(frozen=True, slots=True)
class Advice:
    cost: CostModel
    workloads: tuple[WorkloadAdvice, ...]


def config_k(records: Sequence[Record]) -> int:
    return k_of(pool_acceptance(records))


def k_of(acc: Acceptance) -> int:
    """A configuration's k from its pooled acceptance: the configured k, else draft tokens per draft."""
    if acc.k:
        return acc.k
    if acc.drafts > 0:
        return max(1, round(acc.draft_tokens / acc.drafts))
    return 0


def timed_step_s(rec: Record) -> float | None:
    """The record's mean decode step time as the engine's figures give it: the time from its first token to its last
    (``(n - 1) / decode_tok_s``) over its decode steps (``n - 1`` tokens less the drafts accepted; a request with no
    spec block accepted none). None for a record whose figures do not allow it (not ok, fewer than 3 tokens, or
    speculation on with no acceptance figure)."""
    n, rate = rec["completion_tokens"], rec["decode_tok_s"]
    if not is_ok(rec) or n is None or n < 3 or not rate or rate <= 0:
        return None
    spec = rec["spec"]
    accepted = 0.0
    if spec is not None:
        if spec["source"] is None or spec["accepted"] is None:
            return None
        accepted = spec["accepted"]
    steps = (n - 1) - accepted
    return (n - 1) / rate / steps if steps >= 1 else None


def fit_cost(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """Least squares step = a + b * k over points with at least two distinct k; returns (base_step_s, c = b / a)."""
    if len({k for k, _ in points}) < 2:
        return None
    n = len(points)
    mk = sum(k for k, _ in points) / n
    ms = sum(s for _, s in points) / n
    sxx = sum((k - mk) ** 2 for k, _ in points)
    b = sum((k - mk) * (s - ms) for k, s in points) / sxx
    a = ms - b * mk
    if a <= 0:
        return None
    return a, max(0.0, b / a)  # noise can make a slope negative; drafting is never free-er than not drafting


def cost_model(
    points: Sequence[tuple[int, float]], draft_cost: float | None = None, base_step_s: float | None = None
) -> CostModel:
    fitted = fit_cost(points)
    if draft_cost is not None:
        c, source = draft_cost, "given"
    elif fitted is not None:
        c, source = fitted[1], "fitted"
    else:
        c, source = DEFAULT_DRAFT_COST, "default"
    if base_step_s is None:
        zero = [s for k, s in points if k == 0]
        if zero:
            base_step_s = median(zero)
        elif fitted is not None:
            base_step_s = fitted[0]
        elif points:
            base_step_s = median([s / (1.0 + c * k) for k, s in points])
    return CostModel(draft_cost=c, base_step_s=base_step_s, source=source, points=tuple(points))


def predict(conditional: Sequence[float], cost: CostModel, max_k: int = DEFAULT_MAX_K) -> tuple[KPrediction, ...]:
    out: list[KPrediction] = []
    for k in range(max_k + 1):
        e = expected_tokens_per_step(conditional, k)
        rel = 1.0 + cost.draft_cost * k
        tok_s = e / (cost.base_step_s * rel) if cost.base_step_s else None
        out.append(KPrediction(k, e, rel, e / rel, tok_s, extrapolated=k > len(conditional)))
    return tuple(out)


def recommend(predictions: Sequence[KPrediction], tolerance: float = TOLERANCE) -> int:
    best = max(p.speedup for p in predictions)
    if best <= 1.0:
        return 0
    return min(p.k for p in predictions if p.speedup >= best * (1.0 - tolerance))


def asks_thinking(body: Any) -> bool:
    """A request body that turns thinking on (``chat_template_kwargs.enable_thinking``)."""
    kwargs = body.get("chat_template_kwargs") if isinstance(body, dict) else None
    return isinstance(kwargs, dict) and kwargs.get("enable_thinking") is True


def shows_thinking(text: str | None) -> bool:
    """A response text with ``<think>`` reasoning in it (not an empty ``<think></think>``)."""
    return text is not None and "<think>" in text and "<think></think>" not in text.replace("\n", "")


@dataclass(slots=True)
class WorkloadStats:
    """What the warnings need of a workload's records, counted one record at a time."""

    requests: int = 0
    zero_flagged: int = 0  # flag spec_zero_acceptance
    thinking_asked: int = 0  # requests that turned thinking on
    thinking_shown: int = 0  # responses that contain reasoning
    streamed: int = 0
    not_steps: int = 0  # streamed requests whose chunks don't map to engine steps

    def add(self, r: Record) -> None:
        self.requests += 1
        flags = r["flags"]
        if "spec_zero_acceptance" in flags:
            self.zero_flagged += 1
        if asks_thinking(r["request"]):
            self.thinking_asked += 1
        if shows_thinking(r["response_text"]):
            self.thinking_shown += 1
        if r["stream"]:
            self.streamed += 1
            if not r["chunks_are_steps"] or {"multi_event_reads", "stream_interval_suspected"} & set(flags):
                self.not_steps += 1


def warnings_of(stats: WorkloadStats, acc: Acceptance) -> list[str]:
    out: list[str] = []
    zero_flagged = stats.zero_flagged
    if acc.draft_tokens > 0 and (acc.acceptance_rate or 0.0) < ZERO_ACCEPTANCE:
        out.append(f"{WARN_BROKEN_HEAD} ({acc.accepted:.0f} of {acc.draft_tokens:.0f} draft tokens accepted)")
    elif zero_flagged:
        out.append(f"{zero_flagged} requests accepted no draft at all (flag spec_zero_acceptance)")
    asked, shown = stats.thinking_asked, stats.thinking_shown
    if asked:
        out.append(
            f"thinking was on in {asked} requests (chat_template_kwargs.enable_thinking=true): reasoning text "
            "changes acceptance; send enable_thinking=false if the workload means it off"
        )
    if shown:
        out.append(
            f"{shown} responses contain <think> reasoning: thinking is on (the server's default chat template?); "
            "turn it off if the workload means it off"
        )
    if stats.not_steps:
        out.append(
            f"{stats.not_steps} of {stats.streamed} streamed requests have chunks that don't map to engine steps "
            "(buffering in between, or a stream interval): per-step latency and chunk-based acceptance are unreliable"
        )
    if acc.unsettled:
        out.append(f"{acc.unsettled} of {acc.spec_requests} requests' acceptance is {UNSETTLED_MEANING}")
    if stats.requests < MIN_REQUESTS or acc.draft_tokens < MIN_DRAFT_TOKENS:
        out.append(
            f"only {stats.requests} requests and {acc.draft_tokens:.0f} draft tokens: too few for a stable figure "
            f"(want at least {MIN_REQUESTS} requests and {MIN_DRAFT_TOKENS} draft tokens)"
        )
    return out


def _with_intervals(
    records: Sequence[Record], preds: tuple[KPrediction, ...], cost: CostModel, max_k: int
) -> tuple[KPrediction, ...]:
    """Each predicted speedup's 95% interval: the workload's requests resampled, conditional acceptance measured
    again, the speedups predicted again (the cost model held as fitted)."""
    spec = [r for r in records if r["spec"] is not None and (r["spec"]["drafts"] or 0) > 0]

    def stat(draw: list[list[Record]]) -> list[float | None]:
        cond = conditional_rates(draw[0])
        return [p.speedup for p in predict(cond, cost, max_k)] if cond else [None] * (max_k + 1)

    cis = bootstrap_many([spec], stat)
    return tuple(replace(p, speedup_ci=cis[p.k] if p.k < len(cis) else None) for p in preds)


def advise_from(
    workload: str,
    stats: WorkloadStats,
    acc: Acceptance,
    cond: tuple[float, ...],
    cost: CostModel,
    max_k: int,
    records: Sequence[Record] = (),
) -> WorkloadAdvice:
    """The advice for one workload from what its records add up to; ``records`` (all of them, or a uniform sample)
    give the intervals, which are left out without them."""
    warnings = warnings_of(stats, acc)
    notes: list[str] = []
    if not cond:
        warnings.insert(0, "no speculative decoding in these records: run with speculation to measure acceptance")
        preds: tuple[KPrediction, ...] = ()
        rec_k: int | None = None
    else:
        preds = predict(cond, cost, max_k)
        if records:
            preds = _with_intervals(records, preds, cost, max_k)
        rec_k = recommend(preds)
        if max_k > len(cond):
            notes.append(
                f"positions beyond {len(cond)} were not measured: they repeat the last conditional rate "
                f"({cond[-1]:.2f}), which likely flatters large k"
            )
    return WorkloadAdvice(
        workload=workload,
        requests=stats.requests,
        draft_tokens=acc.draft_tokens,
        measured_k=max(acc.k or 0, len(acc.per_position)) or None,  # the deepest position measured
        acceptance_rate=acc.acceptance_rate,
        conditional=cond,
        predictions=preds,
        recommended_k=rec_k,
        warnings=tuple(warnings),
        notes=tuple(notes),
        acceptance_ci=acceptance_interval(records) if records else None,
    )
