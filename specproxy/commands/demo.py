"""``specproxy demo``: the simulator, the proxy, the load generator and the analysis together, in one command."""

from __future__ import annotations

from pathlib import Path

import typer

from specproxy.commands.common import command, run_async
from specproxy.demo import DemoConfig


def register(app: typer.Typer) -> None:
    @command(app, "demo")
    def demo(
        requests: int = typer.Option(7, "--requests", help="Requests per workload and configuration."),
        max_tokens: int = typer.Option(128, "--max-tokens", help="max_tokens of every request."),
        seed: int = typer.Option(0, "--seed", help="Seed of the simulator and the request order."),
        out: Path | None = typer.Option(None, "--out", help="Keep the proxy's records in this folder."),
    ) -> None:
        """A demonstration on the built-in simulator: Base vs MTP k=1,3,5 on ja_chat and code_agent."""
        if requests < 1 or requests > 1000:
            raise typer.BadParameter(f"--requests must be within 1..1000, got {requests}")
        if max_tokens < 1:
            raise typer.BadParameter(f"--max-tokens must be positive, got {max_tokens}")
        from specproxy.demo import run_demo

        result = run_async(run_demo(DemoConfig(requests=requests, max_tokens=max_tokens, seed=seed, out_dir=out)))
        typer.echo(result.text)
