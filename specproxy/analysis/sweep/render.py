"""A sweep as tables (text, markdown) and JSON, with its answer first: which k, up to which load, how sure. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from specproxy.analysis.figures.confidence import LEVEL, Interval
from specproxy.analysis.report.render import JSON_VERSION
from specproxy.analysis.sweep.batchcost import BatchAdvice, KRange, disable_by_batch_size, vllm_schedule
from specproxy.analysis.sweep.model import ALL, LevelRow, SweepResult
from specproxy.analysis.tables import Table, fmt, fmt_pct, fmt_x


def ci_x(ci: Interval | None) -> str:
    return "-" if ci is None else f"{ci.lo:.2f}-{ci.hi:.2f}"


def ci_pct(ci: Interval | None) -> str:
    return "-" if ci is None else f"{ci.lo * 100:.1f}-{ci.hi * 100:.1f}%"


def ci_json(ci: Interval | None) -> dict[str, float] | None:
    return None if ci is None else {"lo": ci.lo, "hi": ci.hi, "level": LEVEL}


def _unit(kind: str) -> str:
    return "streams" if kind == "concurrency" else "req/s"


def sweep_tables(s: SweepResult) -> list[Table]:
    slo = s.slo is not None
    tables: list[Table] = []
    for w in s.workloads:
        rows = tuple(
            (
                f"{r.level:g}",
                r.label + (" (baseline)" if r.label == s.baseline else ""),
                fmt(r.in_flight, 1),
                fmt(r.decode_tok_s),
                fmt(r.output_tok_s),
                *(
                    (
                        fmt_pct(r.goodput.attainment) if r.goodput else "-",
                        fmt(r.goodput.tokens_per_s) if r.goodput else "-",
                    )
                    if slo
                    else ()
                ),
                fmt_pct(r.acceptance_rate),
                ci_pct(r.acceptance_ci),
                fmt(r.mean_acceptance_length, 2),
                fmt_x(r.speedup),
                ci_x(r.speedup_ci),
                "baseline" if r.label == s.baseline else r.verdict,
                f"{r.requests}" + (f" ({r.errors} failed)" if r.errors else ""),
            )
            for r in s.rows
            if r.workload == w
        )
        heads = (
            s.kind,
            "configuration",
            "in flight",
            "tok/s",
            "output tok/s",
            *(("SLO met", "goodput tok/s") if slo else ()),
            "acceptance",
            "95% CI",
            "acc. length",
            "speedup",
            "95% CI",
            "verdict",
            "requests",
        )
        notes = tuple(c.describe(s.kind, s.baseline) for c in s.crossovers if c.workload == w)
        title = "all workloads" if w == ALL else w
        tables.append(Table(title, heads, rows, ("r", "l", *("r",) * (len(heads) - 4), "l", "r"), notes))
    return tables


def _k_text(r: KRange) -> str:
    return f"{r.lo}-{r.hi}: k={r.k}" + (f" ({r.speedup:.2f}x)" if r.k else "")


def batch_tables(b: BatchAdvice) -> list[Table]:
    rows = tuple(
        (
            f"{c.lo}-{c.hi}" if c.lo != c.hi else str(c.lo),
            fmt(c.batch, 1),
            fmt(c.base_step_s * 1000 if c.base_step_s else None, 2),
            fmt(c.draft_cost, 3),
            ci_x(c.draft_cost_ci),
            ", ".join(f"k={p.k}: {p.step_s * 1000:.2f} ms (n={p.requests})" for p in c.points),
        )
        for c in b.buckets
    )
    notes: list[str] = []
    if not b.enough:
        notes.append(f"no k per batch size: {b.reason}")
    else:
        for w, ranges in b.per_workload.items():
            notes.append(f"{w}: " + "; ".join(_k_text(r) for r in ranges))
        notes.append("traffic mix: " + "; ".join(_k_text(r) for r in b.schedule))
        notes.extend(engine_lines(b))
    return [
        Table(
            "Cost of a draft token by requests in flight (c: fraction of a step without speculation)",
            ("in flight", "mean", "base step ms", "c", "95% CI", "step time per k"),
            rows,
            ("l", "r", "r", "r", "r", "l"),
            tuple(notes),
        )
    ]


def engine_lines(b: BatchAdvice) -> list[str]:
    """What to give an engine: vLLM's schedule, its older threshold, and one k for engines without either."""
    if not b.enough or b.single_k is None:
        return []
    top = max((r.k for r in b.schedule), default=0)
    out: list[str] = []
    if top:
        cfg = {"num_speculative_tokens": top, "num_speculative_tokens_per_batch_size": vllm_schedule(b.schedule)}
        out.append("vLLM (dynamic speculative decoding): --speculative-config '" + orjson.dumps(cfg).decode() + "'")
        if (d := disable_by_batch_size(b.schedule)) is not None:
            out.append(f'older vLLM (no schedule, V0 engine): "disable_by_batch_size": {d} in --speculative-config')
    out.append(
        f"one k for every load (engines without a schedule, e.g. SGLang's --speculative-num-steps; "
        f"{b.single_k_basis}): k={b.single_k}" + (" (don't speculate)" if b.single_k == 0 else "")
    )
    return out


def answer_lines(s: SweepResult, b: BatchAdvice | None) -> list[str]:
    """The page's first lines: per workload, up to which load each configuration pays, and how sure that is."""
    out: list[str] = []
    slo = f" under SLO {s.slo.describe()}" if s.slo is not None else ""
    out.append(f"Sweep over {s.kind} {', '.join(f'{v:g}' for v in s.levels)}{slo}; baseline {s.baseline}.")
    for w in s.workloads if len(s.labels) > 1 else ():
        if w != ALL and (best := best_by_level(s, w)):
            out.append(f"  {w}: best measured: " + "; ".join(best))
    for c in s.crossovers:
        if c.workload == ALL:
            continue
        line = f"  {c.workload}: {c.describe(s.kind, s.baseline)}"
        last = _row(s, c.label, c.workload, c.beats_up_to)
        if last is not None and last.speedup is not None:
            line += (
                f"; at {c.beats_up_to:g} {_unit(s.kind)}: {last.speedup:.2f}x [{ci_x(last.speedup_ci)}], {last.verdict}"
            )
            if last.goodput is not None and last.goodput.attainment is not None:
                line += f", SLO met by {last.goodput.attainment:.0%}"
        out.append(line)
    if b is not None:
        out.extend("  " + x for x in (engine_lines(b) if b.enough else [f"k per batch size: {b.reason}"]))
    return out


def best_by_level(s: SweepResult, workload: str) -> list[str]:
    """Per level, the configuration with the highest speedup among those measurably faster than the baseline (the
    lower end of the interval above 1) and, with an SLO, meeting it as often as the baseline; else the baseline.
    Neighbouring levels with the same answer are merged."""
    picks: list[tuple[float, str]] = []
    for lv in s.levels:
        faster = [
            r
            for r in s.rows
            if r.workload == workload and r.level == lv and r.speedup is not None and r.verdict == "faster"
        ]
        base = s.row(s.baseline, workload, lv)
        floor = base.goodput.attainment if base is not None and base.goodput is not None else None
        if floor is not None:  # with an SLO: only what meets it at least as often as the baseline does
            faster = [r for r in faster if r.goodput is not None and (r.goodput.attainment or 0.0) >= floor]
        best = max(faster, key=lambda r: r.speedup or 0.0, default=None)
        picks.append(
            (lv, f"{best.label} ({best.speedup:.2f}x)" if best is not None else f"{s.baseline} (no speculation)")
        )
    out: list[str] = []
    i = 0
    while i < len(picks):
        j = i
        while j + 1 < len(picks) and picks[j + 1][1].split(" (")[0] == picks[i][1].split(" (")[0]:
            j += 1
        where = f"{picks[i][0]:g}" if i == j else f"{picks[i][0]:g}-{picks[j][0]:g}"
        out.append(f"{picks[i][1].split(' (')[0]} at {where} {_unit(s.kind)}")
        i = j + 1
    return out


def _row(s: SweepResult, label: str, workload: str, level: float | None) -> LevelRow | None:
    return s.row(label, workload, level) if level is not None else None


def sweep_json(s: SweepResult, b: BatchAdvice | None, inputs: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "kind": "specproxy.sweep",
        "version": JSON_VERSION,
        "inputs": list(inputs),
        "level_kind": s.kind,
        "levels": list(s.levels),
        "baseline": s.baseline,
        "slo": s.slo.describe() if s.slo is not None else None,
        "rows": [
            {
                "label": r.label,
                "workload": r.workload,
                "level": r.level,
                "requests": r.requests,
                "errors": r.errors,
                "in_flight": r.in_flight,
                "decode_tok_s": r.decode_tok_s,
                "output_tok_s": r.output_tok_s,
                "slo_attainment": r.goodput.attainment if r.goodput else None,
                "goodput_req_s": r.goodput.requests_per_s if r.goodput else None,
                "goodput_tok_s": r.goodput.tokens_per_s if r.goodput else None,
                "acceptance_rate": r.acceptance_rate,
                "acceptance_ci": ci_json(r.acceptance_ci),
                "mean_acceptance_length": r.mean_acceptance_length,
                "speedup": r.speedup,
                "speedup_ci": ci_json(r.speedup_ci),
                "paired_requests": r.paired,
                "verdict": "baseline" if r.label == s.baseline else r.verdict,
            }
            for r in s.rows
        ],
        "crossovers": [
            {"label": c.label, "workload": c.workload, "beats_up_to": c.beats_up_to, "stops_at": c.stops_at}
            for c in s.crossovers
        ],
        "batch": batch_json(b) if b is not None else None,
    }


def batch_json(b: BatchAdvice) -> dict[str, Any]:
    return {
        "enough": b.enough,
        "reason": b.reason or None,
        "buckets": [
            {
                "in_flight_lo": c.lo,
                "in_flight_hi": c.hi,
                "in_flight_mean": c.batch,
                "decode_share": c.decode_share,
                "base_step_s": c.base_step_s,
                "draft_cost": c.draft_cost,
                "draft_cost_ci": ci_json(c.draft_cost_ci),
                "points": [{"label": p.label, "k": p.k, "step_s": p.step_s, "requests": p.requests} for p in c.points],
            }
            for c in b.buckets
        ],
        "per_workload": {
            w: [{"lo": r.lo, "hi": r.hi, "k": r.k, "speedup": r.speedup} for r in rs]
            for w, rs in b.per_workload.items()
        },
        "schedule": [{"lo": r.lo, "hi": r.hi, "k": r.k, "speedup": r.speedup} for r in b.schedule],
        "vllm_num_speculative_tokens_per_batch_size": vllm_schedule(b.schedule) if b.schedule else None,
        "disable_by_batch_size": disable_by_batch_size(b.schedule),
        "single_k": b.single_k,
    }
