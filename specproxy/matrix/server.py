"""A configuration's server as a process of ours: started in a process group of its own (a new session) with its
output in a log file, waited for until healthy, stopped by its group so that no child outlives it.

Stopping: SIGTERM to the leader first (vLLM's API server shuts its engine processes down itself on it), then, after
half the grace period, SIGTERM to every process left in the group, then SIGKILL to the group when the grace period
is over. Whether a group still has members is read from ``/proc`` on Linux, where zombies (exited, waiting for
their parent) do not count; elsewhere from ``killpg(pgid, 0)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specproxy.core.errors import one_line

LOG_TAIL_LINES = 8


class ServerError(Exception):
    """The server could not be started or never became healthy; the message is one line, ``tail`` its log's end."""

    def __init__(self, message: str, tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.tail = tuple(tail)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the system's choice for port 0). Another process could take it before the
    server binds it; the server then fails to start, which is reported like any failed start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024) -> list[str]:
    """The last non-empty lines of a log file (at most ``max_bytes`` read from its end)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = data.decode(errors="replace").replace("\r", "\n")
    return [ln.rstrip()[:300] for ln in text.split("\n") if ln.strip()][-lines:]


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            out.append(int(d.name))
    return out


@dataclass(slots=True)
class ServerProcess:
    label: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.args,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,  # its own session and process group: stopped as one, apart from us
                )
            except OSError as e:
                raise ServerError(f"cannot start {self.args[0]!r}: {e.strerror or e}") from None

    @property
    def exited(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    def tail(self) -> list[str]:
        return log_tail(self.log_path)

    async def wait_healthy(self, url: str, health: str, timeout_s: float, *, fallback_models: bool) -> None:
        """Poll ``health`` (a URL, or a path under ``url``) until it answers 200; with ``fallback_models``, a 404
        there tries ``url/v1/models``. Raises ServerError when the process exits first or the time is up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last = "no answer"
        paths = [health if "://" in health else url + health]
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
            while True:
                if self.exited is not None:
                    raise ServerError(f"exited with code {self.exited} before it was healthy", self.tail())
                for path in paths:
                    try:
                        async with session.get(path, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                            await resp.read()
                            if resp.status == 200:
                                return
                            last = f"{path}: HTTP {resp.status}"
                            if resp.status == 404 and fallback_models and len(paths) == 1:
                                paths.append(url + "/v1/models")
                    except (aiohttp.ClientError, TimeoutError, OSError) as e:
                        last = f"{path}: {one_line(e, 120) or type(e).__name__}"
                left = deadline - loop.time()
                if left <= 0:
                    raise ServerError(f"not healthy after {timeout_s:g} s (last: {last})", self.tail())
                await asyncio.sleep(min(0.25, left))

    async def stop(self, grace_s: float) -> list[int]:
        """Stop the whole process group; return the PIDs that survived even SIGKILL (none, normally)."""
        proc = self.process
        if proc is None:
            return []
        pgid = proc.pid  # a session leader's process group id is its pid
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            await self._wait_group(proc, pgid, loop.time() + grace_s / 2)
        if group_members(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
            await self._wait_group(proc, pgid, deadline)
        if group_members(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            await self._wait_group(proc, pgid, loop.time() + 5.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5.0)  # reap the leader
        return group_members(pgid)

    @staticmethod
    async def _wait_group(proc: asyncio.subprocess.Process, pgid: int, until: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            if proc.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), min(0.1, max(0.0, until - loop.time())))
            if proc.returncode is not None and not group_members(pgid):
                return
            await asyncio.sleep(0.05)
