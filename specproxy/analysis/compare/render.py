"""The comparison as a table (text, markdown), CSV and the JSON documented in ``docs/report-json.md``. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specproxy.analysis.compare.model import CompareRow, Comparison
from specproxy.analysis.figures.acceptance import UNSETTLED_MEANING
from specproxy.analysis.figures.confidence import LEVEL, Interval
from specproxy.analysis.figures.pairing import BY_BODY, BY_REPLAY
from specproxy.analysis.report.render import JSON_VERSION
from specproxy.analysis.tables import Table, fmt, fmt_pct, fmt_spread, fmt_x


def _paired_text(row: CompareRow) -> str:
    p = row.paired
    if p is None:
        return "-"
    return f"{fmt_x(p.median)} ({fmt(p.p10, 2)}-{fmt(p.p90, 2)}, n={p.pairs})"


def _ci_x(ci: Interval | None) -> str:
    return "-" if ci is None else f"{ci.lo:.2f}-{ci.hi:.2f}x"


def _ci_json(ci: Interval | None) -> dict[str, float] | None:
    return None if ci is None else {"lo": ci.lo, "hi": ci.hi, "level": LEVEL}


def _goodput_cells(r: CompareRow) -> tuple[str, ...]:
    g = r.goodput
    if g is None:
        return ("-", "-", "-")
    return (fmt_pct(g.attainment), fmt(g.requests_per_s, 2), fmt(g.tokens_per_s))


def compare_tables(c: Comparison) -> list[Table]:
    name = "tok/s" if c.metric == "decode" else "output tok/s"
    slo = any(r.goodput is not None for r in c.rows)
    engines = any(r.engine for r in c.rows)  # records that name their engine (schema 4) get an engine column
    rows = tuple(
        (
            r.workload,
            r.label + (" (baseline)" if r.is_baseline else ""),
            *((r.engine or "-",) if engines else ()),
            fmt(r.tok_s.value),
            fmt_spread(r.spread_lo, r.spread_hi),
            fmt_x(r.speedup),
            fmt_pct(r.acceptance_rate) + (" *" if r.unsettled else ""),
            fmt(r.mean_acceptance_length, 2),
            _paired_text(r),
            str(r.requests),
            str(r.errors),
            _ci_x(r.speedup_ci),
            r.verdict,
            *(_goodput_cells(r) if slo else ()),
        )
        for r in c.rows
    )
    spread = {"repeats": "min-max over repeats", "requests": "p10-p90 over requests"}
    kinds = sorted({spread[r.spread_kind] for r in c.rows if r.spread_kind in spread})
    notes = [f"baseline: {c.baseline} ({c.baseline_reason})", *c.notes]
    # the column says which spread it is; only a table that mixes both kinds needs the note to tell them apart
    spread_header = kinds[0].split(" ", 1)[0] if len(kinds) == 1 else "spread"
    if len(kinds) == 1:
        notes.append(f"{spread_header}: of the configuration's decode tok/s {kinds[0].split(' ', 1)[1]}")
    elif kinds:
        notes.append("spread: " + "; ".join(kinds))
    if any(r.speedup_ci for r in c.rows):
        notes.append(
            "95% CI: bootstrap over requests (paired by request where runs sent the same ones); a speedup is "
            "faster or slower only when its interval clears 0.97-1.03x (a run's drift), else not distinguishable"
        )
    if any(r.unsettled for r in c.rows):
        notes.append(f"*: some of the row's requests have as their acceptance {UNSETTLED_MEANING}")
    if any(r.paired for r in c.rows):
        how = {BY_BODY: "the same workload and request body", BY_REPLAY: "replay_of"}
        ways = "; ".join(
            f"{how.get(way, way)}: {n} row{'s' if n > 1 else ''}"
            for way in (BY_BODY, BY_REPLAY)
            if (n := sum(1 for r in c.rows if r.paired and r.paired_by == way))
        )
        notes.append(
            f"paired: per-request speedup over the baseline's run of the same request, median (p10-p90); by {ways}"
        )
    return [
        Table(
            "",
            (
                "workload",
                "configuration",
                *(("engine",) if engines else ()),
                name,
                spread_header,
                "speedup",
                "acceptance",
                "mean acc. length",
                "paired speedup",
                "requests",
                "errors",
                "speedup 95% CI",
                "verdict",
                *(("SLO met", "goodput req/s", "goodput tok/s") if slo else ()),
            ),
            rows,
            ("l", "l", *("l" * engines), *"r" * 9, "l", *"r" * (3 if slo else 0)),
            tuple(notes),
        )
    ]


def compare_json(c: Comparison, inputs: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "kind": "specproxy.compare",
        "version": JSON_VERSION,
        "inputs": list(inputs),
        "metric": c.metric,
        "baseline": c.baseline,
        "baseline_reason": c.baseline_reason,
        "labels": list(c.labels),
        "notes": list(c.notes),
        "rows": [
            {
                "workload": r.workload,
                "label": r.label,
                "engine": r.engine,
                "is_baseline": r.is_baseline,
                "requests": r.requests,
                "errors": r.errors,
                "tok_s": r.tok_s.as_dict(),
                "spread": {"kind": r.spread_kind, "lo": r.spread_lo, "hi": r.spread_hi},
                "speedup": r.speedup,
                "speedup_ci": _ci_json(r.speedup_ci),
                "verdict": r.verdict,
                "acceptance_rate": r.acceptance_rate,
                "acceptance_rate_ci": _ci_json(r.acceptance_ci),
                "acceptance_unsettled": r.unsettled,
                "mean_acceptance_length": r.mean_acceptance_length,
                **(
                    {
                        "slo_attainment": r.goodput.attainment,
                        "goodput_req_s": r.goodput.requests_per_s,
                        "goodput_tok_s": r.goodput.tokens_per_s,
                    }
                    if r.goodput is not None
                    else {}
                ),
                "paired": None
                if r.paired is None
                else {
                    "pairs": r.paired.pairs,
                    "median": r.paired.median,
                    "p10": r.paired.p10,
                    "p90": r.paired.p90,
                    "by": r.paired_by,
                },
            }
            for r in c.rows
        ],
    }


def compare_csv(c: Comparison) -> tuple[list[str], list[list[Any]]]:
    headers = [
        "workload",
        "label",
        "is_baseline",
        "tok_s",
        "tok_s_min",
        "tok_s_max",
        "spread_kind",
        "spread_lo",
        "spread_hi",
        "speedup",
        "acceptance_rate",
        "mean_acceptance_length",
        "paired_pairs",
        "paired_median",
        "paired_p10",
        "paired_p90",
        "requests",
        "errors",
        "speedup_ci_lo",
        "speedup_ci_hi",
        "verdict",
        "acceptance_rate_ci_lo",
        "acceptance_rate_ci_hi",
    ]
    slo = any(r.goodput is not None for r in c.rows)
    if slo:
        headers += ["slo_attainment", "goodput_req_s", "goodput_tok_s"]
    engines = any(r.engine for r in c.rows)
    if engines:
        headers.append("engine")
    rows = []
    for r in c.rows:
        p = r.paired
        g = r.goodput
        rows.append(
            [
                r.workload,
                r.label,
                r.is_baseline,
                r.tok_s.value,
                r.tok_s.min,
                r.tok_s.max,
                r.spread_kind,
                r.spread_lo,
                r.spread_hi,
                r.speedup,
                r.acceptance_rate,
                r.mean_acceptance_length,
                p.pairs if p else None,
                p.median if p else None,
                p.p10 if p else None,
                p.p90 if p else None,
                r.requests,
                r.errors,
                r.speedup_ci.lo if r.speedup_ci else None,
                r.speedup_ci.hi if r.speedup_ci else None,
                r.verdict,
                r.acceptance_ci.lo if r.acceptance_ci else None,
                r.acceptance_ci.hi if r.acceptance_ci else None,
                *((g.attainment, g.requests_per_s, g.tokens_per_s) if g else (None, None, None) if slo else ()),
                *((r.engine,) if engines else ()),
            ]
        )
    return headers, rows
