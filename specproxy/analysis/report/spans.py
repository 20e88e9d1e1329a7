"""The report's "where drafts land" tables and JSON: acceptance per span type and output position, and mean
acceptance length pooled beside its per-request mean (:mod:`specproxy.analysis.figures.spans`). Pure: a report in,
tables and dicts out.
"""

from __future__ import annotations

from typing import Any

from specproxy.analysis.figures.spans import SpanFigure, SpanFigures, position_label
from specproxy.analysis.report.model import GroupReport, Report
from specproxy.analysis.tables import Table, fmt, fmt_pct


def _keys(g: GroupReport) -> tuple[str, ...]:
    return tuple(v for _, v in g.key)


def histogram_text(hist: dict[int, int] | Any) -> str:
    total = sum(hist.values())
    if not total:
        return "-"
    return " ".join(f"{n}:{c / total * 100.0:.0f}%" for n, c in sorted(hist.items()))


def spans_tables(report: Report) -> list[Table]:
    """Where drafts land: acceptance per span type and output position (left out when no record says: records
    older than schema 8, or nothing streamed), and mean acceptance length pooled beside its per-request mean."""
    groups = [(g, g.spans) for g in report.groups if g.spans is not None]
    if not groups:
        return []
    by = list(report.group_by)
    left = tuple("l" for _ in by)
    rows, mal_rows = [], []
    shared = left_out = 0
    for g, sp in groups:
        assert sp is not None
        mal_rows.append(
            (
                *_keys(g),
                str(sp.mal_requests),
                fmt(sp.mal_pooled, 2),
                fmt(sp.mal_per_request, 2),
                histogram_text(g.acceptance.tokens_per_step),
            )
        )
        for label, f in (*sp.types.items(), *((f"tokens {position_label(k)}", f) for k, f in sp.positions.items())):
            rows.append(
                (
                    *_keys(g),
                    label,
                    str(f.requests),
                    fmt(f.tokens, 0),
                    fmt_pct(f.token_share),
                    fmt_pct(f.acceptance_rate),
                    fmt(f.mean_acceptance_length, 2),
                    "measured" if f.basis == "steps" else "shared",
                )
            )
            shared += f.basis == "shared"
            left_out = max(left_out, f.left_out)
    notes = [
        "span: what the text was where the step landed (code, json, math, cjk, whitespace, prose); tokens a-b: "
        "output position of the step's first token; mean acc. length: tokens per decode step there",
    ]
    if shared:
        notes.append(
            "shared: no record measured it (chunks were not steps): each span got its request's mean, so these rows "
            "do not tell spans apart"
        )
    if left_out:
        notes.append(f"rows measured from steps leave out the records that only shared their figure (up to {left_out})")
    where = [
        Table(
            "Where drafts land",
            (*by, "span", "requests", "tokens", "token share", "acceptance", "mean acc. length", "basis"),
            tuple(rows),
            (*left, "l", *"r" * 5, "l"),
            tuple(notes),
        )
    ]
    return [
        *(where if rows else []),
        Table(
            "Mean acceptance length: pooled and per request",
            (*by, "requests", "pooled", "per-request mean", "tokens per step (pooled)"),
            tuple(mal_rows),
            (*left, "r", "r", "r", "l"),
            (
                "pooled: 1 + all accepted / all drafts (token-weighted: long replies weigh more); per-request mean: "
                "each request's own figure, averaged",
            ),
        ),
    ]


def _span_json(f: SpanFigure) -> dict[str, Any]:
    return {
        "requests": f.requests,
        "tokens": f.tokens,
        "token_share": f.token_share,
        "basis": f.basis,
        "steps": f.steps,
        "accepted": f.accepted,
        "draft_tokens": f.draft_tokens,
        "acceptance_rate": f.acceptance_rate,
        "mean_acceptance_length": f.mean_acceptance_length,
        "left_out": f.left_out,
    }


def spans_json(sp: SpanFigures | None) -> dict[str, Any] | None:
    if sp is None:
        return None
    return {
        "types": {k: _span_json(f) for k, f in sp.types.items()},
        "positions": {k: _span_json(f) for k, f in sp.positions.items()},
        "mean_acceptance_length": {
            "pooled": sp.mal_pooled,
            "per_request": sp.mal_per_request,
            "requests": sp.mal_requests,
        },
    }
