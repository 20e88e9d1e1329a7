"""The comparison table the published measurements use: per workload, configuration | tok/s | speedup vs baseline |
acceptance, with medians over repeats and the spread; plus paired per-request speedups when runs replayed one
recording.

A configuration is a record's ``label``. The baseline is the label asked for, else the first label whose records
show no speculation (no spec block, or no drafts), else the first label given. Speedup is the ratio of medians.
Paired speedups match a request by ``replay_of`` (or, for the original recording, its own ``request_id``), so a
replay lines up with the request it re-sent and with other replays of it. Pure: records in, rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specproxy.analysis.acceptance import pool_acceptance
from specproxy.analysis.aggregate import (
    Figure,
    generates,
    group_records,
    is_ok,
    request_tok_s,
    summarize_group,
    values,
)
from specproxy.analysis.confidence import Interval, median_of_ratios, pooled_ratio, ratio_of_medians, speedup_verdict
from specproxy.analysis.slo import FigureSpec, Goodput, SloSpec
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
    goodput: Goodput | None = None  # with an SLO: attainment, good requests and tokens per second (medians)
    speedup_ci: Interval | None = None  # 95% bootstrap interval (decode metric; paired when requests pair up)
    acceptance_ci: Interval | None = None
    engine: str | None = None  # the engine(s) the records name (vllm, sglang, ollama, llamacpp), comma-separated

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


def speculates(records: Iterable[Record]) -> bool:
    """Whether any record shows speculative decoding (drafts or draft tokens, or a configured k)."""
    acc = pool_acceptance(records)
    return acc.drafts > 0 or acc.draft_tokens > 0 or (acc.k or 0) > 0


def choose_baseline(by_label: dict[str, list[Record]], asked: str | None) -> tuple[str, str]:
    """(label, why). Raises ValueError when the label asked for is not in the runs."""
    labels = list(by_label)
    if asked is not None:
        if asked not in by_label:
            raise ValueError(f"baseline label {asked!r} is not in the runs; labels: {', '.join(labels)}")
        return asked, "given with --baseline"
    for label in labels:
        if not speculates(by_label[label]):
            return label, "the configuration without speculative decoding"
    return labels[0], "the first configuration given (none ran without speculation)"


def _match_key(rec: Record) -> str:
    replay_of = rec["replay_of"]
    return replay_of if replay_of is not None else rec["request_id"]


def _rates_by_request(records: Iterable[Record]) -> dict[str, float]:
    """Median decode tok/s per matched request (several repeats of one request collapse to their median)."""
    per: dict[str, list[float]] = {}
    for rec in records:
        if is_ok(rec) and (v := request_tok_s(rec)) is not None and v > 0:
            per.setdefault(_match_key(rec), []).append(v)
    return {k: m for k, vs in per.items() if (m := median(vs)) is not None}


def _ratios(baseline: Iterable[Record], other: Iterable[Record]) -> list[float]:
    base = _rates_by_request(baseline)
    mine = _rates_by_request(other)
    return [mine[k] / base[k] for k in mine.keys() & base.keys()]


def paired_speedups(baseline: Iterable[Record], other: Iterable[Record]) -> Paired | None:
    ratios = _ratios(baseline, other)
    if not ratios:
        return None
    return Paired(len(ratios), median(ratios), percentile(ratios, 10), percentile(ratios, 90))


def _speedup_ci(metric: str, base: Sequence[Record], mine: Sequence[Record], paired: Paired | None) -> Interval | None:
    if metric != "decode":
        return None  # aggregate output tok/s is one number per run: no requests to resample
    if paired is not None and paired.pairs >= 2:
        return median_of_ratios(_ratios(base, mine))
    rates = [values([r for r in grp if is_ok(r)], request_tok_s) for grp in (base, mine)]
    return ratio_of_medians(rates[0], rates[1])


def _acceptance_ci(grp: Sequence[Record]) -> Interval | None:
    pairs = [
        (spec["accepted"] or 0.0, spec["draft_tokens"] or 0.0)
        for r in grp
        if (spec := r["spec"]) is not None and spec["source"] is not None
    ]
    return pooled_ratio(pairs) if any(d for _, d in pairs) else None


def build_comparison(
    records: Iterable[Record], baseline: str | None = None, metric: str = "decode", slo: SloSpec | None = None
) -> Comparison:
    """Rows per workload and label. ``metric``: ``decode`` (median per-request decode tok/s, the published figure) or
    ``output`` (aggregate output tokens per second of wall time). ``slo``: add each row's attainment and goodput."""
    spec = FigureSpec(slo=slo)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    # Generation requests only: a proxy also records a client's /v1/models or /health calls, which have no tok/s
    recs = [r for r in records if generates(r)]
    by_label = group_records(recs, ("label",))
    if not by_label:
        raise ValueError("no generation requests to compare (only /v1/models, /health or the like)")
    base_label, reason = choose_baseline({k[0]: v for k, v in by_label.items()}, baseline)
    groups = group_records(recs, ("workload", "label"))
    base_fig: dict[str, float | None] = {}
    for (workload, label), grp in groups.items():
        if label == base_label:
            base_fig[workload] = summarize_group((), grp).figure(_FIGURE_OF[metric])
    rows: list[CompareRow] = []
    for (workload, label), grp in groups.items():
        g = summarize_group((("workload", workload), ("label", label)), grp, spec)
        fig = g.figures[_FIGURE_OF[metric]]
        if g.repeats > 1:
            kind, lo, hi = "repeats", fig.min, fig.max
        elif metric == "decode":
            rates = values([r for r in grp if is_ok(r)], request_tok_s)
            kind, lo, hi = "requests", percentile(rates, 10), percentile(rates, 90)
        else:
            kind, lo, hi = "none", None, None
        base = base_fig.get(workload)
        is_base = label == base_label
        paired = None
        speedup_ci = None
        if not is_base and (workload, base_label) in groups:
            paired = paired_speedups(groups[(workload, base_label)], grp)
            speedup_ci = _speedup_ci(metric, groups[(workload, base_label)], grp, paired)
        rows.append(
            CompareRow(
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
                goodput=Goodput(g.figure("slo_attainment"), g.figure("goodput_req_s"), g.figure("goodput_tok_s"))
                if slo is not None
                else None,
                speedup_ci=speedup_ci,
                acceptance_ci=_acceptance_ci(grp),
                engine=", ".join(sorted({e for r in grp if (e := r["engine"])})) or None,
            )
        )
    return Comparison(
        metric=metric,
        baseline=base_label,
        baseline_reason=reason,
        labels=tuple(k[0] for k in by_label),
        rows=tuple(rows),
    )
