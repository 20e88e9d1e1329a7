"""What ``advise`` measured, beside what it predicts: per workload and configuration (and sweep level, when the
records come from a sweep), the decode tok/s, the measured speedup over the baseline run with its 95% interval
(paired by request where the runs sent the same requests), acceptance with its interval, and, with an SLO, the share
of requests meeting it and goodput. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specproxy.analysis.acceptance import pool_acceptance
from specproxy.analysis.advise import acceptance_ci, config_k
from specproxy.analysis.aggregate import generates, is_ok, request_tok_s, values
from specproxy.analysis.compare import choose_baseline
from specproxy.analysis.confidence import Interval, speedup_verdict
from specproxy.analysis.slo import Goodput, SloSpec, goodput
from specproxy.analysis.sweep import level_of, speedup_interval
from specproxy.core.record import Record
from specproxy.core.stats import median


@dataclass(frozen=True, slots=True)
class MeasuredRow:
    workload: str
    label: str
    level: str  # "" outside a sweep, else e.g. "c8"
    k: int
    requests: int
    decode_tok_s: float | None
    is_baseline: bool
    speedup: float | None
    speedup_ci: Interval | None
    paired: int
    acceptance_rate: float | None
    acceptance_ci: Interval | None
    goodput: Goodput | None

    @property
    def verdict(self) -> str:
        return "baseline" if self.is_baseline else speedup_verdict(self.speedup, self.speedup_ci)


def _level(rec: Record) -> str:
    lv = level_of(rec)
    return "" if lv is None else ("c" if lv[0] == "concurrency" else "r") + f"{lv[1]:g}"


def _load(tag: str) -> float:
    return float(tag[1:]) if tag else 0.0


def measured_rows(
    records: Sequence[Record], baseline_records: Sequence[Record] = (), slo: SloSpec | None = None
) -> tuple[MeasuredRow, ...]:
    recs = [r for r in (*baseline_records, *records) if generates(r)]
    labels: dict[str, list[Record]] = {}
    for r in recs:
        labels.setdefault(r["label"] or "-", []).append(r)
    if not labels:
        return ()
    base_recs = [r for r in baseline_records if generates(r)]
    pools = {k: pool_acceptance(v) for k, v in labels.items()}
    base = (base_recs[0]["label"] or "-") if base_recs else choose_baseline(pools, None)[0]
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in recs:
        groups.setdefault((r["workload"], r["label"] or "-", _level(r)), []).append(r)
    ks = {label: config_k(grp) for label, grp in labels.items()}
    rows: list[MeasuredRow] = []
    for (w, label, lv), grp in sorted(groups.items(), key=lambda kv: (kv[0][0], _load(kv[0][2]), ks[kv[0][1]])):
        ok = [r for r in grp if is_ok(r)]
        tok = median(values(ok, request_tok_s))
        ref = groups.get((w, base, lv))
        sp = ci = None
        paired = 0
        if label != base and ref:
            ref_tok = median(values([r for r in ref if is_ok(r)], request_tok_s))
            sp = tok / ref_tok if tok is not None and ref_tok else None
            ci, paired = speedup_interval(ref, grp)
        acc = pool_acceptance(grp)
        rows.append(
            MeasuredRow(
                workload=w,
                label=label,
                level=lv,
                k=ks[label],
                requests=len(grp),
                decode_tok_s=tok,
                is_baseline=label == base,
                speedup=sp,
                speedup_ci=ci,
                paired=paired,
                acceptance_rate=acc.acceptance_rate,
                acceptance_ci=acceptance_ci(grp),
                goodput=goodput(grp, slo) if slo is not None else None,
            )
        )
    return tuple(rows)
