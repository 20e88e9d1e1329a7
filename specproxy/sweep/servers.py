"""The servers a sweep compares: a URL already serving, or a command the sweep starts, waits for, and stops.

``LABEL=URL_OR_COMMAND``: a value starting with ``http://`` or ``https://`` is a URL; anything else is a command,
split like a shell would (no shell runs it). A command containing ``{port}`` gets a free loopback port there and is
reached at ``http://127.0.0.1:<port>``; otherwise at the sweep's ``--server-url``. Commands run one at a time
(one accelerator, one server), each in its own process group, which is what is stopped: SIGTERM, then SIGKILL
after the grace period. Their output goes to a log file beside the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specproxy.loadgen.target import TargetError, wait_ready

STOP_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Server:
    label: str
    url: str | None  # None: started from ``command``
    command: tuple[str, ...] = ()

    @property
    def describe(self) -> str:
        return self.url if self.url is not None else shlex.join(self.command)


def parse_server(value: str, option: str, default_label: str | None = None) -> Server:
    """``LABEL=URL_OR_COMMAND`` (the label may be left out when ``default_label`` is given). Raises ValueError."""
    label, sep, rest = value.partition("=")
    if not sep or " " in label.strip() or "://" in label or not label.strip():
        if default_label is None:
            raise ValueError(f"{option} takes LABEL=URL or LABEL=COMMAND, got {value!r}")
        label, rest = default_label, value
    label, rest = label.strip(), rest.strip()
    if not rest:
        raise ValueError(f"{option} {value!r}: nothing after {label}=")
    if rest.startswith(("http://", "https://")):
        if any(c.isspace() for c in rest):
            raise ValueError(f"{option} {value!r}: a URL has no spaces")
        return Server(label, rest.rstrip("/"))
    try:
        argv = tuple(shlex.split(rest))
    except ValueError as e:
        raise ValueError(f"{option} {value!r}: cannot split the command: {e}") from None
    return Server(label, None, argv)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(server: Server, *, server_url: str, ready_s: float, log: Path) -> AsyncIterator[str]:
    """Yield the URL to drive: the server's own, or that of the command started here (stopped on the way out).
    Raises TargetError when the command exits or is not ready in ``ready_s``."""
    if server.url is not None:
        yield server.url
        return
    argv = list(server.command)
    url = server_url
    if any("{port}" in a for a in argv):
        port = free_port()
        argv = [a.replace("{port}", str(port)) for a in argv]
        url = f"http://127.0.0.1:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=fh, stderr=fh, start_new_session=True
            )
        except OSError as e:
            raise TargetError(f"{server.label}: cannot start {argv[0]!r}: {e.strerror or e}") from None
    try:
        await _ready(proc, server.label, url, ready_s, log)
        yield url
    finally:
        await _stop(proc)


async def _ready(proc: asyncio.subprocess.Process, label: str, url: str, ready_s: float, log: Path) -> None:
    async with aiohttp.ClientSession() as session:
        ready = asyncio.ensure_future(wait_ready(session, url, ready_s))
        exited = asyncio.ensure_future(proc.wait())
        try:
            await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
            if not ready.done():
                ready.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ready
        if proc.returncode is not None:
            raise TargetError(f"{label}: the server command exited with code {proc.returncode} (log: {log})")
        try:
            ready.result()
        except TargetError as e:
            raise TargetError(f"{label}: {e} (log: {log})") from None


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM to the command's process group, SIGKILL after :data:`STOP_GRACE_S`."""
    if proc.returncode is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), wait_s)
            return
        except TimeoutError:
            continue
