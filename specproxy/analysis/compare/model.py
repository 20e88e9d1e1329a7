"""The comparison table the published measurements use: per workload, configuration | tok/s | speedup vs baseline |
acceptance, with medians over repeats and the spread; plus paired per-request speedups when runs replayed one
recording or sent the same requests.

A configuration is a record's ``label``. The baseline is the label asked for, else the first label whose records
show no speculation (no spec block, or no drafts), else the first label given. Speedup is the ratio of medians.
Paired speedups match the same request in both runs (:mod:`..figures.pairing`: the same workload and body, as
``matrix`` and ``run`` with one seed send them; else ``replay_of``), and each row says how it was paired. Pure:
records in, rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specproxy.analysis.figures.acceptance import Acceptance, AcceptancePool, pool_acceptance
from specproxy.analysis.figures.confidence import (
    MAX_SAMPLES,
    Interval,
    median_of_ratios,
    pooled_ratio,
    ratio_of_medians,
    speedup_verdict,
)
from specproxy.analysis.figures.pairing import BY_BODY, BY_REPLAY, body_key, replay_key
from specproxy.analysis.figures.records import generates, is_ok, key_value
from specproxy.analysis.figures.sample import KeySample, Reservoir
from specproxy.analysis.figures.sketch import EXACT_LIMIT, RELATIVE_ERROR
from specproxy.analysis.figures.slo import FigureSpec, Goodput, SloSpec
from specproxy.analysis.inputs.scan import ChunkBatch, Item, item_of
from specproxy.analysis.report.accum import GroupAcc
from specproxy.analysis.report.model import Figure, GroupReport
from specproxy.core.record import Record
from specproxy.core.stats import median, percentile

METRICS = ("decode", "output")
_FIGURE_OF = {"decode": "decode_tok_s_p50", "output": "output_tok_s"}


@dataclass(frozen=True, slots=True)
class Paired:
    """Per-request speedups (this label's decode tok/s over the baseline's) for requests present in both."""

    pairs: int
    median: float | None
    p10: float | None
    p90: float | None


@dataclass(frozen=True, slots=True)
class CompareRow:
    workload: str
    label: str
    requests: int
    errors: int
    tok_s: Figure
    spread_kind: str  # "repeats" (min-max over repeats) or "requests" (p10-p90 over requests)
    spread_lo: float | None
    spread_hi: float | None
    speedup: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    is_baseline: bool
    paired: Paired | None
    paired_by: str | None = None  # how the pairs were matched: pairing.BY_BODY or BY_REPLAY
    goodput: Goodput | None = None  # with an SLO: attainment, good requests and tokens per second (medians)
    speedup_ci: Interval | None = None  # 95% bootstrap interval (decode metric; paired when requests pair up)
    acceptance_ci: Interval | None = None
    engine: str | None = None  # the engine(s) the records name (vllm, sglang, ollama, llamacpp), comma-separated
    unsettled: int = 0  # records whose acceptance is a counters share from a model not yet pinned down

    @property
    def verdict(self) -> str:
        return "baseline" if self.is_baseline else speedup_verdict(self.speedup, self.speedup_ci)


@dataclass(frozen=True, slots=True)
class Comparison:
    metric: str
    baseline: str
    baseline_reason: str
    labels: tuple[str, ...]
    rows: tuple[CompareRow, ...]
    notes: tuple[str, ...] = ()


def speculates(records: Iterable[Record]) -> bool:
    """Whether any record shows speculative decoding (drafts or draft tokens, or a configured k)."""
    return _speculates(pool_acceptance(records))


def _speculates(acc: Acceptance) -> bool:
    return acc.drafts > 0 or acc.draft_tokens > 0 or (acc.k or 0) > 0


def choose_baseline(by_label: Mapping[str, Acceptance], asked: str | None) -> tuple[str, str]:
    """(label, why) from each label's pooled acceptance. Raises ValueError when the label asked for is not there."""
    labels = list(by_label)
    if asked is not None:
        if asked not in by_label:
            raise ValueError(f"baseline label {asked!r} is not in the runs; labels: {', '.join(labels)}")
        return asked, "given with --baseline"
    for label in labels:
        if not _speculates(by_label[label]):
            return label, "the configuration without speculative decoding"
    return labels[0], "the first configuration given (none ran without speculation)"


class _Cell:
    """One workload and label: the report group, and the per-request values the intervals and pairs need."""

    def __init__(self, spec: FigureSpec) -> None:
        self.group = GroupAcc(spec)
        self.rates: Reservoir[float] = Reservoir(MAX_SAMPLES)
        self.pairs: Reservoir[tuple[float, float]] = Reservoir(MAX_SAMPLES)
        self.by_body = KeySample()  # the same request (pairing.body_key)
        self.by_replay = KeySample()  # replay_of (pairing.replay_key): runs that captured no bodies

    def add(self, item: Item, batch: ChunkBatch) -> None:
        self.group.add(item, batch)
        rec = item.rec
        v = item.tok_s
        if is_ok(rec) and v is not None:
            self.rates.add(v)
            if v > 0:
                if (key := body_key(rec)) is not None:
                    self.by_body.add(key, v)
                self.by_replay.add(replay_key(rec), v)
        spec = rec["spec"]
        if spec is not None and spec["source"] is not None:
            self.pairs.add((spec["accepted"] or 0.0, spec["draft_tokens"] or 0.0))

    @property
    def sampled(self) -> bool:
        return self.by_body.sampled or self.by_replay.sampled


def _medians(sample: KeySample) -> dict[str, float]:
    """Median decode tok/s per matched request (several repeats of one request collapse to their median)."""
    return {k: m for k, vs in sample.values.items() if (m := median(vs)) is not None}


def _ratios(base: _Cell, other: _Cell) -> tuple[list[float], str | None]:
    """Per-request speedups of the requests both ran, and how they were paired (:mod:`..figures.pairing`)."""
    for how, b, mine in (
        (BY_BODY, _medians(base.by_body), _medians(other.by_body)),
        (BY_REPLAY, _medians(base.by_replay), _medians(other.by_replay)),
    ):
        common = mine.keys() & b.keys()
        if common:
            return [mine[k] / b[k] for k in common], how
    return [], None


def _paired(ratios: Sequence[float]) -> Paired | None:
    if not ratios:
        return None
    return Paired(len(ratios), median(ratios), percentile(ratios, 10), percentile(ratios, 90))


def _speedup_ci(metric: str, base: _Cell, mine: _Cell, ratios: Sequence[float]) -> Interval | None:
    if metric != "decode":
        return None  # aggregate output tok/s is one number per run: no requests to resample
    if len(ratios) >= 2:
        return median_of_ratios(ratios)
    return ratio_of_medians(base.rates.items, mine.rates.items)


class ComparisonBuilder:
    """Feed items (:meth:`add`), flush the batch, then :meth:`build`."""

    def __init__(self, slo: SloSpec | None = None) -> None:
        self.spec = FigureSpec(slo=slo)
        self.cells: dict[tuple[str, str], _Cell] = {}
        self.labels: dict[str, AcceptancePool] = {}
        self.engines: dict[tuple[str, str], set[str]] = {}

    def add(self, item: Item, batch: ChunkBatch) -> None:
        rec = item.rec
        # Generation requests only: a proxy also records a client's /v1/models or /health calls, which have no tok/s
        if not generates(rec):
            return
        label = key_value(rec, "label")
        pool = self.labels.get(label)
        if pool is None:
            pool = self.labels[label] = AcceptancePool()
        pool.add(rec)
        key = (key_value(rec, "workload"), label)
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = _Cell(self.spec)
        cell.add(item, batch)
        if engine := rec.get("engine"):
            self.engines.setdefault(key, set()).add(engine)

    def build(self, baseline: str | None = None, metric: str = "decode") -> Comparison:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        if not self.labels:
            raise ValueError("no generation requests to compare (only /v1/models, /health or the like)")
        base_label, reason = choose_baseline({k: p.result() for k, p in self.labels.items()}, baseline)
        order = {lab: i for i, lab in enumerate(self.labels)}
        workloads: dict[str, int] = {}
        for w, _ in self.cells:
            workloads.setdefault(w, len(workloads))
        keys = sorted(self.cells, key=lambda k: (workloads[k[0]], order[k[1]]))
        reports = {k: self.cells[k].group.report((("workload", k[0]), ("label", k[1]))) for k in keys}
        base_fig = {w: g.figure(_FIGURE_OF[metric]) for (w, lab), g in reports.items() if lab == base_label}
        rows = [self._row(k, reports[k], base_label, base_fig.get(k[0]), metric) for k in keys]
        notes: list[str] = []
        if not all(c.group.quantile_info()[1] for c in self.cells.values()):
            notes.append(
                f"medians and spreads of groups with over {EXACT_LIMIT:,} values are from a DDSketch: within "
                f"{RELATIVE_ERROR:.1%}"
            )
        if sampled := sum(1 for c in self.cells.values() if c.sampled):
            notes.append(f"paired speedups of {sampled} configurations come from a sample of requests chosen by hash")
        if any(c.rates.sampled or c.pairs.sampled for c in self.cells.values()):
            notes.append(f"intervals resample a uniform sample of {MAX_SAMPLES:,} requests per configuration")
        return Comparison(metric, base_label, reason, tuple(self.labels), tuple(rows), tuple(notes))

    def _row(
        self, key: tuple[str, str], g: GroupReport, base_label: str, base: float | None, metric: str
    ) -> CompareRow:
        workload, label = key
        cell = self.cells[key]
        fig = g.figures[_FIGURE_OF[metric]]
        if g.repeats > 1:
            kind, lo, hi = "repeats", fig.min, fig.max
        elif metric == "decode":
            rates = cell.group.merged().tok_s
            kind, lo, hi = "requests", rates.percentile(10), rates.percentile(90)
        else:
            kind, lo, hi = "none", None, None
        is_base = label == base_label
        paired = speedup_ci = paired_by = None
        base_cell = self.cells.get((workload, base_label))
        if not is_base and base_cell is not None:
            ratios, paired_by = _ratios(base_cell, cell)
            paired = _paired(ratios)
            speedup_ci = _speedup_ci(metric, base_cell, cell, ratios if paired is not None else ())
        pairs = cell.pairs.items
        return CompareRow(
            workload=workload,
            label=label,
            requests=g.requests,
            errors=g.errors,
            tok_s=fig,
            spread_kind=kind,
            spread_lo=lo,
            spread_hi=hi,
            speedup=fig.value / base if fig.value is not None and base else None,
            acceptance_rate=g.acceptance.acceptance_rate,
            mean_acceptance_length=g.acceptance.mean_acceptance_length,
            is_baseline=is_base,
            paired=paired,
            paired_by=paired_by,
            goodput=Goodput(g.figure("slo_attainment"), g.figure("goodput_req_s"), g.figure("goodput_tok_s"))
            if self.spec.slo is not None
            else None,
            speedup_ci=speedup_ci,
            acceptance_ci=pooled_ratio(pairs) if any(d for _, d in pairs) else None,
            unsettled=g.acceptance.unsettled,
            engine=", ".join(sorted(self.engines.get(key, ()))) or None,
        )


def build_comparison(
    records: Iterable[Record], baseline: str | None = None, metric: str = "decode", slo: SloSpec | None = None
) -> Comparison:
    """Rows per workload and label. ``metric``: ``decode`` (median per-request decode tok/s, the published figure) or
    ``output`` (aggregate output tokens per second of wall time). ``slo``: add each row's attainment and goodput."""
    builder = ComparisonBuilder(slo)
    batch = ChunkBatch()
    for rec in records:
        builder.add(item_of(rec), batch)
    batch.flush()
    return builder.build(baseline, metric)
