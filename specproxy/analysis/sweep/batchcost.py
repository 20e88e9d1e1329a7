"""k per batch size: what a draft token costs at each batch size, and the k that pays off in each range of requests
in flight. Pure: records in, a schedule out.

Each request's decode ran at a batch size (:mod:`specproxy.analysis.figures.inflight`: the mean requests in flight from
its first token to its end) and at a step time (its decode span over its steps). Requests are put in batch buckets
around powers of two (1, 2, 3-5, 6-11, 12-22, ...: a sweep's concurrencies 1, 2, 4, 8, 16 land one to a bucket);
per bucket and configuration the step time is the median over its requests. Where a bucket holds a configuration
without speculation (k = 0) and one with (or two different k), the cost of one draft token there is fitted as in
:mod:`specproxy.analysis.advise.model`: ``step(k) = step(0) * (1 + c * k)``. Beyond the compute knee c grows with the
batch, which is why the best k falls as load rises.

Per workload, the predicted speedup of each k in a bucket is ``E(k) / (1 + c * k)`` with the workload's conditional
acceptance (acceptance does not depend on the batch; the cost does). The server's schedule picks, per bucket, the k
best for the traffic mix (each workload weighted by its share of decode time), merges neighbouring buckets with the
same k into ranges, and writes it as vLLM's dynamic speculative decoding takes it. One k for engines without a
schedule: the best over the buckets, weighted by the decode time the records spent in each (the load they saw).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from specproxy.analysis.advise.model import TOLERANCE, config_k, fit_cost
from specproxy.analysis.figures.acceptance import conditional_rates, expected_tokens_per_step
from specproxy.analysis.figures.confidence import Interval, bootstrap_many
from specproxy.analysis.figures.groups import group_records
from specproxy.analysis.figures.inflight import decode_in_flight
from specproxy.analysis.figures.records import generates, is_ok
from specproxy.analysis.sweep.model import level_of
from specproxy.core.figures import step_s
from specproxy.core.record import Record
from specproxy.core.stats import median

MIN_BUCKETS = 2  # batch sizes with a fitted cost needed to speak of k per batch size
MIN_REQUESTS_PER_POINT = 3


def bucket_of(batch: float) -> int:
    return max(0, round(math.log2(max(batch, 1.0))))


def bucket_range(b: int) -> tuple[int, int]:
    """Whole batch sizes that fall in bucket ``b``: 1, 2, 3-5, 6-11, 12-22, 23-45, ..."""
    lo = 1 if b == 0 else math.floor(2 ** (b - 0.5)) + 1
    hi = math.floor(2 ** (b + 0.5))
    return lo, max(lo, hi)


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One configuration's decode steps in one batch bucket."""

    label: str
    k: int
    batch: float  # mean decode in-flight of its requests
    requests: int
    step_s: float  # median over requests of each request's median inter-step gap
    samples: tuple[float, ...]  # the per-request step times (for intervals)


@dataclass(frozen=True, slots=True)
class BucketCost:
    bucket: int
    lo: int
    hi: int
    batch: float  # mean decode in-flight over the bucket's requests
    decode_share: float  # share of all decode time spent at this batch size
    base_step_s: float | None
    draft_cost: float | None  # c: one draft token's cost as a fraction of a base step here; None: not fitted
    draft_cost_ci: Interval | None
    points: tuple[StepPoint, ...]


@dataclass(frozen=True, slots=True)
class KRange:
    lo: int
    hi: int
    k: int
    speedup: float  # predicted, of that k over none, at the range's measured batch sizes (the worst of them)


@dataclass(frozen=True, slots=True)
class BatchAdvice:
    buckets: tuple[BucketCost, ...]
    per_workload: Mapping[str, tuple[KRange, ...]]
    schedule: tuple[KRange, ...]  # for the traffic mix
    single_k: int | None  # for engines that take one k
    enough: bool
    reason: str  # why there is no per-batch answer, or "" when there is
    single_k_basis: str = ""  # how the loads were weighed for single_k


def _request_step_s(rec: Record) -> float | None:
    """The request's mean decode step: its decode span over its steps. The mean, not the median: chunks that a busy
    client (or server) reads late arrive in bunches, which skews single gaps both ways but not their sum."""
    steps = step_s(rec["chunks"])
    return sum(steps) / len(steps) if steps else None


def step_points(records: Sequence[Record]) -> dict[int, list[StepPoint]]:
    """Per bucket, one point per configuration (label) with enough requests there."""
    out: dict[int, list[StepPoint]] = {}
    for (label,), recs in group_records([r for r in records if generates(r)], ("label",)).items():
        k = config_k(recs)
        flight = decode_in_flight(recs)  # the whole configuration's traffic, failures included
        per: dict[int, list[tuple[float, float]]] = {}
        for r in recs:
            b, s = flight.get(r["request_id"]), _request_step_s(r) if is_ok(r) and r["chunks_are_steps"] else None
            if b is not None and s is not None and s > 0:
                per.setdefault(bucket_of(b), []).append((b, s))
        for bucket, xs in per.items():
            if len(xs) >= MIN_REQUESTS_PER_POINT:
                steps = [s for _, s in xs]
                m = median(steps)
                assert m is not None
                point = StepPoint(label, k, sum(b for b, _ in xs) / len(xs), len(xs), m, tuple(steps))
                out.setdefault(bucket, []).append(point)
    return out


def _fit(points: Sequence[StepPoint], steps: Sequence[Sequence[float]] | None = None) -> tuple[float, float] | None:
    meds = [median(s) for s in steps] if steps is not None else [p.step_s for p in points]
    pts = [(p.k, m) for p, m in zip(points, meds, strict=True) if m is not None]
    return fit_cost(pts)


def bucket_costs(records: Sequence[Record]) -> tuple[BucketCost, ...]:
    points = step_points(records)
    decode_time: dict[int, float] = {}
    for recs in group_records([r for r in records if generates(r)], ("label",)).values():
        flight = decode_in_flight(recs)
        for r in recs:
            b = flight.get(r["request_id"])
            if b is not None and r["e2e_s"] is not None and r["ttft_s"] is not None:
                decode_time[bucket_of(b)] = decode_time.get(bucket_of(b), 0.0) + r["e2e_s"] - r["ttft_s"]
    total = sum(decode_time.values()) or 1.0
    out: list[BucketCost] = []
    for bucket in sorted(points):
        pts = points[bucket]
        fitted = _fit(pts)
        ci: Interval | None = None
        if fitted is not None:
            got = bootstrap_many([p.samples for p in pts], _cost_of(pts))
            ci = got[0] if got else None
        lo, hi = bucket_range(bucket)
        n = sum(p.requests for p in pts)
        out.append(
            BucketCost(
                bucket=bucket,
                lo=lo,
                hi=hi,
                batch=sum(p.batch * p.requests for p in pts) / n,
                decode_share=decode_time.get(bucket, 0.0) / total,
                base_step_s=fitted[0] if fitted else None,
                draft_cost=fitted[1] if fitted else None,
                draft_cost_ci=ci,
                points=tuple(sorted(pts, key=lambda p: p.k)),
            )
        )
    return tuple(out)


def _cost_of(points: Sequence[StepPoint]) -> Callable[[list[list[float]]], list[float | None]]:
    def stat(draw: list[list[float]]) -> list[float | None]:
        fitted = _fit(points, draw)
        return [fitted[1] if fitted else None]

    return stat


def best_k(conds: Sequence[tuple[float, Sequence[float]]], c: float, max_k: int) -> tuple[int, float]:
    """(k, predicted speedup) best for a mix of (weight, conditional acceptance); the smallest k within
    :data:`TOLERANCE` of the best, 0 when nothing beats no speculation."""
    total = sum(w for w, _ in conds) or 1.0

    def speedup(k: int) -> float:
        e = sum(w * expected_tokens_per_step(cond, k) for w, cond in conds) / total
        return e / (1.0 + c * k)

    table = [(k, speedup(k)) for k in range(max_k + 1)]
    best = max(s for _, s in table)
    if best <= 1.0:
        return 0, 1.0
    return next((k, s) for k, s in table if s >= best * (1.0 - TOLERANCE))


def _ranges(buckets: Sequence[BucketCost], picks: Sequence[tuple[int, float]]) -> tuple[KRange, ...]:
    out: list[KRange] = []
    for b, (k, s) in zip(buckets, picks, strict=True):
        if out and out[-1].k == k and out[-1].hi + 1 >= b.lo:
            out[-1] = KRange(out[-1].lo, b.hi, k, min(out[-1].speedup, s))
        else:
            out.append(KRange(b.lo, b.hi, k, s))
    return tuple(out)


def build_batch_advice(records: Sequence[Record], max_k: int = 8) -> BatchAdvice:
    buckets = bucket_costs(records)
    fitted = tuple(b for b in buckets if b.draft_cost is not None)
    recs = [r for r in records if generates(r)]
    by_workload = group_records(recs, ("workload",))
    conds: dict[str, tuple[float, tuple[float, ...]]] = {}
    for (w,), grp in by_workload.items():
        cond = conditional_rates(grp)
        decode = sum((r["e2e_s"] or 0.0) - (r["ttft_s"] or 0.0) for r in grp if r["ttft_s"] is not None)
        if cond:
            conds[w] = (decode, cond)
    if len(fitted) < MIN_BUCKETS or not conds:
        seen = ", ".join(f"{b.lo}-{b.hi}" if b.lo != b.hi else str(b.lo) for b in buckets) or "none"
        reason = (
            "no speculative decoding in the records: acceptance is unknown"
            if not conds
            else f"the draft cost could be measured at {len(fitted)} batch size(s) (requests in flight seen: {seen}); "
            f"k per batch size needs at least {MIN_BUCKETS}, each with a configuration without speculation (or a "
            "second k) measured at that load: sweep one (specproxy sweep --baseline), or record both at several loads"
        )
        return BatchAdvice(buckets, {}, (), None, False, reason)
    per_workload = {
        w: _ranges(fitted, [best_k([(1.0, cond)], b.draft_cost or 0.0, max_k) for b in fitted])
        for w, (_, cond) in conds.items()
    }
    mix = list(conds.values())
    schedule = _ranges(fitted, [best_k(mix, b.draft_cost or 0.0, max_k) for b in fitted])
    # one k for every load: the best mean speedup over the batch sizes seen, each weighted by the decode time spent
    # there (the load a recording saw), or all alike for a sweep, whose levels are its own choice, not the traffic's
    swept = all(level_of(r) is not None for r in recs)
    weights = [1.0 if swept else max(b.decode_share, 1e-9) for b in fitted]
    score = {
        k: sum(w * _mix_speedup(mix, b.draft_cost or 0.0, k) for w, b in zip(weights, fitted, strict=True))
        / sum(weights)
        for k in range(max_k + 1)
    }
    best = max(score.values())
    single = 0 if best <= 1.0 else min(k for k, s in score.items() if s >= best * (1.0 - TOLERANCE))
    basis = "the batch sizes swept weighed alike" if swept else "weighed by the decode time spent at each"
    return BatchAdvice(buckets, per_workload, schedule, single, True, "", basis)


def _mix_speedup(mix: Sequence[tuple[float, Sequence[float]]], c: float, k: int) -> float:
    total = sum(w for w, _ in mix) or 1.0
    return sum(w * expected_tokens_per_step(cond, k) for w, cond in mix) / total / (1.0 + c * k)


def vllm_schedule(schedule: Sequence[KRange], max_num_seqs: int = 256) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: ``[[start_bs, end_bs, k], ...]`` (dynamic speculative
    decoding, docs.vllm.ai features/speculative_decoding/dynamic_speculative_decoding). The last range is extended
    to ``max_num_seqs``: batches beyond the data keep the last measured k."""
    rows = [[r.lo, r.hi, r.k] for r in schedule]
    if rows and rows[-1][1] < max_num_seqs:
        rows[-1][1] = max_num_seqs
    return rows


def disable_by_batch_size(schedule: Sequence[KRange]) -> int | None:
    """vLLM's ``disable_by_batch_size`` (speculation off for new requests once more than this many are running),
    when the schedule speculates at small batches and stops for good from some batch size; else None."""
    if len(schedule) < 2 or schedule[-1].k != 0:
        return None
    i = len(schedule) - 1
    while i > 0 and schedule[i - 1].k == 0:
        i -= 1
    return schedule[i].lo - 1 if i > 0 else None
