"""Command line: each command parses its options into a config object and runs one async entry point on uvloop."""

from __future__ import annotations

import sys

import typer

from specproxy import __version__
from specproxy.commands.common import error_boundary

app = typer.Typer(
    name="specproxy",
    help="Does speculative decoding pay off for your traffic, and how fast does your server really stream?",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from specproxy.compiled import build

        typer.echo(f"specproxy {__version__} ({build()})")  # compiled or pure-Python per-event modules
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """specproxy: measure speculative decoding and streaming speed per workload."""


def _register_commands() -> None:
    from specproxy.commands import (
        analysis,
        bench,
        demo,
        engine,
        export,
        health,
        matrix,
        proxy,
        roofline,
        run,
        sim,
        sweep,
        whatif,
    )

    demo.register(app)
    sim.register(app)
    proxy.register(app)
    run.register(app)
    analysis.register(app)
    roofline.register(app)
    export.register(app)
    bench.register(app)
    health.register(app)
    sweep.register(app)
    matrix.register(app)
    engine.register(app)
    whatif.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: failures, usage errors included, become one line on stderr and an exit code, never a traceback."""
    command = typer.main.get_command(app)
    try:
        with error_boundary():
            rv = command.main(args=argv, prog_name="specproxy", standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
