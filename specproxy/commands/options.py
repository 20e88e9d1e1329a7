"""Options that several commands declare alike, each declared once as an ``Annotated`` alias.

``run`` and ``replay`` both drive a target and record what they send, so they take the same recorder, connection and
display options; the proxy shares ``--k`` and ``--tokenizer``. Typer wants an option's default at the parameter, not
in the alias: each use gives it (the CLI tests check that the commands agree).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from specproxy.commands.common import fail
from specproxy.core.dialects.engine import ENGINE_CHOICES
from specproxy.workloads import Workload, WorkloadError, load_workloads

CaptureOpt = Annotated[str, typer.Option("--capture", help="What records keep: none, request, full.")]
MetricsUrlOpt = Annotated[
    str, typer.Option("--metrics-url", help="Engine Prometheus URL (default TARGET/metrics; 'none' to skip).")
]
KOpt = Annotated[int | None, typer.Option("--k", help="The engine's num_speculative_tokens (else learned).")]
WaitReadyOpt = Annotated[float | None, typer.Option("--wait-ready", help="Wait up to S seconds for /health.")]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", envvar="SPECPROXY_API_KEY", help="Bearer token.")]
ConnectTimeoutOpt = Annotated[float, typer.Option("--connect-timeout", help="Seconds to connect.")]
IdleTimeoutOpt = Annotated[float, typer.Option("--idle-timeout", help="Seconds without a byte from the server.")]
ProgressOpt = Annotated[bool | None, typer.Option("--progress/--no-progress", help="Progress line (default: TTY).")]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="Count text the server sends without usage with the model's tokenizer.json (a file, a folder holding "
        "one, or ORG/NAME already in the local Hugging Face cache; needs specproxy[tokenizer]), or 'server' for "
        "the engine's own POST /tokenize, once per response. Nothing is downloaded.",
    ),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="The engine behind the URL: auto (tell it from responses, /metrics and its well-known paths, and record "
        "what was found), vllm, sglang, ollama or llamacpp.",
    ),
]


def check_engine(value: str) -> str:
    if value not in ENGINE_CHOICES:
        raise typer.BadParameter(f"--engine must be one of {', '.join(ENGINE_CHOICES)}, got {value!r}")
    return value


OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write here instead of stdout.")]


def check_writable(path: Path) -> None:
    """Fail now, before any request, if the record file cannot be written; leave no empty file behind. It must be a
    file, or /dev/null: the summary reads the run's records back (a device such as /dev/full would be read forever)."""
    if path.exists() and not path.is_file() and str(path.resolve()) != os.devnull:  # /dev/null: no records kept
        fail(f"cannot write records to {path}: not a regular file (the run's summary reads its records back)")
    try:
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab"):
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        fail(f"cannot write records to {path}: {e.strerror}")


def workloads_option(value: str) -> tuple[Workload, ...]:
    """The workloads a ``--workload`` value names (comma-separated names or files), each once."""
    specs = [s.strip() for s in value.split(",") if s.strip()]
    if not specs:
        raise typer.BadParameter("--workload needs at least one workload name or file")
    loaded: list[Workload] = []
    for s in specs:
        try:
            loaded.extend(load_workloads(s))
        except WorkloadError as e:
            fail(str(e))
    names = [w.name for w in loaded]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        fail(f"--workload names {', '.join(dup)} more than once (workload names must differ)")
    return tuple(loaded)
