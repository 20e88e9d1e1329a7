"""``specproxy bench``: direct, specproxy and nginx side by side; ``--hostile``: what single inputs do to streams."""

from __future__ import annotations

import typer

from specproxy.commands.common import CommandError, command, run_async
from specproxy.exitcodes import EXIT_FAILURE


def _levels(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"--streams takes counts like 1,64,256, got {value!r}") from None
    if not out or min(out) < 1:
        raise typer.BadParameter(f"--streams takes counts of at least 1, got {value!r}")
    return out


def _workers(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"--workers takes N or a list like 1,2,4,8, got {value!r}") from None
    if not out or min(out) < 1:
        raise typer.BadParameter(f"--workers must be at least 1, got {value!r}")
    return out


def _cpus(option: str, value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    from specproxy.bench.procs import CpuListError, parse_cpus

    try:
        return parse_cpus(value, option)
    except CpuListError as e:
        raise typer.BadParameter(str(e)) from None


def _soak_tokens(value: str) -> tuple[int, int]:
    """MIN-MAX events per soak stream; at least 2 each (a cancel or a reset falls after the first event)."""
    lo, sep, hi = value.partition("-")
    try:
        out = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise typer.BadParameter(f"--soak-tokens takes MIN-MAX events like 4-8, got {value!r}") from None
    if out[0] < 2 or out[1] < out[0]:
        raise typer.BadParameter(f"--soak-tokens takes MIN-MAX with 2 <= MIN <= MAX, got {value!r}")
    return out


def register(app: typer.Typer) -> None:
    @command(app, "bench")
    def bench(
        streams: str = typer.Option("1,64,256,1024", "--streams", help="Stream levels, comma-separated."),
        tokens: int = typer.Option(150, "--tokens", help="Events per stream."),
        steps_per_s: float = typer.Option(25.0, "--steps-per-s", help="Events per second per stream upstream."),
        workers: str | None = typer.Option(
            None,
            "--workers",
            help="N for the `specproxy proxy --workers N` row beside --workers 1, or a list (1,2,4,8): a row each.",
        ),
        clients: int = typer.Option(1, "--clients", help="Client processes the streams are spread over."),
        upstreams: int = typer.Option(1, "--upstreams", help="Upstream processes on one port (SO_REUSEPORT)."),
        upstream_batch: int = typer.Option(
            1, "--upstream-batch", help="Events per upstream write at saturation (fewer system calls for the load)."
        ),
        cpus_upstream: str | None = typer.Option(
            None, "--cpus-upstream", help="CPUs for the upstream processes, as taskset -c takes them (0-2)."
        ),
        cpus_client: str | None = typer.Option(
            None, "--cpus-client", help="CPUs for the client processes and the bench itself (3-6)."
        ),
        cpus_relays: str | None = typer.Option(
            None, "--cpus-relays", help="CPUs for every relay, all its processes (7-15)."
        ),
        cpus_bookkeeper: str | None = typer.Option(
            None, "--cpus-bookkeeper", help="CPUs for specproxy's bookkeeping process (default: the relays')."
        ),
        relay_each: bool = typer.Option(
            False, "--relay-each", help="Each specproxy relay process on one CPU of --cpus-relays, in turn."
        ),
        burst: int = typer.Option(
            0, "--burst", help="Also this many streams started at once (paced): TTFT under a burst. 0: none."
        ),
        burst_tokens: int = typer.Option(20, "--burst-tokens", help="Events per stream of --burst."),
        saturation_streams: int = typer.Option(64, "--saturation-streams", help="Streams at saturation."),
        saturation_tokens: int = typer.Option(1000, "--saturation-tokens", help="Events per stream at saturation."),
        no_nginx: bool = typer.Option(False, "--no-nginx", help="Leave nginx out."),
        floors: bool = typer.Option(
            False, "--floors", help="Add two reference relays: a uvloop TCP splice and an aiohttp pass-through."
        ),
        aiohttp_door: bool = typer.Option(
            False,
            "--aiohttp-door",
            help="Add the row specproxy --workers 1 --no-fast-lane: every request read by aiohttp's server.",
        ),
        observer: bool = typer.Option(
            False,
            "--observer",
            help="Measure what scraping /metrics costs the engine instead (TTFT with it on and off, interleaved). "
            "For a real engine: python -m specproxy.bench.observer --upstream URL.",
        ),
        hostile: bool = typer.Option(False, "--hostile", help="Measure the hostile inputs instead."),
        soak: float = typer.Option(
            0.0, "--soak", help="Seconds of streams with cancels and resets instead: is memory flat? (600: 10 min)"
        ),
        soak_streams: int = typer.Option(64, "--soak-streams", help="Streams in flight during --soak."),
        soak_rate: float = typer.Option(
            0.0, "--soak-rate", help="Requests started per second during --soak, at most (0: as fast as they end)."
        ),
        soak_tokens: str = typer.Option("20-200", "--soak-tokens", help="Events per stream during --soak: MIN-MAX."),
        hostile_streams: int = typer.Option(64, "--hostile-streams", help="Streams each way during --hostile."),
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Added per-event latency, TTFT, CPU and memory of specproxy and nginx against direct, in one run."""
        levels = _levels(streams)
        rows = _workers(workers)
        pins = {
            "cpus_upstream": _cpus("--cpus-upstream", cpus_upstream),
            "cpus_client": _cpus("--cpus-client", cpus_client),
            "cpus_relays": _cpus("--cpus-relays", cpus_relays),
            "cpus_bookkeeper": _cpus("--cpus-bookkeeper", cpus_bookkeeper),
        }
        if rows is not None and len(rows) > 1 and hostile:
            raise typer.BadParameter("--hostile takes one --workers N, not a list")
        if relay_each and pins["cpus_relays"] is None:
            raise typer.BadParameter("--relay-each needs --cpus-relays")
        if burst < 0:
            raise typer.BadParameter(f"--burst takes streams (0: none), got {burst}")
        for name, value in (
            ("--tokens", tokens),
            ("--clients", clients),
            ("--upstreams", upstreams),
            ("--upstream-batch", upstream_batch),
            ("--burst-tokens", burst_tokens),
            ("--saturation-streams", saturation_streams),
            ("--saturation-tokens", saturation_tokens),
            ("--hostile-streams", hostile_streams),
        ):
            if value < 1:
                raise typer.BadParameter(f"{name} must be at least 1, got {value}")
        if steps_per_s <= 0:
            raise typer.BadParameter(f"--steps-per-s must be positive, got {steps_per_s}")
        if soak < 0 or soak_streams < 1 or soak_rate < 0:
            raise typer.BadParameter("--soak takes seconds (0: off), --soak-streams at least 1, --soak-rate 0 or more")
        soak_min, soak_max = _soak_tokens(soak_tokens)
        if fmt not in ("table", "json"):
            raise typer.BadParameter(f"--format must be table or json, got {fmt!r}")
        from specproxy.bench.config import BenchConfig
        from specproxy.bench.render import as_json, render_hostile, render_levels

        cfg = BenchConfig(
            streams=levels,
            tokens=tokens,
            steps_per_s=steps_per_s,
            workers=max(rows) if rows else None,
            worker_rows=rows,
            clients=clients,
            upstreams=upstreams,
            upstream_batch=upstream_batch,
            burst=burst,
            relay_each=relay_each,
            burst_tokens=burst_tokens,
            **pins,
            saturation_streams=saturation_streams,
            saturation_tokens=saturation_tokens,
            use_nginx=not no_nginx,
            hostile_streams=hostile_streams,
            floors=floors,
            aiohttp_door=aiohttp_door,
        )
        from specproxy.bench.procs import StartError

        try:
            if observer:
                from specproxy.bench.observer import main as observer_main

                rc = observer_main(["--format", fmt])
                if rc:
                    raise CommandError("bench: the observer measurement failed", EXIT_FAILURE)
            elif soak:
                from specproxy.bench.soak import SoakConfig, render_soak, run_soak

                soak_cfg = SoakConfig(
                    seconds=soak,
                    streams=soak_streams,
                    steps_per_s=steps_per_s,
                    min_tokens=soak_min,
                    max_tokens=soak_max,
                    rate=soak_rate,
                )
                soaked = run_async(run_soak(soak_cfg))
                typer.echo(as_json(soaked) if fmt == "json" else render_soak(soaked))
            elif hostile:
                from specproxy.bench.hostile import run_hostile

                result = run_async(run_hostile(cfg))
                typer.echo(as_json(result) if fmt == "json" else render_hostile(result))
            else:
                from specproxy.bench.run import run_levels

                result = run_async(run_levels(cfg))
                typer.echo(as_json(result) if fmt == "json" else render_levels(result))
        except StartError as e:  # a process of the bench did not start, or its result was unreadable
            raise CommandError(f"bench: {e}", EXIT_FAILURE) from None
