"""Advice as tables (text, markdown, CSV) and the JSON documented in ``docs/report-json.md``. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specproxy.analysis.advise.measured import MeasuredRow
from specproxy.analysis.advise.model import Advice, MeasuredK
from specproxy.analysis.report.render import JSON_VERSION
from specproxy.analysis.sweep.batchcost import BatchAdvice
from specproxy.analysis.sweep.render import batch_json, batch_tables, ci_json, ci_pct, ci_x
from specproxy.analysis.tables import Table, fmt, fmt_ms, fmt_pct, fmt_x


def cost_text(a: Advice) -> str:
    c = a.cost
    how = {
        "given": "given",
        "fitted": "fitted from step times at k=" + ",".join(str(k) for k, _ in c.points),
        "default": "assumed default; pass --draft-cost or --baseline-run to measure it",
        "lowest load": "measured at the lowest load the records cover: the predictions below hold there; at other "
        "loads see the cost and k per range of requests in flight at the end",
    }[c.source]
    base = f"base step {fmt_ms(c.base_step_s, 2)} ms" if c.base_step_s else "base step unknown"
    return f"cost model: one draft token costs {c.draft_cost:.3f} of a base step ({how}); {base}"


def _measured_cell(m: MeasuredK | None) -> str:
    if m is None:
        return "-"
    return f"{fmt_x(m.speedup)} [{ci_x(m.speedup_ci)}] {m.verdict}" + ("" if m.agrees else " (prediction off)")


def advise_tables(a: Advice) -> list[Table]:
    tables: list[Table] = []
    for w in a.workloads:
        measured = bool(w.measured)
        rows = tuple(
            (
                ("* " if p.k == w.recommended_k else "") + str(p.k) + (" (extrapolated)" if p.extrapolated else ""),
                fmt(p.expected_tokens_per_step, 2),
                fmt(p.relative_step_cost, 2),
                fmt_x(p.speedup),
                ci_x(p.speedup_ci),
                p.verdict,
                fmt(p.tok_s),
                *((_measured_cell(w.measured_at(p.k)),) if measured else ()),
            )
            for p in w.predictions
        )
        rec = (
            "-"
            if w.recommended_k is None
            else ("0 (don't speculate)" if w.recommended_k == 0 else str(w.recommended_k))
        )
        if w.recommended_from == "measurement":
            rec += ", from the measured runs"
        title = (
            f"{w.workload}: recommended k = {rec} (measured k {w.measured_k or '-'}, acceptance "
            f"{fmt_pct(w.acceptance_rate)} [95% CI {ci_pct(w.acceptance_ci)}], conditional per position "
            f"{' '.join(f'{p:.2f}' for p in w.conditional) or '-'}; {w.requests} requests)"
        )
        notes = tuple(f"warning: {x}" for x in w.warnings) + w.notes
        tables.append(
            Table(
                title,
                ("k", "tokens/step", "step cost", "speedup", "95% CI", "verdict", "tok/s")
                + (("measured speedup",) if measured else ()),
                rows,
                ("l", "r", "r", "r", "r", "l", "r") + (("l",) if measured else ()),
                notes,
            )
        )
    return tables


def advise_json(a: Advice, inputs: Sequence[str] = ()) -> dict[str, Any]:
    c = a.cost
    return {
        "kind": "specproxy.advise",
        "version": JSON_VERSION,
        "inputs": list(inputs),
        "cost_model": {
            "draft_cost": c.draft_cost,
            "base_step_s": c.base_step_s,
            "source": c.source,
            "points": [{"k": k, "step_s": s} for k, s in c.points],
        },
        "workloads": [
            {
                "workload": w.workload,
                "requests": w.requests,
                "draft_tokens": w.draft_tokens,
                "measured_k": w.measured_k,
                "acceptance_rate": w.acceptance_rate,
                "acceptance_ci": ci_json(w.acceptance_ci),
                "conditional_acceptance": list(w.conditional),
                "recommended_k": w.recommended_k,
                "recommended_from": w.recommended_from,
                "predictions": [
                    {
                        "k": p.k,
                        "expected_tokens_per_step": p.expected_tokens_per_step,
                        "relative_step_cost": p.relative_step_cost,
                        "speedup": p.speedup,
                        "speedup_ci": ci_json(p.speedup_ci),
                        "verdict": p.verdict,
                        "tok_s": p.tok_s,
                        "extrapolated": p.extrapolated,
                        "measured": None
                        if (m := w.measured_at(p.k)) is None
                        else {
                            "speedup": m.speedup,
                            "speedup_ci": ci_json(m.speedup_ci),
                            "verdict": m.verdict,
                            "agrees": m.agrees,
                        },
                    }
                    for p in w.predictions
                ],
                "warnings": list(w.warnings),
                "notes": list(w.notes),
            }
            for w in a.workloads
        ],
    }


def measured_table(rows: Sequence[MeasuredRow]) -> list[Table]:
    """What the runs measured, per workload and configuration: the check on the predictions, and goodput."""
    if not rows:
        return []
    slo = any(r.goodput is not None for r in rows)
    sweep = any(r.level for r in rows)
    body = tuple(
        (
            r.workload,
            *((r.level,) if sweep else ()),
            r.label + (" (baseline)" if r.is_baseline else ""),
            str(r.k),
            str(r.requests),
            fmt(r.decode_tok_s),
            fmt_x(r.speedup),
            ci_x(r.speedup_ci),
            r.verdict,
            fmt_pct(r.acceptance_rate),
            ci_pct(r.acceptance_ci),
            *(
                (fmt_pct(r.goodput.attainment), fmt(r.goodput.requests_per_s, 2), fmt(r.goodput.tokens_per_s))
                if slo and r.goodput
                else ("-",) * (3 if slo else 0)
            ),
        )
        for r in rows
    )
    heads = (
        "workload",
        *(("load",) if sweep else ()),
        "configuration",
        "k",
        "requests",
        "tok/s",
        "speedup",
        "95% CI",
        "verdict",
        "acceptance",
        "95% CI",
        *(("SLO met", "goodput req/s", "goodput tok/s") if slo else ()),
    )
    notes = (
        "measured: median per-request decode tok/s; speedup over the baseline at the same load, 95% bootstrap "
        "interval over requests (paired by request where the runs sent the same ones)",
    )
    align = ("l", *(("l",) if sweep else ()), "l", *("r",) * 5, "l", "r", "r", *("r",) * (3 if slo else 0))
    return [Table("Measured", heads, body, align, notes)]


def measured_json(rows: Sequence[MeasuredRow]) -> list[dict[str, Any]]:
    return [
        {
            "workload": r.workload,
            "label": r.label,
            "level": r.level or None,
            "k": r.k,
            "requests": r.requests,
            "decode_tok_s": r.decode_tok_s,
            "speedup": r.speedup,
            "speedup_ci": ci_json(r.speedup_ci),
            "paired_requests": r.paired,
            "verdict": r.verdict,
            "acceptance_rate": r.acceptance_rate,
            "acceptance_ci": ci_json(r.acceptance_ci),
            "slo_attainment": r.goodput.attainment if r.goodput else None,
            "goodput_req_s": r.goodput.requests_per_s if r.goodput else None,
            "goodput_tok_s": r.goodput.tokens_per_s if r.goodput else None,
        }
        for r in rows
    ]


def advise_extra_tables(rows: Sequence[MeasuredRow], batch: BatchAdvice) -> list[Table]:
    return measured_table(rows) + batch_tables(batch)


def advise_extra_json(rows: Sequence[MeasuredRow], batch: BatchAdvice) -> dict[str, Any]:
    return {"measured": measured_json(rows), "batch": batch_json(batch)}
