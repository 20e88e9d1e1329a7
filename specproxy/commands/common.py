"""Shared command plumbing: the one error boundary, command registration through it, the uvloop entry, host:port
parsing, and what several commands do alike with their options and output (a choice among values, writing the
output, rendering tables in a chosen format, one pass over record files).

Every failure a user sees is written by :func:`error_boundary`: one line on stderr and an exit code, never a
traceback; so is every warning meant for the user (``specproxy: warning: ...``, see :data:`USER_WARNINGS`). Each
command's body runs inside it (commands register with :func:`command`), and so does the whole command line
(:func:`specproxy.cli.main`), for what fails before any command runs: an unknown command, a missing or malformed
option.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import orjson
import typer
import uvloop

from specproxy.analysis.inputs.runs import InputError, read_runs, worth_a_second_process
from specproxy.analysis.inputs.scan import ChunkBatch, Item
from specproxy.analysis.tables import Table, render_csv, render_md, render_text
from specproxy.exitcodes import EXIT_SIGINT, EXIT_USAGE

T = TypeVar("T")
P = ParamSpec("P")

TABLE_FORMATS = ("table", "md", "csv", "json")


class CommandError(Exception):
    """A clean failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class Interrupted(Exception):
    """Ctrl-C ended a command's event loop before the command could stop on its own. Not a KeyboardInterrupt, which
    typer turns into a quiet exit before the boundary sees it: this one is reported (``specproxy: interrupted``)."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    raise CommandError(message, code)


def _report(line: str, code: int) -> NoReturn:
    sys.stderr.write(line + "\n")
    raise typer.Exit(code) from None


_outermost = contextvars.ContextVar("specproxy_error_boundary", default=True)


@contextlib.contextmanager
def error_boundary() -> Iterator[None]:
    """Turn a failure into one line on stderr and ``typer.Exit(code)``; a ``typer.Exit`` passes through as it is.

    Boundaries nest (the command line's around each command's), and only the outermost one reports: a usage error
    raised in a command body reaches it with its command attached (``specproxy run: error: ...``), and a Ctrl-C outside
    the event loop ends as typer ends it, quietly with 130.
    """
    if not _outermost.get():
        yield
        return
    token = _outermost.set(False)
    try:
        with _warnings_on_stderr():
            yield
    except CommandError as e:
        _report(f"specproxy: error: {e}", e.code)
    except Interrupted:
        _report("specproxy: interrupted", EXIT_SIGINT)
    except (typer.Abort, KeyboardInterrupt):
        _report("specproxy: aborted", EXIT_SIGINT)
    except typer.TyperException as e:  # typer's bundled click: UsageError / BadParameter carry exit_code 2
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "specproxy"
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        _report(f"{where}: error: {' '.join(message.split())}", getattr(e, "exit_code", EXIT_USAGE))
    finally:
        _outermost.reset(token)


# Loggers whose warnings are meant for the user of a command, not for an operator's log: a record file's partial line
# skipped (``specproxy.core.record``).
USER_WARNINGS = ("specproxy.records",)


class _WarningLine(logging.Handler):
    """``specproxy: warning: ...``, one line on stderr, next to the boundary's error lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = " ".join(record.getMessage().split())
            sys.stderr.write(f"specproxy: warning: {line}\n")  # the stderr of the moment (tests swap it)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """For a command's time, the loggers of :data:`USER_WARNINGS` write their warnings as one line each on stderr,
    and only there (not also through a log format a command set up)."""
    handler = _WarningLine(logging.WARNING)
    loggers = [logging.getLogger(name) for name in USER_WARNINGS]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
        lg.setLevel(logging.WARNING)  # whatever level the root logger was given
    try:
        yield
    finally:
        for lg, (propagate, level) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.propagate = propagate
            lg.setLevel(level)


def command(app: typer.Typer, name: str) -> Callable[[Callable[P, None]], Callable[P, None]]:
    """``@app.command(name)`` with the body run inside :func:`error_boundary`, so that a command reports its failures
    the same way however it is invoked (the ``specproxy`` entry point, or a test's bare ``typer.Typer``)."""

    def register(body: Callable[P, None]) -> Callable[P, None]:
        @functools.wraps(body)  # typer reads the options from the wrapped signature and the help from its docstring
        def bounded(*args: P.args, **kwargs: P.kwargs) -> None:
            with error_boundary():
                body(*args, **kwargs)

        app.command(name)(bounded)
        return bounded

    return register


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run one async entry point on uvloop; a Ctrl-C that ends the loop becomes :class:`Interrupted`."""
    try:
        return uvloop.run(coro)
    except KeyboardInterrupt:
        raise Interrupted from None


def parse_listen(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``PORT`` or ``[::1]:PORT``. Raises typer.BadParameter with the reason."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        host, port_s = "", value
    host = host.strip("[]") or default_host
    try:
        port = int(port_s)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT") from None
    if not 0 <= port <= 65535:
        raise typer.BadParameter(f"port {port} is out of range 0..65535")
    return host, port


def choice(value: str, allowed: Sequence[str], option: str) -> str:
    """``value`` if it is one of ``allowed``, else a clean failure naming ``option``."""
    if value not in allowed:
        fail(f"{option} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def emit(text: str, output: Path | None) -> None:
    """``text`` on stdout, or into ``output`` (a clean failure if it cannot be written)."""
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{output}: cannot write: {e.strerror or e}")


def as_json(obj: Any) -> str:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n"


def tabular(
    fmt: str, tables: list[Table], csv_data: tuple[list[str], list[list[Any]]] | None, json_obj: dict[str, Any]
) -> str:
    """The tables in one of :data:`TABLE_FORMATS` (csv needs ``csv_data``, else it is the text table)."""
    if fmt == "json":
        return as_json(json_obj)
    if fmt == "md":
        return render_md(tables)
    if fmt == "csv" and csv_data is not None:
        return render_csv(*csv_data)
    return render_text(tables)


def scan_runs(paths: Sequence[Path], *feeds: Callable[[Item, ChunkBatch], None]) -> None:
    """One pass over the runs' records into ``feeds``; a run that cannot be read is a clean failure (exit 2) naming
    the path and line."""
    batch = ChunkBatch(parallel=worth_a_second_process(paths))
    try:
        for item in read_runs(paths):
            for feed in feeds:
                feed(item, batch)
        batch.flush()
    except InputError as e:
        fail(str(e))
