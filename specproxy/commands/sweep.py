"""``specproxy sweep``: drive servers at a series of loads and answer, on one page, up to which load speculation pays.

One invocation runs every configuration (``--target`` alone, or ``--baseline`` and ``--candidate`` servers, each a
URL or a command started and stopped here) at the same levels with the same requests, so rows pair request by
request, then analyses what it recorded. ``--from FILE`` analyses the records of earlier sweeps instead of running.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import typer

from specproxy.analysis.figures.slo import SloSpec, parse_slo
from specproxy.analysis.html.page import render_sweep_html
from specproxy.analysis.inputs.runs import InputError, read_records_of
from specproxy.analysis.sweep.batchcost import BatchAdvice, build_batch_advice
from specproxy.analysis.sweep.model import SweepResult, build_sweep
from specproxy.analysis.sweep.render import answer_lines, batch_tables, sweep_json, sweep_tables
from specproxy.analysis.tables import render_md, render_text
from specproxy.commands.common import CommandError, command, fail, run_async
from specproxy.commands.options import check_writable, workloads_option
from specproxy.commands.proxy import check_url
from specproxy.core.record import Record, read_records
from specproxy.exitcodes import EXIT_FAILURE, EXIT_SIGINT, EXIT_SIGTERM
from specproxy.loadgen.plan import BodyOptions
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.target import Target, TargetError
from specproxy.recorder.recorder import RecorderConfig
from specproxy.sweep.drive import LevelRun, Levels, PerLevel, parse_levels, sweep_target
from specproxy.sweep.servers import Server, parse_server, serving
from specproxy.workloads import Workload

FORMATS = ("table", "md", "json", "html")


@dataclass(frozen=True, slots=True)
class SweepConfig:
    servers: tuple[Server, ...]
    levels: Levels
    workloads: tuple[Workload, ...]
    per_level: PerLevel
    body: BodyOptions
    seed: int
    warmup: int
    slo: SloSpec | None
    out: Path
    server_url: str
    ready_s: float
    max_k: int


def _echo(line: str) -> None:
    typer.echo(line, err=True)


def _level_line(label: str, run: LevelRun) -> str:
    unit = "streams" if run.kind == "concurrency" else "req/s"
    tok = f"{run.output_tok_s:.1f} tok/s" if run.output_tok_s is not None else "no tok/s"
    slo = f", SLO met {run.attainment:.0%}" if run.attainment is not None else ""
    fails = f", {run.failed} failed" if run.failed else ""
    stop = f" -> stop: {run.stop_reason}" if run.stop_reason else ""
    return f"sweep: {label} at {run.value:g} {unit}: {len(run.records)} requests, {tok}{slo}{fails}{stop}"


def _reporter(label: str) -> Callable[[LevelRun], None]:
    return lambda run: _echo(_level_line(label, run))


async def _run(cfg: SweepConfig, sweep_id: str) -> int | None:
    """Sweep every server; return the signal that stopped it, if any."""
    levels = cfg.levels
    for server in cfg.servers:
        log = cfg.out.with_name(f"{cfg.out.name}.{server.label}.log")
        async with serving(server, server_url=cfg.server_url, ready_s=cfg.ready_s, log=log) as url:
            _echo(f"sweep: {server.label}: {server.describe}")
            spec = LoadSpec(
                target=Target(url),
                workloads=cfg.workloads,
                body=cfg.body,
                recorder=RecorderConfig(record_path=str(cfg.out), metrics_url=url + "/metrics", label=server.label),
                seed=cfg.seed,
                concurrency=None,
                warmup=cfg.warmup,
            )
            runs = await sweep_target(
                spec,
                levels,
                out=cfg.out,
                sweep_id=sweep_id,
                per_level=cfg.per_level,
                slo=cfg.slo,
                on_level=_reporter(server.label),
            )
        if any(r.signal is not None for r in runs):
            return next(r.signal for r in runs if r.signal is not None)
        if levels.auto:  # every later configuration runs at the levels the first one found
            levels = Levels(levels.kind, tuple(r.value for r in runs))
    return None


def analyse(
    records: list[Record], baseline: str | None, slo: SloSpec | None, max_k: int
) -> tuple[SweepResult, BatchAdvice]:
    try:
        result = build_sweep(records, baseline, slo)
    except ValueError as e:
        fail(str(e))
    return result, build_batch_advice(records, max_k)


def render(result: SweepResult, batch: BatchAdvice, fmt: str, title: str, inputs: list[str]) -> str:
    if fmt == "json":
        return orjson.dumps(sweep_json(result, batch, inputs), option=orjson.OPT_INDENT_2).decode() + "\n"
    tables = sweep_tables(result) + batch_tables(batch)
    if fmt == "html":
        return render_sweep_html(result, batch, tables, answer_lines(result, batch), title, inputs)
    body = render_md(tables) if fmt == "md" else render_text(tables)
    return "\n".join(answer_lines(result, batch)) + "\n\n" + body


def _servers(target: str | None, label: str | None, baseline: str | None, candidates: list[str]) -> tuple[Server, ...]:
    try:
        if target is not None:
            if baseline is not None or candidates:
                raise ValueError("give --target (one server) or --baseline with --candidate, not both")
            return (parse_server(target, "--target", label or "server"),)
        if baseline is None:
            raise ValueError("give --target URL_OR_COMMAND, or --baseline and --candidate, or --from FILE")
        servers = [parse_server(baseline, "--baseline", "baseline")]
        servers += [parse_server(c, "--candidate") for c in candidates]
    except ValueError as e:
        fail(str(e))
    names = [s.label for s in servers]
    if len(set(names)) != len(names):
        fail(f"configuration labels must differ: {', '.join(names)}")
    for s in servers:
        if s.url is not None:
            check_url(s.url, s.label)
    return tuple(servers)


def register(app: typer.Typer) -> None:
    @command(app, "sweep")
    def sweep_cmd(
        target: str | None = typer.Option(None, "--target", help="One server: a URL, or a command to start."),
        label: str | None = typer.Option(None, "--label", help="Label of --target's configuration."),
        baseline: str | None = typer.Option(
            None, "--baseline", help="[LABEL=]URL_OR_COMMAND without speculation; with --from: the baseline's label."
        ),
        candidate: list[str] | None = typer.Option(
            None, "--candidate", help="LABEL=URL_OR_COMMAND of a speculative configuration (repeatable)."
        ),
        source: list[Path] | None = typer.Option(None, "--from", help="Analyse these sweep records; run nothing."),
        concurrency: str | None = typer.Option(None, "--concurrency", help="Streams per level: 1,2,4,8 or auto."),
        rate: str | None = typer.Option(None, "--rate", help="Requests/s per level (open loop): 1,2,4 or auto."),
        rate_start: float = typer.Option(1.0, "--rate-start", help="First rate of --rate auto."),
        max_level: float = typer.Option(256, "--max-level", help="Largest level --concurrency/--rate auto tries."),
        workload: str = typer.Option("ja_chat,code_agent", "--workload", help="Built-in names or files."),
        requests: int = typer.Option(32, "--requests", help="Measured requests per level, at least."),
        per_stream: int = typer.Option(4, "--requests-per-stream", help="...and this many per stream in flight."),
        max_tokens: int | None = typer.Option(None, "--max-tokens", help="Override every request's max_tokens."),
        seed: int = typer.Option(0, "--seed", help="Order of the requests (the same for every configuration)."),
        warmup: int = typer.Option(0, "--warmup", help="Unrecorded requests before each level."),
        slo: list[str] | None = typer.Option(None, "--slo", help="ttft=500ms,tpot=50ms,e2e=30s; WORKLOAD:... too."),
        min_attainment: float = typer.Option(
            0.9, "--min-attainment", help="auto stops below this share meeting the SLO."
        ),
        server_url: str = typer.Option(
            "http://127.0.0.1:8000", "--server-url", help="Where a started command serves (unless it has {port})."
        ),
        wait_ready: float = typer.Option(600.0, "--wait-ready", help="Seconds a started server has to be ready."),
        model: str | None = typer.Option(None, "--model", help="Model to request (default: first of /v1/models)."),
        max_k: int = typer.Option(8, "--max-k", help="Largest k to consider per batch size."),
        out: Path | None = typer.Option(None, "--out", help="Record file (default specproxy-sweep-<time>.jsonl)."),
        format: str = typer.Option("table", "--format", "-f", help="table, md, json or html."),
        output: Path | None = typer.Option(None, "--output", "-o", help="Write the analysis here, not stdout."),
        title: str = typer.Option("specproxy sweep", "--title", help="Title of the HTML page."),
    ) -> None:
        """Throughput, goodput, acceptance and speedup at each load; where speculation stops paying; k per batch."""
        if format not in FORMATS:
            fail(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
        try:
            slo_spec = parse_slo(slo or [])
        except ValueError as e:
            fail(str(e))
        if not 1 <= max_k <= 64:
            fail(f"--max-k must be between 1 and 64, got {max_k}")
        if source:
            if target or candidate or concurrency or rate:
                fail("--from analyses records: it takes no servers or levels")
            try:
                records = list(read_records_of(source))
            except InputError as e:
                fail(str(e))
            result, batch = analyse(records, baseline, slo_spec, max_k)
            _emit(render(result, batch, format, title, [str(p) for p in source]), output)
            return
        servers = _servers(target, label, baseline, candidate or [])
        if concurrency is not None and rate is not None:
            fail("give --concurrency or --rate, not both")
        for name, ivalue, least in (
            ("--requests", requests, 1),
            ("--requests-per-stream", per_stream, 0),
            ("--warmup", warmup, 0),
        ):
            if ivalue < least:
                fail(f"{name} must be at least {least}, got {ivalue}")
        if max_tokens is not None and max_tokens < 1:
            fail(f"--max-tokens must be at least 1, got {max_tokens}")
        for name, fvalue in (("--rate-start", rate_start), ("--max-level", max_level), ("--wait-ready", wait_ready)):
            if not fvalue > 0:
                fail(f"{name} must be positive, got {fvalue:g}")
        if not 0 < min_attainment <= 1:
            fail(f"--min-attainment must be in (0, 1], got {min_attainment:g}")
        kind = "rate" if rate is not None else "concurrency"
        try:
            levels = parse_levels(
                rate or concurrency or "auto", kind, start=rate_start if kind == "rate" else 1.0, max_value=max_level
            )
        except ValueError as e:
            fail(str(e))
        levels = Levels(levels.kind, levels.values, levels.start, levels.max_value, min_attainment=min_attainment)
        out_path = out or Path(f"specproxy-sweep-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        check_writable(out_path)
        cfg = SweepConfig(
            servers=servers,
            levels=levels,
            workloads=workloads_option(workload),
            per_level=PerLevel(requests, per_stream),
            body=BodyOptions(model=model or "", max_tokens=max_tokens),
            seed=seed,
            warmup=warmup,
            slo=slo_spec,
            out=out_path,
            server_url=check_url(server_url, "--server-url"),
            ready_s=wait_ready,
            max_k=max_k,
        )
        sweep_id = uuid.uuid4().hex[:12]
        signum = run_async(_servers_errors(_run(cfg, sweep_id)))
        records = [r for r in read_records(out_path) if (r["run_id"] or "").startswith(sweep_id + "@")]
        _echo(f"sweep: records in {out_path} (run_id {sweep_id}@<level>)")
        result, batch = analyse(records, servers[0].label if len(servers) > 1 else None, slo_spec, max_k)
        _emit(render(result, batch, format, title, [str(out_path)]), output)
        if signum is not None:
            raise typer.Exit(EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM)


async def _servers_errors(coro: Awaitable[int | None]) -> int | None:
    try:
        return await coro
    except TargetError as e:
        raise CommandError(str(e), EXIT_FAILURE) from None


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text.rstrip("\n"))
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{output}: cannot write: {e.strerror or e}")
