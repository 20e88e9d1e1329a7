"""Advice and roofline as tables (text, markdown, CSV) and the JSON documented in ``docs/report-json.md``. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specproxy.analysis.advise import Advice
from specproxy.analysis.render import JSON_VERSION
from specproxy.analysis.roofline import Roofline
from specproxy.analysis.tables import Table, fmt, fmt_ms, fmt_pct, fmt_x


def cost_text(a: Advice) -> str:
    c = a.cost
    how = {
        "given": "given",
        "fitted": "fitted from inter-step gaps at k=" + ",".join(str(k) for k, _ in c.points),
        "default": "assumed default; pass --draft-cost or --baseline-run to measure it",
    }[c.source]
    base = f"base step {fmt_ms(c.base_step_s, 2)} ms" if c.base_step_s else "base step unknown"
    return f"cost model: one draft token costs {c.draft_cost:.3f} of a base step ({how}); {base}"


def advise_tables(a: Advice) -> list[Table]:
    tables: list[Table] = []
    for w in a.workloads:
        rows = tuple(
            (
                ("* " if p.k == w.recommended_k else "") + str(p.k) + (" (extrapolated)" if p.extrapolated else ""),
                fmt(p.expected_tokens_per_step, 2),
                fmt(p.relative_step_cost, 2),
                fmt_x(p.speedup),
                fmt(p.tok_s),
            )
            for p in w.predictions
        )
        rec = (
            "-"
            if w.recommended_k is None
            else ("0 (don't speculate)" if w.recommended_k == 0 else str(w.recommended_k))
        )
        title = (
            f"{w.workload}: recommended k = {rec} (measured k {w.measured_k or '-'}, acceptance "
            f"{fmt_pct(w.acceptance_rate)}, conditional per position "
            f"{' '.join(f'{p:.2f}' for p in w.conditional) or '-'}; {w.requests} requests)"
        )
        notes = tuple(f"warning: {x}" for x in w.warnings) + w.notes
        tables.append(
            Table(title, ("k", "tokens/step", "step cost", "speedup", "tok/s"), rows, ("l", "r", "r", "r", "r"), notes)
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
                "conditional_acceptance": list(w.conditional),
                "recommended_k": w.recommended_k,
                "predictions": [
                    {
                        "k": p.k,
                        "expected_tokens_per_step": p.expected_tokens_per_step,
                        "relative_step_cost": p.relative_step_cost,
                        "speedup": p.speedup,
                        "tok_s": p.tok_s,
                        "extrapolated": p.extrapolated,
                    }
                    for p in w.predictions
                ],
                "warnings": list(w.warnings),
                "notes": list(w.notes),
            }
            for w in a.workloads
        ],
    }


def roofline_rows(r: Roofline, measured: Sequence[tuple[str, float | None, float | None]]) -> list[list[Any]]:
    """``measured``: (what, decode tok/s, read bytes per token or None) per row."""
    rows: list[list[Any]] = []
    for what, tok_s, read_bytes in measured or [("", None, None)]:
        ceiling = r.bandwidth_bytes_s / read_bytes if read_bytes else r.ceiling_tok_s
        rows.append(
            [
                what,
                read_bytes or r.bytes_per_token,
                "measured" if read_bytes else "estimated",
                ceiling,
                tok_s,
                tok_s / ceiling if tok_s is not None else None,
            ]
        )
    return rows


ROOFLINE_HEADERS = [
    "measurement",
    "bytes_per_token",
    "bytes_source",
    "ceiling_tok_s",
    "measured_tok_s",
    "fraction_of_ceiling",
]


def roofline_tables(r: Roofline, rows: Sequence[Sequence[Any]]) -> list[Table]:
    body = tuple(
        (what or "-", f"{b / 1e9:.2f} GB ({src})", fmt(c), fmt(m), fmt_pct(frac, 0))
        for what, b, src, c, m, frac in rows
    )
    notes = (
        f"ceiling = bandwidth {r.bandwidth_bytes_s / 1e12:.3f} TB/s / bytes read per token "
        f"({r.active_params / 1e9:.3g}B active params x {r.bytes_per_param:g} byte/param"
        + (f" + {r.extra_bytes_per_token / 1e9:.3g} GB other reads" if r.extra_bytes_per_token else "")
        + ")",
        "speculative decoding emits several tokens per weight read, so a measurement can exceed 100%",
    )
    return [
        Table(
            "Decode roofline",
            ("measurement", "bytes per token", "ceiling tok/s", "measured tok/s", "of ceiling"),
            body,
            ("l", "r", "r", "r", "r"),
            notes,
        )
    ]


def roofline_json(r: Roofline, rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    return {
        "kind": "specproxy.roofline",
        "version": JSON_VERSION,
        "params": r.params,
        "active_params": r.active_params,
        "bytes_per_param": r.bytes_per_param,
        "extra_bytes_per_token": r.extra_bytes_per_token,
        "bandwidth_bytes_s": r.bandwidth_bytes_s,
        "ceiling_tok_s": r.ceiling_tok_s,
        "rows": [dict(zip(ROOFLINE_HEADERS, row, strict=True)) for row in rows],
    }
