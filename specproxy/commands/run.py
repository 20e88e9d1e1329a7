"""``specproxy run`` (load generator) and ``specproxy replay`` (re-send a recording)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path

import typer

from specproxy.analysis.inputs.runs import InputError, read_run
from specproxy.commands.common import CommandError, command, fail, run_async
from specproxy.commands.options import (
    ApiKeyOpt,
    CaptureOpt,
    ConnectTimeoutOpt,
    EngineOpt,
    IdleTimeoutOpt,
    KOpt,
    MetricsUrlOpt,
    ProgressOpt,
    TokenizerOpt,
    WaitReadyOpt,
    check_engine,
    check_writable,
    workloads_option,
)
from specproxy.commands.proxy import CAPTURES, check_tokenizer, check_url, tokenize_url
from specproxy.core.schedule import ARRIVALS, check_schedule
from specproxy.exitcodes import EXIT_FAILURE
from specproxy.loadgen.dialect_bodies import DIALECT_ENDPOINTS
from specproxy.loadgen.plan import ENDPOINTS, BodyOptions, parse_shard, plan_run_id
from specproxy.loadgen.replay import plan_replay
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.session import RunOutcome, replay, run_load
from specproxy.loadgen.summary import format_summary
from specproxy.loadgen.target import Target, TargetError
from specproxy.loadgen.workers import WorkerError
from specproxy.recorder.recorder import RecorderConfig
from specproxy.workloads import SharedPrefixes, shape_workloads

DEFAULT_REQUESTS = 100


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{name} must be positive, got {value:g}")


def _at_least(name: str, value: int | None, least: int) -> None:
    if value is not None and value < least:
        raise typer.BadParameter(f"{name} must be at least {least}, got {value}")


def _metrics(value: str, target: str) -> str | None:
    if value.lower() == "none":
        return None
    return check_url(value, "--metrics-url") if value else target + "/metrics"


def _default_out(kind: str, label: str | None, suffix: str = "") -> Path:
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:40] + "-" if label else ""
    return Path(f"specproxy-{kind}-{tag}{time.strftime('%Y%m%d-%H%M%S')}{suffix}.jsonl")


def _headers(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("Authorization", f"Bearer {api_key}"),) if api_key else ()


def _finish(outcome: RunOutcome, title: str) -> None:
    typer.echo(format_summary(outcome.summary, title=title))
    if outcome.out is not None:
        typer.echo(f"records: {outcome.out} (run_id {outcome.run_id})")
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)


def register(app: typer.Typer) -> None:
    @command(app, "run")
    def run(
        target: str = typer.Option(..., "--target", help="Base URL of the server (or of a specproxy proxy)."),
        workload: str = typer.Option(..., "--workload", help="Built-in names or files, comma-separated."),
        concurrency: int | None = typer.Option(
            None, "--concurrency", help="Closed loop: requests in flight (default 1). With --rate: a cap."
        ),
        rate: float | None = typer.Option(None, "--rate", help="Open loop: requests per second."),
        arrival: str = typer.Option("poisson", "--arrival", help="Open-loop arrivals: poisson, gamma, constant."),
        burstiness: float = typer.Option(1.0, "--burstiness", help="Gamma shape: 1 is Poisson, below 1 burstier."),
        requests: int | None = typer.Option(None, "--requests", help="Measured requests per repeat (default 100)."),
        duration: float | None = typer.Option(None, "--duration", help="Seconds of sending per repeat."),
        warmup: int = typer.Option(0, "--warmup", help="Requests sent first and not recorded."),
        repeat: int = typer.Option(1, "--repeat", help="Run the plan N times (records carry repeat=0..N-1)."),
        max_tokens: int | None = typer.Option(None, "--max-tokens", help="Override every request's max_tokens."),
        temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature (default 0)."),
        thinking: bool | None = typer.Option(
            None, "--thinking/--no-thinking", help="chat_template_kwargs.enable_thinking (default off)."
        ),
        seed: int | None = typer.Option(None, "--seed", help="Shuffle and mix workloads; seeds the arrivals."),
        label: str | None = typer.Option(None, "--label", help="Configuration label, e.g. MTP-FP8-n1."),
        out: Path | None = typer.Option(None, "--out", help="Record file (default specproxy-run-<time>.jsonl)."),
        wait_ready: WaitReadyOpt = None,
        workers: int = typer.Option(1, "--workers", help="Processes to spread the load over."),
        shard: str = typer.Option("0/1", "--shard", help="Run part i of N of the plan (e.g. 2/8)."),
        model: str | None = typer.Option(None, "--model", help="Model to request (default: first of /v1/models)."),
        endpoint: str = typer.Option(
            "chat", "--endpoint", help=f"chat, completions or another engine API: {', '.join(DIALECT_ENDPOINTS)}."
        ),
        engine: EngineOpt = "auto",
        capture: CaptureOpt = "request",
        metrics_url: MetricsUrlOpt = "",
        k: KOpt = None,
        tokenizer: TokenizerOpt = None,
        run_id: str | None = typer.Option(None, "--run-id", help="Run id in every record (shards share one)."),
        api_key: ApiKeyOpt = None,
        connect_timeout: ConnectTimeoutOpt = 10.0,
        idle_timeout: IdleTimeoutOpt = 600.0,
        progress: ProgressOpt = None,
        think_time: float | None = typer.Option(
            None, "--think-time", help="Seconds between a reply and the next turn of a conversation."
        ),
        shared_prefixes: int | None = typer.Option(
            None, "--shared-prefixes", help="Put one of N shared system prompts before requests (prefix caching)."
        ),
        prefix_tokens: int = typer.Option(1000, "--prefix-tokens", help="Tokens per shared prefix (approximate)."),
        prefix_share: float = typer.Option(1.0, "--prefix-share", help="Share of requests given a prefix (0-1)."),
    ) -> None:
        """Load generator: send workloads to a server, record every request like the proxy does, summarise."""
        tgt = check_url(target, "--target")
        for name, fvalue in (
            ("--rate", rate),
            ("--duration", duration),
            ("--wait-ready", wait_ready),
            ("--connect-timeout", connect_timeout),
            ("--idle-timeout", idle_timeout),
        ):
            _positive(name, fvalue)
        for name, ivalue, least in (
            ("--concurrency", concurrency, 1),
            ("--requests", requests, 1),
            ("--warmup", warmup, 0),
            ("--repeat", repeat, 1),
            ("--max-tokens", max_tokens, 1),
            ("--workers", workers, 1),
            ("--k", k, 1),
        ):
            _at_least(name, ivalue, least)
        if requests is not None and duration is not None:
            raise typer.BadParameter("give --requests or --duration, not both")
        if rate is not None:
            try:
                check_schedule(rate, arrival, burstiness)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
        elif arrival not in ARRIVALS:
            raise typer.BadParameter(f"--arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
        if endpoint not in ENDPOINTS and endpoint not in DIALECT_ENDPOINTS:
            names = ", ".join([*ENDPOINTS, *DIALECT_ENDPOINTS])
            raise typer.BadParameter(f"--endpoint must be one of {names}, got {endpoint!r}")
        check_engine(engine)
        if capture not in CAPTURES:
            raise typer.BadParameter(f"--capture must be one of {', '.join(CAPTURES)}, got {capture!r}")
        if temperature is not None and temperature < 0:
            raise typer.BadParameter(f"--temperature cannot be negative, got {temperature:g}")
        try:
            part = parse_shard(shard)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        processes = part.count * workers
        conc = concurrency if concurrency is not None or rate is not None else 1
        if conc is not None and conc < processes:
            raise typer.BadParameter(
                f"--concurrency {conc} is less than the {processes} processes sharing the plan (shards x workers)"
            )
        n_requests = requests if requests is not None or duration is not None else DEFAULT_REQUESTS
        tokenizer = check_tokenizer(tokenizer)
        if think_time is not None and not 0 <= think_time <= 3600:
            raise typer.BadParameter(f"--think-time must be 0 to 3600 seconds, got {think_time:g}")
        prefixes = None
        if shared_prefixes is not None:
            try:
                prefixes = SharedPrefixes(shared_prefixes, prefix_tokens, prefix_share)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
        loaded = shape_workloads(workloads_option(workload), think_time_s=think_time, prefixes=prefixes, seed=seed or 0)
        notes: tuple[str, ...] = ()
        murl = _metrics(metrics_url, tgt)
        learn_k_from = None
        if processes > 1 and not metrics_url:
            # Each process sees only its own requests: it cannot tell which share of the engine's counter deltas
            # is its own. Chunk timelines (continuous usage) and server per-request stats still give acceptance,
            # given k, which one scrape of the cumulative counters can tell.
            learn_k_from, murl = murl, None
            notes = (
                "engine counters not scraped: the load is split over several processes, so counter deltas cannot be "
                "attributed per request (acceptance comes from chunks or the server's per-request metrics)",
            )
        out_path = out or _default_out("run", label, f"-shard{part.index}of{part.count}" if part.count > 1 else "")
        check_writable(out_path)
        rid = run_id or (
            plan_run_id(loaded, (n_requests, duration, seed, label, rate, conc, endpoint, think_time))
            if part.count > 1
            else None
        )
        spec = LoadSpec(
            target=Target(tgt, _headers(api_key), connect_timeout, idle_timeout),
            workloads=loaded,
            body=BodyOptions(
                model=model or "", endpoint=endpoint, max_tokens=max_tokens, temperature=temperature, thinking=thinking
            ),
            recorder=RecorderConfig(
                record_path=str(out_path),
                metrics_url=murl,
                label=label,
                capture=capture,
                k=k,
                run_id=rid or _new_id(),
                tokenizer=tokenizer,
                tokenize_url=tokenize_url(tokenizer, tgt),
                engine=engine,
                probe_url=tgt,
            ),
            seed=seed,
            requests=n_requests,
            duration_s=duration,
            concurrency=conc,
            rate=rate,
            arrival=arrival,
            burstiness=burstiness,
            warmup=warmup,
            repeat=repeat,
            shard=part,
        )
        mode = f"rate {rate:g}/s ({arrival})" if rate is not None else f"concurrency {conc}"
        amount = f"{n_requests} requests" if n_requests is not None else f"{duration:g} s"
        typer.echo(
            f"specproxy run: {', '.join(w.name for w in loaded)} -> {tgt}, {mode}, {amount}"
            + (f" x {repeat} repeats" if repeat > 1 else "")
            + (f", shard {part.index}/{part.count}" if part.count > 1 else "")
            + (f", {workers} workers" if workers > 1 else ""),
            err=True,
        )
        outcome = run_async(
            _target_errors(
                run_load(
                    spec,
                    out=out_path,
                    workers=workers,
                    model=model,
                    wait_ready_s=wait_ready,
                    progress=progress,
                    notes=notes,
                    learn_k_from=learn_k_from,
                )
            )
        )
        _finish(outcome, f"run {spec.recorder.run_id}" + (f" ({label})" if label else ""))

    @command(app, "replay")
    def replay_cmd(
        recording: Path = typer.Argument(..., help="Record file (with its rotations) or directory of *.jsonl."),
        target: str = typer.Option(..., "--target", help="Base URL of the server to re-send to."),
        speed: float = typer.Option(1.0, "--speed", help="Divide the recorded inter-arrival times by X."),
        max_speed: bool = typer.Option(False, "--max-speed", help="Send as fast as --concurrency-cap allows."),
        concurrency_cap: int | None = typer.Option(None, "--concurrency-cap", help="Most requests in flight."),
        out: Path | None = typer.Option(None, "--out", help="Record file (default specproxy-replay-<time>.jsonl)."),
        model: str | None = typer.Option(None, "--model", help="Replace the recorded model in every body."),
        label: str | None = typer.Option(None, "--label", help="Configuration label of the new run."),
        capture: CaptureOpt = "request",
        metrics_url: MetricsUrlOpt = "",
        k: KOpt = None,
        tokenizer: TokenizerOpt = None,
        wait_ready: WaitReadyOpt = None,
        api_key: ApiKeyOpt = None,
        connect_timeout: ConnectTimeoutOpt = 10.0,
        idle_timeout: IdleTimeoutOpt = 600.0,
        progress: ProgressOpt = None,
    ) -> None:
        """Re-send a recording's requests in order with their original timing; link each to its original."""
        tgt = check_url(target, "--target")
        for name, value in (
            ("--speed", speed),
            ("--wait-ready", wait_ready),
            ("--connect-timeout", connect_timeout),
            ("--idle-timeout", idle_timeout),
        ):
            _positive(name, value)
        _at_least("--concurrency-cap", concurrency_cap, 1)
        _at_least("--k", k, 1)
        if max_speed and concurrency_cap is None:
            raise typer.BadParameter("--max-speed needs --concurrency-cap N (else every request goes at once)")
        if capture not in CAPTURES:
            raise typer.BadParameter(f"--capture must be one of {', '.join(CAPTURES)}, got {capture!r}")
        tokenizer = check_tokenizer(tokenizer)
        try:  # a stream (rotations and .gz/.zst included): the plan keeps only what it re-sends
            plan = plan_replay(
                (item.rec for item in read_run(recording)), speed=None if max_speed else speed, model=model
            )
        except InputError as e:
            fail(str(e))
        out_path = out or _default_out("replay", label)
        if out_path.resolve() == recording.resolve():
            raise typer.BadParameter("--out must not be the recording being replayed")
        check_writable(out_path)
        rcfg = RecorderConfig(
            record_path=str(out_path),
            metrics_url=_metrics(metrics_url, tgt),
            label=label,
            capture=capture,
            k=k,
            run_id=_new_id(),
            tokenizer=tokenizer,
            tokenize_url=tokenize_url(tokenizer, tgt),
        )
        pace = "max speed" if max_speed else f"speed x{speed:g}"
        typer.echo(f"specproxy replay: {len(plan.timed)} requests from {recording} -> {tgt}, {pace}", err=True)
        outcome = run_async(
            _target_errors(
                replay(
                    plan,
                    target=Target(tgt, _headers(api_key), connect_timeout, idle_timeout),
                    recorder_cfg=rcfg,
                    cap=concurrency_cap,
                    wait_ready_s=wait_ready,
                    progress=progress,
                )
            )
        )
        _finish(outcome, f"replay {rcfg.run_id} of {recording}" + (f" ({label})" if label else ""))


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


async def _target_errors(coro: Awaitable[RunOutcome]) -> RunOutcome:
    """A target that cannot be used or a worker that failed: one line, exit 1."""
    try:
        return await coro
    except (TargetError, WorkerError) as e:
        raise CommandError(str(e), EXIT_FAILURE) from None
