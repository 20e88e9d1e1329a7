"""The end-of-run summary: ``specproxy report`` grouped by workload, formatted short, plus send lag and what was not
sent. Pure.

The figures are the report's own (:func:`specproxy.analysis.report.accum.build_report`): with ``--repeat N`` every
figure is computed per repeat and the row shows the median over repeats (the published method: one warm-up, then
five measured runs, medians); a second table gives each workload's decode tok/s and acceptance as median (min-max)
over repeats. Latency and decode figures use requests that finished ``ok``.

A workload's speed is its decode tok/s (per request, median). The output rate is a figure of the whole run: every
workload's completion tokens over the run's wall-clock span (median over repeats), shown once under the table with
each workload's share of it. It is not shown per workload: workloads sent interleaved share one span, so a
workload's tokens over it would read as a speed (a fraction of its decode speed, when several share a run at
concurrency 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specproxy.analysis.report.accum import build_report
from specproxy.analysis.report.model import Figure, GroupReport
from specproxy.core.record import Record
from specproxy.core.stats import Summary, summarize


@dataclass(frozen=True, slots=True)
class RunSummary:
    workloads: tuple[GroupReport, ...]  # the report's groups, one per workload
    send_lag_s: Summary | None = None
    warmup_sent: int = 0
    warmup_failed: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    interrupted: bool = False
    output_tok_s: Figure | None = None  # the whole run's output rate (median over repeats)
    tokens: tuple[tuple[str, float], ...] = ()  # completion tokens per workload, in the table's order

    @property
    def requests(self) -> int:
        return sum(w.requests for w in self.workloads)

    @property
    def failed(self) -> int:
        return sum(w.errors for w in self.workloads)


def summarize_run(
    records: Iterable[Record],
    *,
    lags_s: Sequence[float] = (),
    warmup_sent: int = 0,
    warmup_failed: int = 0,
    notes: Sequence[str] = (),
    interrupted: bool = False,
    order: Sequence[str] = (),
) -> RunSummary:
    """The report by workload, workloads in ``order`` first, then as met."""
    records = list(records)
    groups = {g.get("workload"): g for g in build_report(records, ("workload",)).groups}
    ordered = [groups.pop(w) for w in order if w in groups]
    workloads = (*ordered, *groups.values())
    whole = build_report(records, ("run_id",)).groups if records else ()  # one group: a run has one run_id
    tokens: dict[str, float] = {}
    for r in records:
        tokens[r["workload"]] = tokens.get(r["workload"], 0.0) + (r["completion_tokens"] or 0)
    return RunSummary(
        workloads=workloads,
        send_lag_s=summarize(lags_s) if lags_s else None,
        warmup_sent=warmup_sent,
        warmup_failed=warmup_failed,
        notes=tuple(notes),
        interrupted=interrupted,
        output_tok_s=whole[0].figures["output_tok_s"] if len(whole) == 1 else None,
        tokens=tuple((w.get("workload") or "-", tokens.get(w.get("workload") or "", 0.0)) for w in workloads),
    )


def output_line(s: RunSummary) -> str | None:
    """The run's output rate and each workload's share of it, named so that the share is not read as a speed."""
    fig = s.output_tok_s
    if fig is None or fig.value is None:
        return None
    total = sum(t for _, t in s.tokens)
    line = f"output of the whole run: {fig.value:.1f} tok/s (completion tokens over the run's wall-clock span"
    line += ", median over repeats)" if fig.n > 1 else ")"
    if len(s.tokens) > 1 and total > 0:
        shares = ", ".join(f"{w} {fig.value * t / total:.1f}" for w, t in s.tokens)
        line += (
            f"\n  each workload's share of it (not its speed, which is decode tok/s; `report`'s output tok/s is over "
            f"each workload's own span): {shares}"
        )
    return line


def acceptance_source(g: GroupReport) -> str | None:
    """The spec source the workload's records used; "mixed" when several."""
    sources = [s for s in g.acceptance.sources if s != "none"]
    if not sources:
        return None
    return sources[0] if len(sources) == 1 else "mixed"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]


def format_summary(s: RunSummary, *, title: str = "") -> str:
    lines: list[str] = [title] if title else []
    repeats = max((w.repeats for w in s.workloads), default=0)
    header = [
        "workload",
        "ok",
        "errors",
        "decode tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "step p50",
        "acceptance",
        "accept len",
        "source",
    ]
    rows = [header]
    for w in s.workloads:
        f = w.figure
        cancelled = w.outcomes.get("client_cancelled", 0)
        err = str(w.errors) + (f" ({cancelled} cancelled)" if cancelled else "")
        rows.append(
            [
                w.get("workload") or "-",
                str(w.outcomes.get("ok", 0)),
                err,
                _f(f("decode_tok_s_p50")),
                _ms(f("ttft_s_p50")),
                _ms(f("ttft_s_p99")),
                _ms(f("itl_s_p50")),
                _ms(f("step_s_p50")),
                _f(f("acceptance_rate"), ".3f"),
                _f(f("mean_acceptance_length"), ".2f"),
                acceptance_source(w) or "-",
            ]
        )
    if len(rows) == 1:
        lines.append("no requests were recorded")
    else:
        if repeats > 1:
            lines.append(f"medians over {repeats} repeats:")
        lines.extend(_table(rows))
        lines.append("decode tok/s: per request, tokens after the first over the time after the first (median)")
    output = output_line(s)
    if output is not None:
        lines.append(output)
    if repeats > 1:
        lines.append("")
        lines.append(f"per-repeat spread (median, min-max over {repeats} repeats):")
        spread = [["workload", "decode tok/s", "acceptance"]]
        for w in s.workloads:
            d, a = w.figures["decode_tok_s_p50"], w.figures["acceptance_rate"]
            spread.append(
                [
                    w.get("workload") or "-",
                    f"{_f(d.value)} ({_f(d.min)}-{_f(d.max)})" if d.n else "-",
                    f"{_f(a.value, '.3f')} ({_f(a.min, '.3f')}-{_f(a.max, '.3f')})" if a.n else "-",
                ]
            )
        lines.extend(_table(spread))
    if s.send_lag_s is not None:
        lag = s.send_lag_s
        lines.append(
            f"send lag (actual send - scheduled): p50 {_ms(lag.p50)}, p99 {_ms(lag.p99)}, max {_ms(lag.max)} "
            f"over {lag.count} requests"
        )
    if s.warmup_sent:
        failed = f", {s.warmup_failed} failed" if s.warmup_failed else ""
        lines.append(f"warm-up: {s.warmup_sent} requests sent, not recorded{failed}")
    lines.extend(s.notes)
    if s.interrupted:
        lines.append("interrupted: requests in flight were cancelled (outcome client_cancelled); records kept")
    return "\n".join(lines)
