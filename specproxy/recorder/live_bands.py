"""The check after deployment of a speculation schedule: per range of requests in flight (a band), what ran (draft
tokens per step) and how it went (acceptance, step time, decode throughput), from the live window.

vLLM can vary k with the batch (``num_speculative_tokens_per_batch_size``: dynamic speculative decoding) or adapt it
on its own. Two failures show only under live load, and only per batch size:

- **speculation losing in a band**: at large batches verifying drafts costs compute that is no longer spare; the
  band's acceptance predicts less than one step's worth of gain, or the whole server's decode throughput *falls*
  from one band to the next larger one (a collapse at the schedule's threshold, as reported in vllm#49548);
- **a schedule with no effect**: the band drafts what the schedule says it should not (k where it says 0, more than
  its k), or nothing where it says k (vllm#51510). The proxy is given the schedule (``--speculative-config``, the
  JSON given to ``vllm serve``) to compare against.

A request's band is its decode in-flight (:mod:`specproxy.analysis.figures.inflight`: the mean requests in flight,
itself included, from its first token to its end), in the batch buckets of ``sweep``'s k per batch size (1, 2,
3-5, 6-11, 12-22, ...). vLLM looks its schedule up by the requests it schedules in each step; the requests the
proxy sees in flight include those queued, so near a range's edge a request's band and its steps' k can differ.

Pure: records in, bands out.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from specproxy.analysis.advise.model import DEFAULT_DRAFT_COST
from specproxy.analysis.figures.acceptance import conditional_rates, expected_tokens_per_step
from specproxy.analysis.figures.confidence import acceptance_interval
from specproxy.analysis.figures.inflight import decode_in_flight
from specproxy.analysis.figures.records import generates, is_ok
from specproxy.analysis.sweep.batchcost import bucket_of, bucket_range
from specproxy.core.figures import acceptance_rate, token_span
from specproxy.core.record import Record
from specproxy.core.stats import median

MIN_REQUESTS = 5  # a band speaks from this many requests on
COLLAPSE = 0.10  # the server's decode tok/s falling by more than this from one band to the next larger: a collapse
# A band the schedule gives k = 0 may show this share of drafting steps and no more: its requests' decode also spans
# moments of fewer requests in flight (a wave's tail runs alone), where the schedule drafts
DRAFTING_OFF = 0.25
MIN_DRAFT_TOKENS = 200  # a band's acceptance says speculation loses from this many draft tokens on
LOSING_BELOW = 0.98  # ... when it predicts less than this speedup
# Flags that say the record's chunks are not one engine step each (docs/records.md)
NOT_STEPS = frozenset(
    {
        "chunks_not_steps_engine",
        "stream_interval_suspected",
        "several_choices",
        "chunks_fewer_than_steps",
        "steps_unmerged",
    }
)
OVER_K = 0.25  # draft tokens per drafting step above the schedule's k by more than this: more than it allows


@dataclass(frozen=True, slots=True)
class Schedule:
    """What the engine was told: its k and, for dynamic speculative decoding, k per range of batch sizes."""

    k: int
    ranges: tuple[tuple[int, int, int], ...] = ()  # (first batch size, last batch size, k), sorted
    disable_above: int | None = None  # older vLLM's disable_by_batch_size: no speculation past this many

    def k_at(self, batch: int) -> int:
        """The k vLLM uses at ``batch`` requests in a step: the range holding it, else the last range before it
        (vLLM carries a range's k over a gap and past the last range); never above the configured k."""
        if self.disable_above is not None and batch > self.disable_above:
            return 0
        k = self.k
        for lo, _hi, rk in self.ranges:
            if lo > batch:
                break
            k = min(self.k, rk)
        return k

    def describe(self) -> str:
        if self.ranges:
            return ", ".join(
                f"{lo}-{hi}: k={min(self.k, k)}" if hi > lo else f"{lo}: k={min(self.k, k)}"
                for lo, hi, k in self.ranges
            )
        if self.disable_above is not None:
            return f"k={self.k} up to {self.disable_above} requests, none above"
        return f"k={self.k} at every batch size"


def parse_schedule(text: str) -> Schedule:
    """The JSON given to ``vllm serve --speculative-config`` (``num_speculative_tokens``, optionally
    ``num_speculative_tokens_per_batch_size`` or ``disable_by_batch_size``), or the schedule's list alone
    (``[[1, 5, 3], [6, 11, 1], [12, 256, 0]]``). ValueError with a one-line reason."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    if isinstance(doc, list):
        doc = {"num_speculative_tokens_per_batch_size": doc}
    if not isinstance(doc, dict):
        raise ValueError("want a JSON object (vLLM's --speculative-config) or a list of [first, last, k]")
    raw = doc.get("num_speculative_tokens_per_batch_size")
    ranges: list[tuple[int, int, int]] = []
    if raw is not None:
        if not isinstance(raw, list) or not raw:
            raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list of [first, last, k]")
        for entry in raw:
            if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, int) for x in entry)):
                raise ValueError(f"each range is [first batch size, last batch size, k] in integers, got {entry!r}")
            lo, hi, k = entry
            if lo <= 0 or hi < lo or k < 0:
                raise ValueError(f"range {entry!r}: want 1 <= first <= last and k >= 0")
            ranges.append((lo, hi, k))
        ranges.sort()
        if ranges[0][0] != 1:
            raise ValueError("the first range must start at batch size 1 (vLLM asks the same)")
        if any(b[0] <= a[1] for a, b in itertools.pairwise(ranges)):
            raise ValueError("the ranges overlap")
    k = doc.get("num_speculative_tokens", max((r[2] for r in ranges), default=None))
    if not isinstance(k, int) or k < 1:
        raise ValueError("num_speculative_tokens must be an integer >= 1")
    disable = doc.get("disable_by_batch_size")
    if disable is not None and (not isinstance(disable, int) or disable < 1):
        raise ValueError("disable_by_batch_size must be an integer >= 1")
    return Schedule(k, tuple(ranges), disable)


@dataclass(frozen=True, slots=True)
class Band:
    lo: int
    hi: int
    requests: int
    in_flight: float  # mean decode in-flight of its requests
    draft_k: float | None  # draft tokens per drafting step: the k that ran (None: nothing drafted)
    drafting_share: float | None  # drafting steps per decode step (None: steps not known)
    acceptance_rate: float | None
    acceptance_ci: tuple[float, float] | None
    step_s: float | None  # median over its requests of each one's mean decode step
    decode_tok_s: float | None  # median per-request decode tok/s
    server_tok_s: float | None  # the server's decode throughput at this band: in_flight x decode_tok_s
    speedup: float | None  # predicted for the k that ran, over none, from the band's acceptance (advise's cost)
    expected_k: int | None  # the schedule's k here, when the proxy was given one
    losing: bool
    schedule_mismatch: bool | None  # None without a schedule
    why: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.lo}-{self.hi}" if self.hi > self.lo else str(self.lo)


def _steps_seen(rec: Record) -> bool:
    """Whether each token-bearing chunk was one engine step. Closer than ``chunks_are_steps``, which also asks for
    exact token counts per chunk: a stream whose usage came only at its end (its chunk counts scaled) still has one
    event per step."""
    return bool(rec["stream"]) and not NOT_STEPS.intersection(rec["flags"])


# what the bands read of a record (decode_in_flight, is_ok, generates, the acceptance pools, the band's figures), and
# of its speculative figures: a point keeps these only, since a whole record (spans, estimates, timings, flags) per
# point would make a full window cost many times the memory.
BAND_FIELDS = (
    "request_id",
    "started_at",
    "ttft_s",
    "e2e_s",
    "outcome",
    "completion_tokens",
    "path",
    "decode_tok_s",
    "spec",
)
BAND_SPEC_FIELDS = ("source", "drafts", "draft_tokens", "accepted", "per_position")


@dataclass(frozen=True, slots=True)
class Point:
    """One request as the bands need it: :data:`BAND_FIELDS` of its record, and what its chunks said."""

    rec: Record
    step_s: float | None
    decode_steps: int | None  # token chunks after the first, when they are steps


def point_of(rec: Record) -> Point:
    """What the bands keep of a record: the fields they read, so that a point costs the same (a few hundred bytes)
    whatever the prompt, the answer and the record's other figures."""
    light: dict[str, Any] = {f: rec[f] for f in BAND_FIELDS}  # type: ignore[literal-required]
    if (spec := rec["spec"]) is not None:
        light["spec"] = {f: spec[f] for f in BAND_SPEC_FIELDS}  # type: ignore[literal-required]
    thin = cast(Record, light)
    if not _steps_seen(rec):
        return Point(thin, None, None)
    steps = sum(1 for _, n in rec["chunks"] if n > 0) - 1
    if steps <= 0:
        return Point(thin, None, None)
    return Point(thin, token_span(rec["chunks"]) / steps, steps)  # its mean decode step: decode span over steps


def compute_bands(points: Sequence[Point], schedule: Schedule | None = None) -> list[Band]:
    """The window's bands with enough requests, smallest batch first."""
    records = [p.rec for p in points]
    flight = decode_in_flight(records)  # every request of the window counts in the batch, failures too
    per: dict[int, list[tuple[float, Point]]] = {}
    for p in points:
        b = flight.get(p.rec["request_id"])
        if b is not None and is_ok(p.rec) and generates(p.rec):
            per.setdefault(bucket_of(b), []).append((b, p))
    bands: list[Band] = []
    for bucket in sorted(per):
        xs = per[bucket]
        if len(xs) >= MIN_REQUESTS:
            bands.append(_band(bucket, xs, schedule))
    return _with_collapse(bands)


def _band(bucket: int, xs: list[tuple[float, Point]], schedule: Schedule | None) -> Band:
    lo, hi = bucket_range(bucket)
    in_flight = sum(b for b, _ in xs) / len(xs)
    recs = [p.rec for _, p in xs]
    specs = [s for r in recs if (s := r["spec"]) is not None and s["source"] is not None]
    drafts = sum(s["drafts"] or 0 for s in specs)
    draft_tokens = sum(s["draft_tokens"] or 0 for s in specs)
    accepted = sum(s["accepted"] or 0 for s in specs)
    known = [(p, s) for (_, p), r in zip(xs, recs, strict=True) if p.decode_steps and (s := r["spec"]) is not None]
    steps = sum(p.decode_steps or 0 for p, _ in known)
    share = sum(s["drafts"] or 0 for _, s in known) / steps if steps else None
    draft_k = draft_tokens / drafts if drafts else None
    rate = acceptance_rate(accepted, draft_tokens)
    ci = acceptance_interval(recs) if draft_tokens else None
    step_s = median([p.step_s for _, p in xs if p.step_s is not None])
    tok_s = median([v for r in recs if (v := r["decode_tok_s"]) is not None and v > 0])
    speedup = None
    if draft_k and rate is not None:
        k = max(1, round(draft_k))
        gain = expected_tokens_per_step(conditional_rates(recs), k)
        steps_per_decode = share if share is not None else 1.0  # steps without drafts cost and gain nothing more
        speedup = (1 + steps_per_decode * (gain - 1)) / (1 + steps_per_decode * DEFAULT_DRAFT_COST * k)
    why: list[str] = []
    losing = speedup is not None and speedup < LOSING_BELOW and draft_tokens >= MIN_DRAFT_TOKENS
    if losing:
        why.append(f"acceptance {rate:.0%} at k={draft_k:.1f} predicts {speedup:.2f}x: drafts cost more than they gain")
    expected = mismatch = None
    if schedule is not None:
        # the schedule's k over the band's requests: the k at their rounded in-flight, most common first
        ks = [schedule.k_at(max(1, round(b))) for b, _ in xs]
        expected = max(set(ks), key=ks.count)
        mismatch = _mismatch(expected, draft_k, share)
        if mismatch:
            if draft_k is None:
                ran = "nothing drafted"
            elif expected == 0 and share is not None:
                ran = f"drafts on {share:.0%} of its decode steps"
            else:
                ran = f"{draft_k:.1f} draft tokens per drafting step"
            why.append(f"the schedule says k={expected} here, the engine ran {ran}: the schedule has no effect")
    return Band(
        lo=lo,
        hi=hi,
        requests=len(xs),
        in_flight=in_flight,
        draft_k=draft_k,
        drafting_share=share,
        acceptance_rate=rate,
        acceptance_ci=(ci.lo, ci.hi) if ci is not None else None,
        step_s=step_s,
        decode_tok_s=tok_s,
        server_tok_s=in_flight * tok_s if tok_s is not None else None,
        speedup=speedup,
        expected_k=expected,
        losing=losing,
        schedule_mismatch=mismatch,
        why=tuple(why),
    )


def _mismatch(expected: int, draft_k: float | None, share: float | None) -> bool | None:
    if expected == 0:
        if draft_k is None:
            return False
        return None if share is None else share > DRAFTING_OFF  # steps unknown: drafts at the edges, or not?
    if draft_k is None:
        return True  # a k that should run drafted nothing
    return draft_k > expected + OVER_K  # fewer can be right (ngram proposes 1..k), more never


def _with_collapse(bands: list[Band]) -> list[Band]:
    """A band whose server decode throughput is below the next smaller band's by more than :data:`COLLAPSE`: more
    requests in flight gave less throughput."""
    out = list(bands)
    for i in range(1, len(bands)):
        a, b = bands[i - 1], bands[i]
        if a.server_tok_s and b.server_tok_s is not None and b.server_tok_s < (1 - COLLAPSE) * a.server_tok_s:
            msg = (
                f"the server decodes {b.server_tok_s:.0f} tok/s at {b.label} requests in flight against "
                f"{a.server_tok_s:.0f} at {a.label}: throughput falls as the batch grows"
            )
            out[i] = replace(b, losing=True, why=(*b.why, msg))
    return out


def band_json(b: Band) -> dict[str, Any]:
    return {
        "band": b.label,
        "lo": b.lo,
        "hi": b.hi,
        "requests": b.requests,
        "in_flight": round(b.in_flight, 2),
        "draft_k": _r(b.draft_k),
        "drafting_share": _r(b.drafting_share),
        "acceptance_rate": _r(b.acceptance_rate),
        "acceptance_ci": [round(x, 4) for x in b.acceptance_ci] if b.acceptance_ci else None,
        "step_ms": _r(b.step_s * 1000 if b.step_s is not None else None),
        "decode_tok_s": _r(b.decode_tok_s),
        "server_decode_tok_s": _r(b.server_tok_s),
        "speedup": _r(b.speedup),
        "expected_k": b.expected_k,
        "losing": b.losing,
        "schedule_mismatch": b.schedule_mismatch,
        "why": list(b.why),
    }


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None
