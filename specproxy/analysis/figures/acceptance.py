"""Pooling speculative-decoding figures over many records: acceptance, per-position rates, tokens per step, and the
reconciliation of per-request estimates against the engine's counters.

Pooling follows vLLM's own definitions (vllm/v1/spec_decode/metrics.py): acceptance rate = sum accepted / sum draft
tokens, mean acceptance length = 1 + sum accepted / sum drafts, per-position rate = sum accepted at i / sum drafts.
Summing first and dividing once weights every draft equally; averaging per-request rates would let a 3-token answer
weigh as much as a 3000-token one. Pure: records in, numbers out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specproxy.attribution.choice import UNSETTLED_FLAG
from specproxy.attribution.counts import SpecCounts
from specproxy.core.record import Record

# what a record flagged counters_unsettled holds in place of its acceptance, and what to do about it: one wording for
# report, compare and advise
UNSETTLED_MEANING = (
    "the counters' share of overlapping requests, from a per-workload model (ngram's drafts hidden in one-token "
    "steps, or the accepted tokens of inexact counts) that too few scrape intervals had pinned down, or that rested "
    "on chunks the engine merged from several steps (flag "
    f"{UNSETTLED_FLAG}): the run's totals are the engine's, but each workload's acceptance may be several points "
    "off; more requests settle it, or the engine's own per-request figures (vLLM: --per-request-spec-decode-metrics)"
)


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """Per-request estimates (server, else chunks) against the counters' attribution, over the same requests."""

    requests: int
    per_request: SpecCounts
    counters: SpecCounts

    @staticmethod
    def _gap(ours: float, counters: float) -> float | None:
        return None if ours <= 0 else (counters - ours) / ours * 100.0

    @property
    def accepted_gap_pct(self) -> float | None:
        """(counters - per-request) / per-request in percent: positive when the counters saw more."""
        return self._gap(self.per_request.accepted, self.counters.accepted)

    @property
    def draft_tokens_gap_pct(self) -> float | None:
        return self._gap(self.per_request.draft_tokens, self.counters.draft_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class Acceptance(SpecCounts):
    """Pooled speculative figures of a set of records: the summed counts (and their rates), with what the records
    said about them. Counts are floats: counter attribution shares deltas."""

    spec_requests: int
    sources: Mapping[str, int]
    tokens_per_step: Mapping[int, int]
    reconciliation: Reconciliation | None
    k: int | None
    unsettled: int = 0  # records whose counters share rested on a model too few intervals had pinned down


def _tokens_per_step_from_chunks(rec: Record) -> Counter[int]:
    # Only for records without a spec block (e.g. a run without speculation): every decode step after the
    # prefill chunk, when chunks are steps.
    hist: Counter[int] = Counter()
    if rec["chunks_are_steps"]:
        steps = [n for _, n in rec["chunks"] if n > 0]
        hist.update(steps[1:])
    return hist


class AcceptancePool:
    """:func:`pool_acceptance` one record at a time: what a streaming reader feeds, in bounded memory. Records read
    without their chunk timeline give the tokens-per-step histogram of their chunks through :meth:`add_steps`."""

    def __init__(self) -> None:
        # plain floats and a list, summed in record order: the same figures as adding SpecCounts, without an object
        # per record
        self.accepted = self.drafts = self.draft_tokens = 0.0
        self.per_position: list[float] = []
        self.sources: Counter[str] = Counter()
        self.hist: Counter[int] = Counter()
        self.ks: Counter[int] = Counter()
        self.spec_requests = 0
        self.unsettled = 0
        self.rec_n = 0
        # accepted, drafts, draft tokens of the records with both a per-request figure and the counters' (the
        # reconciliation reads no per-position counts)
        self.rec_ours = [0.0, 0.0, 0.0]
        self.rec_counters = [0.0, 0.0, 0.0]

    def add(self, rec: Record) -> None:
        spec = rec["spec"]
        if spec is None:
            if rec["chunks"]:
                self.hist.update(_tokens_per_step_from_chunks(rec))
            return
        self.spec_requests += 1
        source = spec["source"]
        self.sources[source if source is not None else "none"] += 1
        if UNSETTLED_FLAG in rec["flags"]:
            self.unsettled += 1
        self.accepted += spec["accepted"] or 0.0
        self.drafts += spec["drafts"] or 0.0
        self.draft_tokens += spec["draft_tokens"] or 0.0
        pp = self.per_position
        for i, a in enumerate(spec["per_position"]):
            if i < len(pp):
                pp[i] += a
            else:
                pp.append(0.0 + a)
        k = spec["k"]
        if k is not None and k > 0:
            self.ks[int(k)] += 1
        hist = self.hist
        for key, n in spec["tokens_per_step"].items():
            hist[int(key)] += n
        est = spec["estimates"]
        ours = est["server"] if est["server"] is not None else est["chunks"]
        counters = est["counters"]
        # Only records that had a figure to report: a run without speculation has empty estimates.
        if source is not None and ours is not None and counters is not None:
            self.rec_n += 1
            for sums, block in ((self.rec_ours, ours), (self.rec_counters, counters)):
                sums[0] += block["accepted"] or 0.0
                sums[1] += block["drafts"] or 0.0
                sums[2] += block["draft_tokens"] or 0.0

    def add_steps(self, sizes: Mapping[int, int]) -> None:
        """Decode steps (tokens per step -> steps) of records without a spec block whose chunks are steps."""
        self.hist.update(sizes)

    def result(self) -> Acceptance:
        return Acceptance(
            spec_requests=self.spec_requests,
            accepted=self.accepted,
            drafts=self.drafts,
            draft_tokens=self.draft_tokens,
            per_position=tuple(self.per_position),
            sources=dict(self.sources),
            tokens_per_step=dict(sorted(self.hist.items())),
            reconciliation=Reconciliation(self.rec_n, _counts(self.rec_ours), _counts(self.rec_counters))
            if self.rec_n
            else None,
            k=self.ks.most_common(1)[0][0] if self.ks else None,
            unsettled=self.unsettled,
        )


def _counts(sums: list[float]) -> SpecCounts:
    return SpecCounts(accepted=sums[0], drafts=sums[1], draft_tokens=sums[2])


def pool_acceptance(records: Iterable[Record]) -> Acceptance:
    pool = AcceptancePool()
    for rec in records:
        pool.add(rec)
    return pool.result()


class ConditionalPool:
    """:func:`conditional_rates` one record at a time."""

    def __init__(self) -> None:
        self.numer: list[float] = []
        self.denom: list[float] = []

    def add(self, rec: Record) -> None:
        spec = rec["spec"]
        if spec is None:
            return
        drafts = spec["drafts"] or 0.0
        pp = spec["per_position"]
        if drafts <= 0:
            return
        for i, a in enumerate(pp):
            if i == len(self.numer):
                self.numer.append(0.0)
                self.denom.append(0.0)
            self.numer[i] += a
            self.denom[i] += drafts if i == 0 else pp[i - 1]

    def result(self) -> tuple[float, ...]:
        out: list[float] = []
        for a, d in zip(self.numer, self.denom, strict=True):
            if d <= 0:
                break  # nothing reached this position: the curve ends here
            out.append(min(1.0, a / d))
        return tuple(out)


def conditional_rates(records: Iterable[Record]) -> tuple[float, ...]:
    """Conditional acceptance per position: p_0 = accepted_0 / drafts, p_i = accepted_i / accepted_(i-1).

    Each position pools only the records that drafted that deep, so runs with different k can be pooled: a k=1 run
    says nothing about position 1 and must not dilute it.
    """
    pool = ConditionalPool()
    for rec in records:
        pool.add(rec)
    return pool.result()


def expected_tokens_per_step(conditional: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j=1..k} prod_{i<j} p_i; positions beyond the list repeat its last rate."""
    if k <= 0 or not conditional:
        return 1.0
    total, survive = 1.0, 1.0
    for j in range(k):
        survive *= conditional[min(j, len(conditional) - 1)]
        total += survive
    return total
