"""The HTML report: one self-contained file (inline CSS and SVG, nothing fetched when viewed).

Charts: decode tok/s by configuration, acceptance by workload, the per-position acceptance curve, the tokens-per-step
histogram, TTFT, inter-token and inter-step distributions (CDFs), and requests in flight over time; then the report's
tables. What the charts draw is gathered by :mod:`.gather` in the report's one pass over the records. A few
lines of inline script record, on each chart, how many data marks were drawn with a non-zero size (``data-drawn``),
so a headless browser can check that the charts rendered. Pure: report and chart data in, text out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from specproxy.analysis.html.gather import ChartInput
from specproxy.analysis.html.svg import Line, Series, bar_chart, line_chart
from specproxy.analysis.report.model import Report, describe_key
from specproxy.analysis.sweep.batchcost import BatchAdvice
from specproxy.analysis.sweep.model import ALL, LevelRow, SweepResult
from specproxy.analysis.tables import Table

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:16px}
.charts figure{margin:0;border:1px solid #ddd;padding:8px;background:#fff}
table{border-collapse:collapse;margin:8px 0 4px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px}th{background:#f4f4f4}
td.r{text-align:right;font-variant-numeric:tabular-nums}
p.note{font-size:12px;color:#555;margin:2px 0}
"""

# Counts the marks each chart actually drew (getBBox needs layout, so this runs after load). Inline: nothing fetched.
_SCRIPT = """
(function(){
  function measure(){
    document.querySelectorAll('svg[data-chart]').forEach(function(svg){
      var n=0;
      svg.querySelectorAll('.mark').forEach(function(el){var b=el.getBBox(); if(b.width>0||b.height>0){n++;}});
      var r=svg.getBoundingClientRect();
      svg.setAttribute('data-drawn', String(n));
      svg.setAttribute('data-size', Math.round(r.width)+'x'+Math.round(r.height));
    });
    document.body.setAttribute('data-measured','1');
  }
  if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',measure);}else{measure();}
})();
"""


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    rows = "".join(
        "<tr>" + "".join(f'<td class="{t.alignment(i)}">{escape(c)}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in t.rows
    )
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in t.notes)
    title = f"<h2>{escape(t.title)}</h2>" if t.title else ""
    return f"{title}<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{notes}"


def charts(report: Report, data: ChartInput) -> list[str]:
    by_wl = {k: acc for k, acc in data.by_wl.ordered()}
    workloads = list(dict.fromkeys(w for w, _ in by_wl))
    labels = list(dict.fromkeys(lab for _, lab in by_wl))
    summaries = {k: acc.report((("workload", k[0]), ("label", k[1]))) for k, acc in by_wl.items()}
    hues: dict[str, int] = {}  # a series' palette index, the same in every chart of the page

    def colors(series: Sequence[tuple[str, object]]) -> list[int]:
        return [hues.setdefault(name, len(hues)) for name, _ in series]

    def series(metric: str, scale: float, only_spec: bool = False) -> list[Series]:
        out: list[Series] = []
        for lab in labels:
            vals: list[float | None] = []
            for w in workloads:
                g = summaries.get((w, lab))
                v = g.figure(metric) if g is not None else None
                vals.append(v * scale if v is not None else None)
            if not only_spec or any(v is not None for v in vals):
                out.append((lab, vals))
        return out

    out = [
        bar_chart(
            "tok_s",
            "Decode tok/s by configuration (median per request)",
            workloads,
            tok_s := series("decode_tok_s_p50", 1.0),
            "tok/s",
            colors=colors(tok_s),
        ),
        bar_chart(
            "acceptance",
            "Acceptance rate by workload",
            workloads,
            acc := series("acceptance_rate", 100.0, only_spec=True),
            "% of draft tokens accepted",
            colors=colors(acc),
        ),
    ]
    groups = report.groups
    positions: list[Line] = []
    for g in groups:
        rates = g.acceptance.position_rates
        if rates:
            positions.append((describe_key(g.key), [(float(i + 1), r * 100.0) for i, r in enumerate(rates)]))
    out.append(
        line_chart(
            "per_position",
            "Acceptance per draft position",
            positions,
            "draft position",
            "% of drafts accepted here",
            markers=True,
            y_max=100.0,
            integer_x=True,
            colors=colors(positions),
        )
    )
    sizes = sorted({n for g in groups for n in g.acceptance.tokens_per_step})
    hist: list[Series] = []
    for g in groups:
        h = g.acceptance.tokens_per_step
        total = sum(h.values())
        if total:
            hist.append((describe_key(g.key), [h.get(n, 0) / total * 100.0 for n in sizes]))
    out.append(
        bar_chart(
            "tokens_per_step",
            "Tokens per decode step",
            [str(n) for n in sizes],
            hist,
            "% of steps",
            colors=colors(hist),
        )
    )
    ttft: list[Line] = []
    itl: list[Line] = []
    step: list[Line] = []
    for key, lat in data.latency.items():
        name = " / ".join(key)
        ttft.append((name, lat.ttft.cdf_points(1000.0)))
        itl.append((name, lat.itl.cdf_points(1000.0)))
        step.append((name, lat.step.cdf_points(1000.0)))
    for chart, title, lines, unit in (
        ("ttft", "Time to first token (CDF)", ttft, "fraction of requests"),
        ("itl", "Inter-token latency (CDF)", itl, "fraction of tokens"),
        ("step", "Inter-step latency (CDF)", step, "fraction of steps"),
    ):
        out.append(line_chart(chart, title, lines, "ms", unit, y_max=1.0, colors=colors(lines)))
    timeline: list[Line] = [(lab, data.in_flight(lab)) for lab in data.spans]
    out.append(
        line_chart(
            "timeline",
            "Requests in flight",
            timeline,
            "seconds since the run's first request",
            "requests",
            step=True,
            colors=colors(timeline),
        )
    )
    return out


def render_html(
    report: Report,
    data: ChartInput,
    tables: Sequence[Table],
    title: str = "specproxy report",
    inputs: Sequence[str] = (),
) -> str:
    figures = "".join(f"<figure>{svg}</figure>" for svg in charts(report, data))
    body_tables = "".join(_table_html(t) for t in tables)
    sources = "".join(f"<li>{escape(i)}</li>" for i in inputs)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{escape(title)}</h1><p class="note">{report.requests} requests'
        f"{' from' if inputs else ''}</p>{f'<ul>{sources}</ul>' if inputs else ''}"
        f'<div class="charts">{figures}</div>{body_tables}'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def sweep_charts(s: SweepResult, b: BatchAdvice | None) -> list[str]:
    """Per workload: output tok/s, speedup over the baseline (95% intervals, 1.00x dashed), goodput with an SLO, and
    acceptance, each against the load on a log-2 axis; then the cost of a draft token by requests in flight."""
    unit = "streams (concurrency)" if s.kind == "concurrency" else "requests/s (rate)"
    out: list[str] = []
    for n, w in enumerate(s.workloads):
        rows = [r for r in s.rows if r.workload == w]

        def lines(
            get: Callable[[LevelRow], float | None], labels: Sequence[str], rows: list[LevelRow] = rows
        ) -> list[Line]:
            return [
                (lab, [(r.level, v) for r in rows if r.label == lab and (v := get(r)) is not None]) for lab in labels
            ]

        cands = [lab for lab in s.labels if lab != s.baseline]
        hues = [s.labels.index(lab) for lab in cands]  # each configuration keeps its colour in every chart
        name = "all workloads" if w == ALL else w
        out.append(
            line_chart(
                f"sweep_tok_s_{n}",
                f"{name}: output tok/s",
                lines(lambda r: r.output_tok_s, s.labels),
                unit,
                "tok/s",
                markers=True,
                log2_x=True,
            )
        )
        whisk = [
            [(r.level, r.speedup_ci.lo, r.speedup_ci.hi) for r in rows if r.label == lab and r.speedup_ci]
            for lab in cands
        ]
        out.append(
            line_chart(
                f"sweep_speedup_{n}",
                f"{name}: speedup over {s.baseline} (95% interval)",
                lines(lambda r: r.speedup, cands),
                unit,
                "x",
                markers=True,
                log2_x=True,
                ref_y=1.0,
                whiskers=whisk,
                colors=hues,
            )
        )
        if s.slo is not None:
            out.append(
                line_chart(
                    f"sweep_goodput_{n}",
                    f"{name}: goodput",
                    lines(lambda r: r.goodput.tokens_per_s if r.goodput else None, s.labels),
                    unit,
                    "tok/s meeting the SLO",
                    markers=True,
                    log2_x=True,
                )
            )
        out.append(
            line_chart(
                f"sweep_acceptance_{n}",
                f"{name}: acceptance",
                lines(lambda r: r.acceptance_rate * 100 if r.acceptance_rate is not None else None, cands),
                unit,
                "% of draft tokens",
                markers=True,
                log2_x=True,
                y_max=100.0,
                colors=hues,
            )
        )
    if b is not None and b.buckets:
        cost = [("c", [(c.batch, c.draft_cost) for c in b.buckets if c.draft_cost is not None])]
        whisk = [[(c.batch, c.draft_cost_ci.lo, c.draft_cost_ci.hi) for c in b.buckets if c.draft_cost_ci]]
        out.append(
            line_chart(
                "draft_cost",
                "Cost of a draft token by requests in flight",
                cost,
                "requests in flight",
                "fraction of a base step",
                markers=True,
                log2_x=True,
                whiskers=whisk,
            )
        )
    return out


def render_sweep_html(
    s: SweepResult,
    b: BatchAdvice | None,
    tables: Sequence[Table],
    answer: Sequence[str],
    title: str = "specproxy sweep",
    inputs: Sequence[str] = (),
) -> str:
    figures = "".join(f"<figure>{svg}</figure>" for svg in sweep_charts(s, b))
    lines = "".join(f"<li>{escape(a.strip())}</li>" for a in answer)
    sources = "".join(f"<li>{escape(i)}</li>" for i in inputs)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1><ul>{lines}</ul>"
        f"{f'<p class=note>records:</p><ul>{sources}</ul>' if inputs else ''}"
        f'<div class="charts">{figures}</div>{"".join(_table_html(t) for t in tables)}'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
