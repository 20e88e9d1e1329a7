"""The analysis commands: ``report``, ``compare``, ``advise`` and ``roofline``.

Each command parses its options into a frozen config, validates it (a bad value is a one-line error, exit 2), then
reads the runs once, as a stream (:func:`specproxy.analysis.inputs.runs.read_runs`), into the accumulators of
:mod:`specproxy.analysis` and renders what they add up to: memory stays bounded whatever the runs' size. Reading is
synchronous: these commands have no network IO, so they don't go through the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from specproxy.analysis.advise import render as render_advise
from specproxy.analysis.advise.gather import MAX_DETAIL_RECORDS, AdviseInput
from specproxy.analysis.advise.measured import measured_rows, with_measurements
from specproxy.analysis.advise.model import DEFAULT_MAX_K
from specproxy.analysis.compare import render as render_compare
from specproxy.analysis.compare.model import METRICS, ComparisonBuilder
from specproxy.analysis.figures.buffering import BufferingInput
from specproxy.analysis.figures.groups import DEFAULT_GROUP_BY, GROUP_FIELDS
from specproxy.analysis.figures.slo import FigureSpec, SloSpec, parse_percentiles, parse_slo
from specproxy.analysis.html.gather import ChartInput
from specproxy.analysis.html.page import render_html
from specproxy.analysis.report import render
from specproxy.analysis.report.accum import ReportBuilder
from specproxy.analysis.report.model import DEFAULT_SPEC
from specproxy.analysis.sweep.batchcost import build_batch_advice
from specproxy.analysis.tables import render_md, render_text
from specproxy.commands.common import TABLE_FORMATS, as_json, choice, command, emit, fail, scan_runs, tabular
from specproxy.commands.options import OutputOpt

REPORT_FORMATS = ("table", "md", "csv", "json", "html")
ADVISE_FORMATS = ("table", "md", "json")

RunsArg = Annotated[
    list[Path],
    typer.Argument(metavar="RUN", help="Record files (rotations included) or directories.", show_default=False),
]


@dataclass(frozen=True, slots=True)
class ReportConfig:
    runs: tuple[Path, ...]
    format: str
    by: tuple[str, ...]
    output: Path | None
    title: str
    spec: FigureSpec = DEFAULT_SPEC


SloOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--slo",
        metavar="TARGETS",
        help="Targets a request must meet, e.g. ttft=500ms,tpot=50ms,e2e=30s (any subset); WORKLOAD:... for one "
        "workload (repeatable). Adds SLO attainment and goodput.",
    ),
]
PercentilesOpt = Annotated[
    str | None,
    typer.Option("--percentiles", metavar="P,P,...", help="Latency percentiles to report, e.g. 50,90,99,99.9."),
]


def figure_spec(percentiles: str | None, slo: list[str] | None) -> FigureSpec:
    """The report's figures from ``--percentiles`` and ``--slo`` (a bad value: one line, exit 2)."""
    try:
        ps = parse_percentiles(percentiles) if percentiles is not None else None
        return FigureSpec.with_percentiles(ps, parse_slo(slo or []))
    except ValueError as e:
        fail(str(e))


def parse_by(value: str) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in value.split(",") if f.strip())
    bad = [f for f in fields if f not in GROUP_FIELDS]
    if not fields or bad:
        fail(f"--by takes a comma-separated list of {','.join(GROUP_FIELDS)}; got {value!r}")
    if len(set(fields)) != len(fields):
        fail(f"--by names a field twice: {value!r}")
    return fields


def run_report(cfg: ReportConfig) -> None:
    builder = ReportBuilder(cfg.by, cfg.spec)
    hops = BufferingInput()
    charts = ChartInput(cfg.by) if cfg.format == "html" else None
    scan_runs(cfg.runs, builder.add, hops.add, *([charts.add] if charts is not None else []))
    if charts is not None and not charts.items:  # no generation request at all: chart everything instead
        charts = ChartInput(cfg.by, only_generating=False)
        scan_runs(cfg.runs, charts.add)
    report = builder.build()
    inputs = [str(p) for p in cfg.runs]
    tables = render.report_tables(report, hops.warnings())
    if charts is not None:
        text = render_html(report, charts, tables, cfg.title, inputs)
    else:
        text = tabular(cfg.format, tables, render.report_csv(report), render.report_json(report, inputs, hops.paths()))
    emit(text, cfg.output)


@dataclass(frozen=True, slots=True)
class CompareConfig:
    runs: tuple[Path, ...]
    baseline: str | None
    metric: str
    format: str
    output: Path | None
    slo: SloSpec | None = None


def run_compare(cfg: CompareConfig) -> None:
    builder = ComparisonBuilder(cfg.slo)
    scan_runs(cfg.runs, builder.add)
    try:
        c = builder.build(cfg.baseline, cfg.metric)
    except ValueError as e:
        fail(str(e))
    text = tabular(
        cfg.format,
        render_compare.compare_tables(c),
        render_compare.compare_csv(c),
        render_compare.compare_json(c, [str(p) for p in cfg.runs]),
    )
    emit(text, cfg.output)


@dataclass(frozen=True, slots=True)
class AdviseConfig:
    runs: tuple[Path, ...]
    baseline_runs: tuple[Path, ...]
    draft_cost: float | None
    base_step_s: float | None
    max_k: int
    workloads: tuple[str, ...]
    format: str
    output: Path | None
    slo: SloSpec | None = None


def run_advise(cfg: AdviseConfig) -> None:
    data = AdviseInput(cfg.workloads)
    scan_runs(cfg.runs, data.add)
    if cfg.workloads:
        missing = [w for w in cfg.workloads if w not in data.seen]
        if missing:
            fail(f"workload {', '.join(missing)} not in the runs; workloads: {', '.join(data.seen)}")
    if cfg.baseline_runs:
        scan_runs(cfg.baseline_runs, lambda item, batch: data.add(item, batch, baseline=True))
    batch = build_batch_advice([*data.baseline_details, *data.details], cfg.max_k)
    low = next((b for b in batch.buckets if b.draft_cost is not None and b.base_step_s), None) if batch.enough else None
    advice = data.advice(
        draft_cost=cfg.draft_cost,
        base_step_s=cfg.base_step_s,
        max_k=cfg.max_k,
        lowest_load=(low.draft_cost, low.base_step_s)
        if low and low.draft_cost is not None and low.base_step_s
        else None,
    )
    measured = measured_rows(data.details, data.baseline_details, cfg.slo)
    advice = with_measurements(advice, measured)
    if data.details_dropped:
        typer.echo(
            f"specproxy: warning: the measured-speedup and batch-size tables use the first "
            f"{MAX_DETAIL_RECORDS:,} records ({data.details_dropped:,} more were read for the advice itself)",
            err=True,
        )
    if cfg.format == "json":
        doc = render_advise.advise_json(advice, [str(p) for p in cfg.runs])
        text = as_json(doc | render_advise.advise_extra_json(measured, batch))
    else:
        tables = render_advise.advise_tables(advice) + render_advise.advise_extra_tables(measured, batch)
        body = render_md(tables) if cfg.format == "md" else render_text(tables)
        text = render_advise.cost_text(advice) + "\n\n" + body
    emit(text, cfg.output)


def register(app: typer.Typer) -> None:
    @command(app, "report")
    def report_cmd(
        runs: RunsArg,
        format: Annotated[str, typer.Option("--format", "-f", help="table, md, csv, json or html.")] = "table",
        by: Annotated[str, typer.Option(help=f"Group by these fields ({','.join(GROUP_FIELDS)}).")] = ",".join(
            DEFAULT_GROUP_BY
        ),
        output: OutputOpt = None,
        title: Annotated[str, typer.Option(help="Title of the HTML report.")] = "specproxy report",
        slo: SloOpt = None,
        percentiles: PercentilesOpt = None,
    ) -> None:
        """Per workload and configuration: throughput, latency, acceptance, and where each figure came from."""
        spec = figure_spec(percentiles, slo)
        cfg = ReportConfig(tuple(runs), choice(format, REPORT_FORMATS, "--format"), parse_by(by), output, title, spec)
        run_report(cfg)

    @command(app, "compare")
    def compare_cmd(
        runs: RunsArg,
        baseline: Annotated[str | None, typer.Option(help="Label of the baseline configuration.")] = None,
        metric: Annotated[
            str, typer.Option(help="decode (median per-request decode tok/s) or output (aggregate output tok/s).")
        ] = "decode",
        format: Annotated[str, typer.Option("--format", "-f", help="table, md, csv or json.")] = "table",
        output: OutputOpt = None,
        slo: SloOpt = None,
    ) -> None:
        """Configuration | tok/s | speedup vs baseline | acceptance, per workload; medians over repeats."""
        cfg = CompareConfig(
            tuple(runs),
            baseline,
            choice(metric, METRICS, "--metric"),
            choice(format, TABLE_FORMATS, "--format"),
            output,
            figure_spec(None, slo).slo,
        )
        run_compare(cfg)

    @command(app, "advise")
    def advise_cmd(
        runs: RunsArg,
        baseline_run: Annotated[
            list[Path] | None,
            typer.Option(
                metavar="PATH", help="A run without speculation (same concurrency): measures the base step time."
            ),
        ] = None,
        draft_cost: Annotated[
            float | None,
            typer.Option(help="Cost of one draft token as a fraction of a base step (default: fitted, else 0.15)."),
        ] = None,
        base_step_ms: Annotated[float | None, typer.Option(help="Base decode step time in ms.")] = None,
        max_k: Annotated[int, typer.Option(help="Largest k to predict.")] = DEFAULT_MAX_K,
        workload: Annotated[
            list[str] | None, typer.Option(metavar="NAME", help="Only this workload (repeatable).")
        ] = None,
        format: Annotated[str, typer.Option("--format", "-f", help="table, md or json.")] = "table",
        output: OutputOpt = None,
        slo: SloOpt = None,
    ) -> None:
        """Predicted speedup per k (95% intervals), the recommended k, measured speedups and goodput, k per batch."""
        if draft_cost is not None and not 0.0 <= draft_cost <= 10.0:
            fail(f"--draft-cost must be between 0 and 10, got {draft_cost}")
        if base_step_ms is not None and not base_step_ms > 0:
            fail(f"--base-step-ms must be positive, got {base_step_ms}")
        if not 1 <= max_k <= 64:
            fail(f"--max-k must be between 1 and 64, got {max_k}")
        cfg = AdviseConfig(
            tuple(runs),
            tuple(baseline_run or ()),
            draft_cost,
            base_step_ms / 1000.0 if base_step_ms is not None else None,
            max_k,
            tuple(workload or ()),
            choice(format, ADVISE_FORMATS, "--format"),
            output,
            figure_spec(None, slo).slo,
        )
        run_advise(cfg)
