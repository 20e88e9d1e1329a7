"""The report as tables (for text, markdown and CSV) and as the stable JSON documented in ``docs/report-json.md``.

JSON keeps full precision and seconds; tables show milliseconds and rounded figures. Pure: a report in, tables and
dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specproxy.analysis.figures import sketch
from specproxy.analysis.figures.acceptance import UNSETTLED_MEANING, Acceptance
from specproxy.analysis.figures.slo import FigureSpec
from specproxy.analysis.report.model import GroupReport, Report
from specproxy.analysis.report.spans import histogram_text, spans_json, spans_tables
from specproxy.analysis.tables import Table, fmt, fmt_ms, fmt_pct, fmt_signed_pct, fmt_spread
from specproxy.core.record import OUTCOMES

JSON_VERSION = 1
_OUTCOME_ORDER = OUTCOMES
_APPROX_TOKENS = ("tiktoken", "approx", "none")
_SOURCES = ("server", "chunks", "counters", "none")


_LATENCY_TABLE = ("ttft", "itl", "step")
_LABELS = {"ttft": "TTFT", "itl": "inter-token", "step": "inter-step", "tpot": "TPOT", "e2e": "E2E"}


def _header(spec: FigureSpec, metric: str, unit: str) -> list[str]:
    return [f"{_LABELS[metric]} p{p:g}{unit}" for p in spec.percentiles.get(metric, ())]


def _keys(g: GroupReport) -> tuple[str, ...]:
    return tuple(v for _, v in g.key)


def position_text(acc: Acceptance) -> str:
    return " ".join(f"{r:.2f}" for r in acc.position_rates) or "-"


def sources_text(sources: dict[str, int] | Any, unsettled: int = 0) -> str:
    text = ", ".join(f"{k} {v}" for k, v in sorted(sources.items(), key=lambda kv: -kv[1])) or "-"
    return f"{text} ({unsettled} unsettled)" if unsettled else text


UNSETTLED_NOTE = f"unsettled: records whose figure is {UNSETTLED_MEANING}"


def reconciliation_text(acc: Acceptance) -> str:
    r = acc.reconciliation
    if r is None or r.accepted_gap_pct is None:
        return "-"
    return f"{fmt_signed_pct(r.accepted_gap_pct)} (n={r.requests})"


def report_tables(report: Report, warnings: Sequence[str] = ()) -> list[Table]:
    """The report's tables; ``warnings`` (about the runs as a whole: a buffering hop) lead the first's notes."""
    spec = report.spec
    by = list(report.group_by)
    left = tuple("l" for _ in by)
    repeated = max((g.repeats for g in report.groups), default=0)
    thr_rows, lat_rows, spec_rows, out_rows = [], [], [], []
    outcomes = [o for o in _OUTCOME_ORDER if any(g.outcomes.get(o) for g in report.groups)]
    outcomes += sorted({o for g in report.groups for o in g.outcomes} - set(_OUTCOME_ORDER))
    for g in report.groups:
        f, tok = g.figure, g.figures["decode_tok_s_p50"]
        thr_rows.append(
            (
                *_keys(g),
                str(g.requests),
                str(g.errors),
                fmt(tok.value),
                fmt_spread(tok.min, tok.max) if g.repeats > 1 else "-",
                fmt(f("output_tok_s")),
                *(fmt_ms(f(n), 2) for n in spec.latency("tpot")),
                *(fmt(f(n), 2) for n in spec.latency("e2e")),
                *(
                    (fmt_pct(f("slo_attainment")), fmt(f("goodput_req_s"), 2), fmt(f("goodput_tok_s")))
                    if spec.slo is not None
                    else ()
                ),
            )
        )
        latency = (fmt_ms(f(n)) for m in _LATENCY_TABLE for n in spec.latency(m))
        lat_rows.append((*_keys(g), *latency, fmt_pct(f("prompt_cached_share"))))
        a = g.acceptance
        spec_rows.append(
            (
                *_keys(g),
                str(a.k or "-"),
                fmt_pct(f("acceptance_rate")),
                fmt(f("mean_acceptance_length"), 2),
                position_text(a),
                histogram_text(a.tokens_per_step),
                sources_text(a.sources, a.unsettled),
                reconciliation_text(a),
            )
        )
        out_rows.append((*_keys(g), str(g.requests), *(str(g.outcomes.get(o, 0)) for o in outcomes)))
    thr_extra = [*_header(spec, "tpot", " ms"), *_header(spec, "e2e", " s")]
    if spec.slo is not None:
        thr_extra += ["SLO met", "goodput req/s", "goodput tok/s"]
    lat_headers = [*(h for m in _LATENCY_TABLE for h in _header(spec, m, "")), "prompt cached"]
    notes: list[str] = [
        *(f"warning: {w}" for w in warnings),
        "output tok/s: the group's completion tokens over the span from its first request's start to its last one's "
        "end; groups sent interleaved in one run overlap in time, so it is not the group's speed (decode tok/s is) "
        "and the groups' figures do not add up to the run's output (`specproxy run` prints that, with each "
        "workload's share)",
    ]
    if spec.slo is not None:
        notes.append(f"SLO: {spec.slo.describe()}; goodput counts the requests that met it over the run's span")
    if not report.quantiles_exact:
        notes.append(sketch_note())
    if repeated:
        notes.append(f"figures are medians over repeats (up to {repeated}); min-max: of decode tok/s over repeats")
    approx = sum(n for g in report.groups for s, n in g.token_sources.items() if s in _APPROX_TOKENS)
    if approx:
        notes.append(f"{approx} requests have approximate or unknown token counts: tok/s figures are estimates")
    not_steps = sum(g.chunks_not_steps for g in report.groups)
    if not_steps:
        notes.append(f"{not_steps} streamed requests have chunks that are not engine steps: inter-step figures blur")
    off = sum(g.decode_off_engine for g in report.groups)
    if off:
        notes.append(
            f"{off} requests' decode tok/s is over 25% off the engine's own timing of them: their chunks arrived "
            "late (a busy host?), so those decode figures are the reader's, not the engine's"
        )
    return [
        Table(
            "Throughput",
            (
                *by,
                "requests",
                "errors",
                "decode tok/s p50",
                "min-max",
                "output tok/s",
                *thr_extra,
            ),
            tuple(thr_rows),
            (*left, *"r" * (5 + len(thr_extra))),
            tuple(notes),
        ),
        Table("Latency (ms)", (*by, *lat_headers), tuple(lat_rows), (*left, *"r" * len(lat_headers))),
        Table(
            "Speculative decoding",
            (
                *by,
                "k",
                "acceptance",
                "mean acc. length",
                "per position",
                "tokens per step",
                "source",
                "reconciliation gap",
            ),
            tuple(spec_rows),
            (*left, "r", "r", "r"),
            (
                "per position: accepted at draft position i per draft; reconciliation gap: counters vs per-request "
                "estimates of accepted tokens",
                *((UNSETTLED_NOTE,) if any(g.acceptance.unsettled for g in report.groups) else ()),
            ),
        ),
        Table(
            "Requests by outcome", (*by, "requests", *outcomes), tuple(out_rows), (*left, *"r" * (1 + len(outcomes)))
        ),
        *spans_tables(report),
    ]


def acceptance_json(a: Acceptance) -> dict[str, Any]:
    r = a.reconciliation
    return {
        "spec_requests": a.spec_requests,
        "k": a.k,
        "accepted": a.accepted,
        "drafts": a.drafts,
        "draft_tokens": a.draft_tokens,
        "acceptance_rate": a.acceptance_rate,
        "mean_acceptance_length": a.mean_acceptance_length,
        "per_position": list(a.per_position),
        "per_position_rate": list(a.position_rates),
        "tokens_per_step": {str(k): v for k, v in a.tokens_per_step.items()},
        "sources": dict(a.sources),
        "unsettled": a.unsettled,
        "reconciliation": None
        if r is None
        else {
            "requests": r.requests,
            "per_request_accepted": r.per_request.accepted,
            "counters_accepted": r.counters.accepted,
            "accepted_gap_pct": r.accepted_gap_pct,
            "per_request_draft_tokens": r.per_request.draft_tokens,
            "counters_draft_tokens": r.counters.draft_tokens,
            "draft_tokens_gap_pct": r.draft_tokens_gap_pct,
        },
    }


def _slo_json(spec: FigureSpec) -> dict[str, Any]:
    slo = spec.slo
    assert slo is not None

    def one(x: Any) -> dict[str, float | None]:
        return {"ttft_s": x.ttft_s, "tpot_s": x.tpot_s, "e2e_s": x.e2e_s}

    return {
        "default": one(slo.default) if slo.default is not None else None,
        "per_workload": {w: one(x) for w, x in slo.per_workload.items()},
    }


def sketch_note() -> str:
    return (
        f"percentiles of figures with over {sketch.EXACT_LIMIT:,} values in a group are from a DDSketch: within "
        f"{sketch.RELATIVE_ERROR:.1%} of the exact figure"
    )


def quantiles_json(exact: bool) -> dict[str, Any]:
    """How the percentiles were computed: exactly, or (some of them) within a relative error."""
    return {
        "exact": exact,
        "exact_up_to": sketch.EXACT_LIMIT,
        "relative_error": 0.0 if exact else sketch.RELATIVE_ERROR,
    }


def report_json(
    report: Report, inputs: Sequence[str] = (), paths: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The stable JSON; ``paths``: per run label, what its path did to the stream (``{"buffering": verdict}``)."""
    return {
        "kind": "specproxy.report",
        "version": JSON_VERSION,
        "inputs": list(inputs),
        "group_by": list(report.group_by),
        "requests": report.requests,
        "quantiles": quantiles_json(report.quantiles_exact),
        **({"slo": _slo_json(report.spec)} if report.spec.slo is not None else {}),
        **({"paths": {label: dict(p) for label, p in paths.items()}} if paths is not None else {}),
        "groups": [
            {
                "key": dict(g.key),
                "requests": g.requests,
                "errors": g.errors,
                "outcomes": dict(g.outcomes),
                "repeats": g.repeats,
                "figures": {n: g.figures[n].as_dict() for n in report.figure_names},
                "acceptance": acceptance_json(g.acceptance),
                "token_sources": dict(g.token_sources),
                "chunks_not_steps": g.chunks_not_steps,
                "truncated": g.truncated,
                "decode_off_engine": g.decode_off_engine,
                "spans": spans_json(g.spans),
            }
            for g in report.groups
        ],
    }


def report_csv(report: Report) -> tuple[list[str], list[list[Any]]]:
    """One row per group. Figures get ``_min``/``_max`` columns when runs were repeated; per-position rates,
    attribution sources and the tokens-per-step histogram are spread over columns of their own."""
    repeated = any(g.repeats for g in report.groups)
    positions = max((len(g.acceptance.per_position) for g in report.groups), default=0)
    sizes = sorted({n for g in report.groups for n in g.acceptance.tokens_per_step})
    outcomes = sorted({o for g in report.groups for o in g.outcomes})
    headers = [*report.group_by, "requests", "errors", "repeats", *(f"outcome_{o}" for o in outcomes)]
    for n in report.figure_names:
        headers += [n, f"{n}_min", f"{n}_max"] if repeated else [n]
    headers += [
        "k",
        "accepted",
        "drafts",
        "draft_tokens",
        *(f"source_{s}" for s in _SOURCES),
        "reconciliation_accepted_gap_pct",
    ]
    headers += [f"position_{i}_rate" for i in range(positions)] + [f"tokens_per_step_{n}" for n in sizes]
    rows: list[list[Any]] = []
    for g in report.groups:
        a = g.acceptance
        row: list[Any] = [*_keys(g), g.requests, g.errors, g.repeats, *(g.outcomes.get(o, 0) for o in outcomes)]
        for n in report.figure_names:
            fig = g.figures[n]
            row += [fig.value, fig.min, fig.max] if repeated else [fig.value]
        rec = a.reconciliation
        row += [
            a.k,
            a.accepted,
            a.drafts,
            a.draft_tokens,
            *(a.sources.get(s, 0) for s in _SOURCES),
            rec.accepted_gap_pct if rec else None,
        ]
        rates = a.position_rates
        row += [rates[i] if i < len(rates) else None for i in range(positions)]
        row += [a.tokens_per_step.get(n, 0) for n in sizes]
        rows.append(row)
    return headers, rows
