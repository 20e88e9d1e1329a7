"""What ``specproxy advise`` needs of the runs, gathered in one streaming pass; the decisions stay in
:mod:`specproxy.analysis.advise.model`.

Per configuration (label): the inter-step gaps of its finished requests (a :class:`Quantiles`, for the median the
cost fit uses) and its pooled acceptance (for its k). Per workload: pooled and conditional acceptance and the counts
behind the warnings. Generation requests only. Records already in memory (``matrix``, ``demo``) go through the same
pass (:func:`build_advice`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from specproxy.analysis.advise.model import (
    DEFAULT_MAX_K,
    Advice,
    WorkloadStats,
    advise_from,
    cost_model,
    k_of,
    timed_step_s,
)
from specproxy.analysis.figures.acceptance import AcceptancePool, ConditionalPool
from specproxy.analysis.figures.confidence import MAX_SAMPLES
from specproxy.analysis.figures.records import generates, is_ok, key_value
from specproxy.analysis.figures.sketch import Quantiles
from specproxy.analysis.inputs.scan import ChunkBatch, Item, item_of
from specproxy.core.record import Record

# Whole records kept for the tables that need them (measured speedups per load, the draft cost per batch size): a
# bounded number, the first ones read, and the output says when there were more.
MAX_DETAIL_RECORDS = 50_000


@dataclass
class _Label:
    steps: Quantiles = field(default_factory=Quantiles)  # inter-step gaps of chunks
    timed: Quantiles = field(default_factory=Quantiles)  # step times from the engine's figures (advise.timed_step_s)
    ok: int = 0
    pool: AcceptancePool = field(default_factory=AcceptancePool)

    def step_s(self) -> float | None:
        """A configuration's median step time: timed (:func:`specproxy.analysis.advise.model.timed_step_s`) where most
        of its finished requests allow it, else the median inter-step gap of their chunks."""
        if len(self.timed) and 2 * len(self.timed) >= self.ok:
            return self.timed.percentile(50.0)
        return self.steps.percentile(50.0)

    def gap_targets(self) -> tuple[Quantiles, Quantiles | None]:
        return self.steps, None


@dataclass
class _Workload:
    pool: AcceptancePool = field(default_factory=AcceptancePool)
    cond: ConditionalPool = field(default_factory=ConditionalPool)
    stats: WorkloadStats = field(default_factory=WorkloadStats)
    sample: list[Record] = field(default_factory=list)  # a uniform sample of its records (no chunks): intervals
    seen: int = 0


class AdviseInput:
    """Feed the runs' items (:meth:`add`), and the baseline runs' with ``baseline=True``; flush the batch; then
    :meth:`advice`."""

    def __init__(
        self, only: tuple[str, ...] = (), *, sample: int | None = MAX_SAMPLES, details: int = MAX_DETAIL_RECORDS
    ) -> None:
        self.sample_size = sample  # records per workload kept for intervals; None: every one
        self.max_details = details
        self.only = frozenset(only)  # only these workloads (the runs' other records are left out entirely)
        self.seen: dict[str, None] = {}  # every workload of the runs, in order
        self.labels: dict[str, _Label] = {}
        self.baseline: dict[str, _Label] = {}
        self.workloads: dict[str, _Workload] = {}
        self.details: list[Record] = []  # whole records, up to MAX_DETAIL_RECORDS
        self.baseline_details: list[Record] = []
        self.details_dropped = 0
        self._rng = random.Random(0)

    def add(self, item: Item, batch: ChunkBatch, *, baseline: bool = False) -> None:
        rec = item.rec
        if not baseline:
            self.seen[rec["workload"]] = None
            if self.only and rec["workload"] not in self.only:
                return
        if not generates(rec):
            return
        labels = self.baseline if baseline else self.labels
        name = key_value(rec, "label")
        lab = labels.get(name)
        if lab is None:
            lab = labels[name] = _Label()
        if not baseline:
            lab.pool.add(rec)
            wl = self.workloads.get(rec["workload"])
            if wl is None:
                wl = self.workloads[rec["workload"]] = _Workload()
            wl.pool.add(rec)
            wl.cond.add(rec)
            wl.stats.add(rec)
            self._sample(wl, rec)
        details = self.baseline_details if baseline else self.details
        if len(self.details) + len(self.baseline_details) < self.max_details:
            details.append(item.full())
        else:
            self.details_dropped += 1
        if is_ok(rec):
            lab.ok += 1
            if (t := timed_step_s(rec)) is not None:
                lab.timed.add(t)
            batch.add(item.seg, [lab])

    def _sample(self, wl: _Workload, rec: Record) -> None:
        """Reservoir sampling (algorithm R): every record read has the same chance to be in the sample."""
        wl.seen += 1
        light = replace_chunks(rec)
        if self.sample_size is None or len(wl.sample) < self.sample_size:
            wl.sample.append(light)
        else:
            j = self._rng.randrange(wl.seen)
            if j < self.sample_size:
                wl.sample[j] = light

    def points(self) -> list[tuple[int, float]]:
        """(k, median step time) per configuration; a baseline run is k = 0 whatever its records say."""
        out: list[tuple[int, float]] = []
        for labels, is_base in ((self.labels, False), (self.baseline, True)):
            for lab in labels.values():
                m = lab.step_s()
                if m is not None and m > 0:
                    out.append((0 if is_base else k_of(lab.pool.result()), m))
        return out

    def advice(
        self,
        *,
        draft_cost: float | None = None,
        base_step_s: float | None = None,
        max_k: int = DEFAULT_MAX_K,
        lowest_load: tuple[float, float] | None = None,
    ) -> Advice:
        """``lowest_load``: (draft cost, base step) measured at the lowest batch size of records that span several
        (:mod:`specproxy.analysis.sweep.batchcost`): used instead of a fit that would pool steps of different batch
        sizes."""
        if draft_cost is None and lowest_load is not None:
            cost = replace(cost_model(self.points(), *lowest_load), source="lowest load")
        else:
            cost = cost_model(self.points(), draft_cost, base_step_s)
        return Advice(
            cost=cost,
            workloads=tuple(
                advise_from(w, wl.stats, wl.pool.result(), wl.cond.result(), cost, max_k, wl.sample)
                for w, wl in self.workloads.items()
            ),
        )


def build_advice(
    records: Iterable[Record],
    baseline_records: Iterable[Record] = (),
    *,
    draft_cost: float | None = None,
    base_step_s: float | None = None,
    max_k: int = DEFAULT_MAX_K,
    lowest_load: tuple[float, float] | None = None,
) -> Advice:
    """The advice of records already in memory: the pass ``advise`` makes over files, every record kept for the
    intervals. A baseline run is k = 0 whatever its records say: it is the reference step time."""
    gather = AdviseInput(sample=None, details=0)
    batch = ChunkBatch()
    for rec in records:
        gather.add(item_of(rec), batch)
    for rec in baseline_records:
        gather.add(item_of(rec), batch, baseline=True)
    batch.flush()
    return gather.advice(draft_cost=draft_cost, base_step_s=base_step_s, max_k=max_k, lowest_load=lowest_load)


def replace_chunks(rec: Record) -> Record:
    """The record without its chunk list (a sample for intervals needs its spec block, not its timeline)."""
    light = Record(**rec)
    light["chunks"] = []
    return light
