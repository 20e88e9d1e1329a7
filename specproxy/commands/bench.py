"""``specproxy bench``: the proxy's cost, direct versus proxied, side by side."""

from __future__ import annotations

import typer

from specproxy.commands.common import command, run_async


def register(app: typer.Typer) -> None:
    @command(app, "bench")
    def bench(
        concurrency: int = typer.Option(32, "--concurrency", help="Concurrent streams."),
        requests: int = typer.Option(128, "--requests", help="Requests per round and path."),
        max_tokens: int = typer.Option(256, "--max-tokens", help="max_tokens of each request."),
        rounds: int = typer.Option(5, "--rounds", help="Rounds, each direct then through the proxy."),
        speed: float = typer.Option(20.0, "--speed", help="Simulator speed (higher: faster chunks)."),
    ) -> None:
        """What the proxy costs: chunks/s, TTFT and chunk gaps direct vs through it, and its own time per read."""
        for name, value in (
            ("--concurrency", concurrency),
            ("--requests", requests),
            ("--max-tokens", max_tokens),
            ("--rounds", rounds),
        ):
            if value < 1:
                raise typer.BadParameter(f"{name} must be at least 1, got {value}")
        if speed <= 0:
            raise typer.BadParameter(f"--speed must be positive, got {speed}")
        from specproxy.bench import BenchConfig, run_bench

        cfg = BenchConfig(concurrency=concurrency, requests=requests, max_tokens=max_tokens, rounds=rounds, speed=speed)
        typer.echo(run_async(run_bench(cfg)))
