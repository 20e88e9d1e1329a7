"""``specproxy sim``: a vLLM stand-in with speculative decoding and ground truth, no GPU needed."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import typer

from specproxy.commands.common import CommandError, command, fail, parse_listen, run_async
from specproxy.exitcodes import EXIT_FAILURE
from specproxy.serving import stop_signals
from specproxy.sim.config import SimConfig, load_profiles


def register(app: typer.Typer) -> None:
    @command(app, "sim")
    def sim(
        listen: str = typer.Option("127.0.0.1:8000", "--listen", help="HOST:PORT to listen on (port 0: any free)."),
        spec_method: str = typer.Option("mtp", "--spec-method", help="none, mtp, ngram, eagle or draft_model."),
        k: int = typer.Option(3, "--num-speculative-tokens", "-k", help="Draft tokens per speculative step."),
        model: str = typer.Option("sim-model", "--served-model-name", help="The model name clients must send."),
        seed: int = typer.Option(0, "--seed", help="Makes text, lengths and acceptance reproducible."),
        engines: int = typer.Option(1, "--engines", help="Data-parallel engines (one 'engine' label each)."),
        max_num_seqs: int = typer.Option(256, "--max-num-seqs", help="Requests one engine runs at once."),
        per_request: str | None = typer.Option(
            None, "--per-request-spec-metrics", help="Add vLLM's per-request metrics: summary or detailed."
        ),
        stream_interval: int = typer.Option(1, "--stream-interval", help="Engine steps per SSE chunk."),
        output_lag_ms: float = typer.Option(
            0.0,
            "--output-lag-ms",
            help="A stream's writer is away this long after each chunk, as a saturated API server's is; the steps "
            "that came meanwhile go out merged in one chunk.",
        ),
        keepalive: float | None = typer.Option(None, "--keepalive", help="Seconds of silence before ': keep-alive'."),
        metrics_fault: str = typer.Option("none", "--metrics-fault", help="/metrics behaviour: none, fail, hang."),
        metrics_render_ms: float = typer.Option(
            0.0, "--metrics-render-ms", help="Each /metrics holds the server's loop this long, as vLLM's render does."
        ),
        faults: str = typer.Option(
            "", "--faults", help="Faults for every request, e.g. 'status=503,stall=2'; 'garble=0.3': a broken drafter."
        ),
        speed: float = typer.Option(1.0, "--speed", help="Time compression: 10 runs ten times faster."),
        compute_s_per_token: float = typer.Option(
            0.0,
            "--compute-s-per-token",
            help="Step time per position verified once compute-bound (e.g. 0.0002): speculation then loses at "
            "high load. 0: no compute roof.",
        ),
        prefix_caching: bool = typer.Option(
            True, "--prefix-caching/--no-prefix-caching", help="Serve repeated prompt prefixes from a cache."
        ),
        prompt_tokens_details: bool = typer.Option(
            False, "--enable-prompt-tokens-details", help="Report cached prompt tokens in usage, as vLLM's flag does."
        ),
        profiles: Path | None = typer.Option(None, "--profiles", help="JSON file of acceptance profiles."),
        max_tokens: int = typer.Option(256, "--default-max-tokens", help="max_tokens when a request sends none."),
        dialect: str = typer.Option(
            "vllm", "--dialect", help="Engine to pose as: vllm, sglang, ollama, llamacpp (/metrics, headers)."
        ),
    ) -> None:
        """Simulated vLLM with speculative decoding and readable ground truth (GET /sim/requests/{id})."""
        host, port = parse_listen(listen)
        cfg = SimConfig(
            host=host,
            port=port,
            served_model_name=model,
            seed=seed,
            spec_method=spec_method,
            num_speculative_tokens=k,
            engines=engines,
            max_num_seqs=max_num_seqs,
            per_request_spec_metrics=per_request,
            stream_interval=stream_interval,
            output_lag_ms=output_lag_ms,
            keepalive_s=keepalive,
            metrics_fault=metrics_fault,
            metrics_render_ms=metrics_render_ms,
            request_faults=faults,
            speed=speed,
            compute_s_per_token=compute_s_per_token,
            default_max_tokens=max_tokens,
            prompt_tokens_details=prompt_tokens_details,
            dialect=dialect,
        )
        if not prefix_caching:
            cfg = replace(cfg, prefix_cache_entries=0)
        if profiles is not None:
            try:
                cfg = replace(cfg, profiles=load_profiles(profiles))
            except (OSError, ValueError) as e:
                fail(f"--profiles {profiles}: {e}")
        try:
            cfg.validate()
        except ValueError as e:
            fail(str(e))
        run_async(_main(cfg))


async def _main(cfg: SimConfig) -> None:
    from specproxy.sim.server import SimHandle, serve

    def listening(h: SimHandle) -> None:
        method = cfg.spec_method if cfg.spec_method == "none" else f"{cfg.spec_method} k={cfg.num_speculative_tokens}"
        typer.echo(f"specproxy sim: {h.url} (model {cfg.served_model_name}, {method})", err=True)

    stop = asyncio.Event()
    with stop_signals(lambda _signum: stop.set()):
        task = asyncio.create_task(serve(cfg, on_listening=listening))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            stopper.cancel()
            exc = task.exception()
            if isinstance(exc, OSError):
                raise CommandError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}", EXIT_FAILURE)
            if exc is not None:
                raise exc
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
