"""``specproxy export``: runs as one table (Parquet or CSV), one row per request, read and written as a stream."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from specproxy.analysis.export import CHUNKS, FORMATS, ExportError, export
from specproxy.analysis.inputs.runs import InputError, read_runs
from specproxy.commands.common import command, fail


def register(app: typer.Typer) -> None:
    @command(app, "export")
    def export_cmd(
        runs: Annotated[
            list[Path],
            typer.Argument(metavar="RUN", help="Record files (rotations included) or directories.", show_default=False),
        ],
        output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="The table to write.")],
        format: Annotated[str, typer.Option("--format", "-f", help="parquet (needs specproxy[export]) or csv.")] = (
            "parquet"
        ),
        chunks: Annotated[
            str,
            typer.Option(
                help="Chunk timings: none, list (two list columns, Parquet only) or table (a second file, "
                "OUTPUT with .chunks before its suffix)."
            ),
        ] = "none",
    ) -> None:
        """One row per request, flat columns, for pandas, Polars or DuckDB; see docs/analysis-at-scale.md."""
        if output.is_dir():
            fail(f"{output}: is a directory; give a file name")
        try:
            n = export(read_runs(runs), output, format, chunks)
        except (ExportError, InputError) as e:
            fail(str(e))
        except OSError as e:
            fail(f"{e.filename or output}: cannot write: {e.strerror or e}")
        sys.stderr.write(f"specproxy export: {n} requests -> {output}\n")


__all__ = ["CHUNKS", "FORMATS", "register"]
