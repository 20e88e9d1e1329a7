"""A sweep's figures: per configuration, load level and workload, the throughput, goodput, acceptance and speedup
over the baseline at the same level, each with its interval; and the crossover, the level at which a speculative
configuration stops beating the baseline. Pure: records in, figures out.

A sweep's records carry their level in ``run_id``: ``<sweep id>@c8`` (closed loop, 8 streams) or ``<sweep id>@r2.5``
(open loop, that many requests a second). Every configuration replays the same plan at each level, so a request pairs
with the baseline's request of the same body (the n-th of that body, for repeats); the speedup's interval is then
paired.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from specproxy.analysis.compare.model import choose_baseline
from specproxy.analysis.figures.acceptance import pool_acceptance
from specproxy.analysis.figures.confidence import (
    Interval,
    acceptance_interval,
    bootstrap_many,
    ratio_of_medians,
    speedup_verdict,
)
from specproxy.analysis.figures.groups import group_records
from specproxy.analysis.figures.inflight import decode_in_flight
from specproxy.analysis.figures.pairing import body_key
from specproxy.analysis.figures.records import generates, is_ok, output_tok_s, request_tok_s, values
from specproxy.analysis.figures.slo import Goodput, SloSpec, goodput
from specproxy.core.record import Record
from specproxy.core.stats import median

_LEVEL = re.compile(r"@(c|r)([0-9]+(?:\.[0-9]+)?)$")
KINDS = {"c": "concurrency", "r": "rate"}
ALL = "(all)"


def level_tag(kind: str, value: float) -> str:
    """``c8`` or ``r2.5``: the suffix a sweep puts after ``@`` in its records' run_id."""
    return ("c" if kind == "concurrency" else "r") + f"{value:g}"


def level_of(rec: Record) -> tuple[str, float] | None:
    m = _LEVEL.search(rec["run_id"] or "")
    return (KINDS[m.group(1)], float(m.group(2))) if m else None


@dataclass(frozen=True, slots=True)
class LevelRow:
    label: str
    workload: str  # or ALL
    level: float
    requests: int
    errors: int
    in_flight: float | None  # mean decode in-flight (the batch the engine ran)
    decode_tok_s: float | None  # median per-request decode tok/s
    output_tok_s: float | None  # this workload's completion tokens per second of the level's span
    goodput: Goodput | None
    acceptance_rate: float | None
    acceptance_ci: Interval | None
    mean_acceptance_length: float | None
    speedup: float | None  # median decode tok/s over the baseline's at the same level and workload
    speedup_ci: Interval | None
    paired: int  # requests paired with the baseline's

    @property
    def verdict(self) -> str:
        return speedup_verdict(self.speedup, self.speedup_ci)


@dataclass(frozen=True, slots=True)
class Crossover:
    label: str
    workload: str
    beats_up_to: float | None  # the highest level before the first one where it no longer beats the baseline
    stops_at: float | None  # the first level with speedup <= 1 (None: beats it at every level measured)
    row_at_stop: LevelRow | None

    def describe(self, kind: str, baseline: str) -> str:
        unit = "streams" if kind == "concurrency" else "req/s"
        if self.stops_at is None:
            return f"{self.label} beats {baseline} at every level measured"
        if self.beats_up_to is None:
            return f"{self.label} never beats {baseline} (from {self.stops_at:g} {unit} on)"
        r = self.row_at_stop
        how = f" ({r.speedup:.2f}x, {r.verdict})" if r is not None and r.speedup is not None else ""
        return f"{self.label} beats {baseline} up to {self.beats_up_to:g} {unit}; stops at {self.stops_at:g}{how}"


@dataclass(frozen=True, slots=True)
class SweepResult:
    kind: str
    levels: tuple[float, ...]
    baseline: str
    baseline_reason: str
    labels: tuple[str, ...]
    workloads: tuple[str, ...]
    rows: tuple[LevelRow, ...]
    crossovers: tuple[Crossover, ...]
    slo: SloSpec | None

    def row(self, label: str, workload: str, level: float) -> LevelRow | None:
        return next((r for r in self.rows if (r.label, r.workload, r.level) == (label, workload, level)), None)


def request_key(rec: Record, seen: dict[str, int]) -> str | None:
    """The same request in another configuration's run (:func:`specproxy.analysis.figures.pairing.body_key`), and which
    repeat of that body."""
    key = body_key(rec)
    if key is None:
        return None
    n = seen.get(key, 0)
    seen[key] = n + 1
    return f"{key}:{n}"


def _rates(records: Iterable[Record]) -> dict[str, float]:
    seen: dict[str, int] = {}
    out: dict[str, float] = {}
    for r in sorted(records, key=lambda r: r["started_at"] or 0.0):
        key = request_key(r, seen)
        v = request_tok_s(r) if is_ok(r) else None
        if key is not None and v is not None and v > 0:
            out[key] = v
    return out


def speedup_interval(base: Sequence[Record], mine: Sequence[Record]) -> tuple[Interval | None, int]:
    """The 95% interval of the speedup (median decode tok/s over the baseline's). When at least half of the requests
    pair up (the same request sent to both), the pairs are resampled together and the ratio of medians computed on
    each resample; otherwise each side is resampled on its own."""
    b, m = _rates(base), _rates(mine)
    common = sorted(b.keys() & m.keys())
    if len(common) >= 2 and 2 * len(common) >= min(len(b), len(m)):
        pairs = [(b[k], m[k]) for k in common]
        cis = bootstrap_many([pairs], _paired_ratio)
        return (cis[0] if cis else None), len(common)
    rates = [values([r for r in grp if is_ok(r)], request_tok_s) for grp in (base, mine)]
    return ratio_of_medians(rates[0], rates[1]), 0


def _paired_ratio(draw: list[list[tuple[float, float]]]) -> list[float | None]:
    mb, mm = median([x for x, _ in draw[0]]), median([y for _, y in draw[0]])
    return [mm / mb if mb and mm is not None else None]


def _row(
    label: str, workload: str, level: float, recs: Sequence[Record], flight: dict[str, float], slo: SloSpec | None
) -> LevelRow:
    ok = [r for r in recs if is_ok(r)]
    acc = pool_acceptance(recs)
    fl = [flight[r["request_id"]] for r in recs if r["request_id"] in flight]
    return LevelRow(
        label=label,
        workload=workload,
        level=level,
        requests=len(recs),
        errors=len(recs) - len(ok),
        in_flight=sum(fl) / len(fl) if fl else None,
        decode_tok_s=median(values(ok, request_tok_s)),
        output_tok_s=None,  # filled in by the caller, which knows the level's span
        goodput=goodput(recs, slo) if slo is not None else None,
        acceptance_rate=acc.acceptance_rate,
        acceptance_ci=acceptance_interval(recs),
        mean_acceptance_length=acc.mean_acceptance_length,
        speedup=None,
        speedup_ci=None,
        paired=0,
    )


def build_sweep(records: Iterable[Record], baseline: str | None = None, slo: SloSpec | None = None) -> SweepResult:
    """Raises ValueError when the records hold no sweep levels, or the baseline label is not in them."""
    tagged = [(r, tag) for r in records if generates(r) and (tag := level_of(r)) is not None]
    if not tagged:
        raise ValueError("no sweep records (their run_id ends in @cN or @rX): record them with `specproxy sweep`")
    kinds = {tag[0] for _, tag in tagged}
    if len(kinds) > 1:
        raise ValueError("the records mix concurrency and rate sweeps: analyse them separately")
    kind = kinds.pop()
    by_label = group_records([r for r, _ in tagged], ("label",))
    base, reason = choose_baseline({k[0]: pool_acceptance(v) for k, v in by_label.items()}, baseline)
    level = {r["request_id"]: tag[1] for r, tag in tagged}
    groups: dict[tuple[str, str, float], list[Record]] = {}
    rows: list[LevelRow] = []
    for (label,), recs in by_label.items():
        flight = decode_in_flight(recs)  # levels run one after another: they never overlap in time
        mine: dict[tuple[str, float], list[Record]] = {}
        for r in recs:
            lv = level[r["request_id"]]
            mine.setdefault((r["workload"], lv), []).append(r)
            mine.setdefault((ALL, lv), []).append(r)
        for (w, lv), grp in mine.items():
            groups[(label, w, lv)] = grp
            rows.append(_with_output(_row(label, w, lv, grp, flight, slo), grp, mine[(ALL, lv)]))
    rows = [r if r.label == base else _with_speedup(r, groups, base) for r in rows]
    levels = tuple(sorted({lv for _, _, lv in groups}))
    workloads = (*sorted({w for _, w, _ in groups if w != ALL}), ALL)
    labels = tuple(k[0] for k in by_label)
    rows.sort(key=lambda r: (workloads.index(r.workload), r.level, labels.index(r.label)))
    result = SweepResult(kind, levels, base, reason, labels, workloads, tuple(rows), (), slo)
    cross = tuple(crossover(result, label, w) for w in workloads for label in labels if label != base)
    return replace(result, crossovers=cross)


def _with_output(row: LevelRow, grp: Sequence[Record], level_recs: Sequence[Record]) -> LevelRow:
    """This workload's tokens over the span of the whole level (all workloads), so workloads add up."""
    span_tok = output_tok_s(level_recs)
    all_tokens = sum(r["completion_tokens"] or 0 for r in level_recs)
    mine = sum(r["completion_tokens"] or 0 for r in grp)
    out = span_tok * mine / all_tokens if span_tok is not None and all_tokens else None
    return replace(row, output_tok_s=out, goodput=_rescale_goodput(row.goodput, grp, level_recs))


def _rescale_goodput(gp: Goodput | None, grp: Sequence[Record], level_recs: Sequence[Record]) -> Goodput | None:
    # goodput() divides by the group's own span; a workload's share of a level runs over the level's span
    if gp is None or gp.requests_per_s is None:
        return gp
    spans = [(s, s + e) for r in level_recs if (s := r["started_at"]) is not None and (e := r["e2e_s"]) is not None]
    own = [(s, s + e) for r in grp if (s := r["started_at"]) is not None and (e := r["e2e_s"]) is not None]
    if not spans or not own:
        return gp
    full = max(b for _, b in spans) - min(a for a, _ in spans)
    part = max(b for _, b in own) - min(a for a, _ in own)
    f = part / full if full > 0 else 1.0
    return Goodput(gp.attainment, gp.requests_per_s * f, (gp.tokens_per_s or 0.0) * f)


def _with_speedup(row: LevelRow, groups: dict[tuple[str, str, float], list[Record]], base: str) -> LevelRow:
    base_grp = groups.get((base, row.workload, row.level))
    mine = groups.get((row.label, row.workload, row.level))
    if not base_grp or not mine:
        return row
    ok_b = median(values([r for r in base_grp if is_ok(r)], request_tok_s))
    sp = row.decode_tok_s / ok_b if row.decode_tok_s is not None and ok_b else None
    ci, paired = speedup_interval(base_grp, mine)
    return replace(row, speedup=sp, speedup_ci=ci, paired=paired)


def crossover(result: SweepResult, label: str, workload: str) -> Crossover:
    """The first level at which ``label`` no longer beats the baseline (speedup <= 1), scanning upwards."""
    prev: float | None = None
    for lv in result.levels:
        row = result.row(label, workload, lv)
        if row is None or row.speedup is None:
            continue
        if row.speedup <= 1.0:
            return Crossover(label, workload, prev, lv, row)
        prev = lv
    return Crossover(label, workload, prev, None, None)
