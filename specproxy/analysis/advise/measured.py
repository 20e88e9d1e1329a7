"""What ``advise`` measured, beside what it predicts: per workload and configuration (and sweep level, when the
records come from a sweep), the decode tok/s, the measured speedup over the baseline run with its 95% interval
(paired by request where the runs sent the same requests), acceptance with its interval, and, with an SLO, the share
of requests meeting it and goodput; and the advice held to those measurements (:func:`with_measurements`). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from specproxy.analysis.advise.model import TOLERANCE, Advice, MeasuredK, WorkloadAdvice, config_k
from specproxy.analysis.compare.model import choose_baseline
from specproxy.analysis.figures.acceptance import pool_acceptance
from specproxy.analysis.figures.confidence import Interval, acceptance_interval, speedup_verdict
from specproxy.analysis.figures.records import generates, is_ok, request_tok_s, values
from specproxy.analysis.figures.slo import Goodput, SloSpec, goodput
from specproxy.analysis.sweep.model import level_of, speedup_interval
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
                acceptance_ci=acceptance_interval(grp),
                goodput=goodput(grp, slo) if slo is not None else None,
            )
        )
    return tuple(rows)


def with_measurements(advice: Advice, rows: Sequence[MeasuredRow]) -> Advice:
    """The advice with each workload's measured k beside its prediction, and the recommendation held to them.

    Where a k was run, its measured speedup is what it gives. Where a prediction's 95% interval does not meet a
    measured k's, the model is off for that workload (its step cost, or acceptance that the runs did not share): the
    note says so, and the recommendation comes from the measured configurations alone, the smallest k whose
    measured speedup is distinguishably faster and within :data:`TOLERANCE` of the best such, or 0 when none is.
    Where every prediction agrees, the recommendation weighs the measured speedups in place of the predicted ones.
    Sweep levels are left out: a prediction is for one load, and the rows of a sweep are several."""
    return replace(advice, workloads=tuple(_held(w, rows) for w in advice.workloads))


def _overlap(guess: float, guess_ci: Interval | None, ci: Interval) -> bool:
    """Whether a prediction agrees with a measurement: their intervals overlap (the point, without its own)."""
    lo, hi = (guess, guess) if guess_ci is None else (guess_ci.lo, guess_ci.hi)
    eps = 1e-9 * max(abs(hi), abs(ci.hi), 1.0)  # the same figure reached by two sums may differ in its last bit
    return lo <= ci.hi + eps and ci.lo <= hi + eps


def _held(w: WorkloadAdvice, rows: Sequence[MeasuredRow]) -> WorkloadAdvice:
    runs = {
        r.k: r
        for r in rows
        if r.workload == w.workload and not r.is_baseline and not r.level and r.speedup is not None and r.k > 0
    }
    plain_baseline = any(r.workload == w.workload and r.is_baseline and r.k == 0 and not r.level for r in rows)
    if not runs or not w.predictions or not plain_baseline:  # predictions are over no speculation: so must it be
        return w
    predicted = {p.k: p.speedup for p in w.predictions}
    guess_ci = {p.k: p.speedup_ci for p in w.predictions}
    measured: list[MeasuredK] = []
    notes = list(w.notes)
    for k, r in sorted(runs.items()):
        assert r.speedup is not None
        ci = r.speedup_ci
        guess = predicted.get(k)
        agrees = guess is None or ci is None or _overlap(guess, guess_ci.get(k), ci)
        measured.append(MeasuredK(k, r.speedup, ci, r.verdict, agrees))
        if not agrees and ci is not None and guess is not None:
            notes.append(
                f"k = {k}: predicted {guess:.2f}x, measured {r.speedup:.2f}x [95% CI {ci.lo:.2f}-{ci.hi:.2f}x]: "
                "the prediction is off, the measurement stands"
            )
    if all(m.agrees for m in measured):
        speedups = {**predicted, **{m.k: m.speedup for m in measured}}
        best = max(speedups.values())
        rec = 0 if best <= 1.0 else min(k for k, v in speedups.items() if v >= best * (1.0 - TOLERANCE))
        return replace(w, measured=tuple(measured), recommended_k=rec, notes=tuple(notes))
    faster = [m for m in measured if m.verdict == "faster"]
    if faster:
        best = max(m.speedup for m in faster)
        rec = min(m.k for m in faster if m.speedup >= best * (1.0 - TOLERANCE))
        notes.append(f"recommended from the measured configurations alone: k = {rec} was measured {best:.2f}x")
    else:
        rec = 0
        notes.append(
            "recommended from the measured configurations alone: none was distinguishably faster than the baseline"
        )
    return replace(w, measured=tuple(measured), recommended_k=rec, notes=tuple(notes), recommended_from="measurement")
