"""``specproxy matrix``: measure every server configuration of a matrix file the same way, then compare them."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from specproxy.commands.common import command, fail, run_async


def register(app: typer.Typer) -> None:
    @command(app, "matrix")
    def matrix(
        path: Path | None = typer.Argument(None, help="The matrix file (YAML or JSON); see docs/matrix.md."),
        example: str | None = typer.Option(
            None, "--example", help="Print an example matrix file and exit: sim, cpu-smollm2, gpu-qwen3.5-2b."
        ),
        results: Path | None = typer.Option(
            None, "--results", help="Results folder (default: the file's 'results', else MATRIX-results/ beside it)."
        ),
        force: bool = typer.Option(False, "--force", help="Measure every configuration again, measured or not."),
        progress: bool | None = typer.Option(
            None, "--progress/--no-progress", help="Progress on stderr (default: on)."
        ),
    ) -> None:
        """Start each configuration, measure every workload with warm-up and repeats, stop it; print the table."""
        from specproxy.matrix.load import example_text, load_matrix
        from specproxy.matrix.session import run_matrix, stderr_progress
        from specproxy.matrix.spec import MatrixError

        try:
            if example is not None:
                if path is not None:
                    raise typer.BadParameter("give a matrix file or --example NAME, not both")
                typer.echo(example_text(example), nl=False)
                return
            if path is None:
                raise typer.BadParameter("missing the matrix file (or --example NAME to print one to start from)")
            spec = load_matrix(path)
            reporter = stderr_progress() if progress is not False else None
            outcome = run_async(run_matrix(spec, path, results_dir=results, force=force, on_progress=reporter))
        except MatrixError as e:
            fail(str(e))
        if reporter is not None and sys.stderr.isatty():
            sys.stderr.write("\n")
        typer.echo(outcome.text)
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
