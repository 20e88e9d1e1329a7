"""Shared command plumbing: uvloop entry, one-line errors, host:port parsing."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

import typer
import uvloop

from specproxy.exitcodes import EXIT_SIGINT, EXIT_USAGE

T = TypeVar("T")


class CommandError(Exception):
    """A clean failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    raise CommandError(message, code)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run one async entry point on uvloop. CommandError and Ctrl-C become a one-line message and an exit code."""
    try:
        return uvloop.run(coro)
    except CommandError as e:
        sys.stderr.write(f"specproxy: error: {e}\n")
        raise typer.Exit(e.code) from None
    except KeyboardInterrupt:
        sys.stderr.write("specproxy: interrupted\n")
        raise typer.Exit(EXIT_SIGINT) from None


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


async def wait_forever() -> None:
    await asyncio.Event().wait()
