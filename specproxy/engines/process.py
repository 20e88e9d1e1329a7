"""One engine process: started in a process group of its own on a free loopback port, healthy or a clear error with
the tail of its log, stopped by one SIGTERM to its own PID and then, if any remain, its children (its group).

Nothing here knows vLLM; :mod:`specproxy.engines.vllm_cpu` builds the command line and the environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class EngineError(Exception):
    """The engine never became healthy, or exited: a one-line message, and the tail of its log apart."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail

    def __str__(self) -> str:
        return f"{self.args[0]}\n{self.tail}" if self.tail else str(self.args[0])


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the engine binds it a moment later; :func:`start` retries a lost race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 25, max_bytes: int = 64 * 1024) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    """In the child before exec: receive SIGTERM when the process that started it dies (Linux), so a killed test run
    leaves no engine behind. It is in a session of its own, so a Ctrl-C in the terminal reaches only the parent,
    which stops it in order."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class EngineProcess:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace_s: float = 20.0) -> int | None:
        """One SIGTERM to the engine's own PID; after ``grace_s`` a SIGKILL. Then whatever is left of its process
        group (its children: vLLM's EngineCore and workers) gets a SIGKILL. Returns the exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group is the engine's own: start() made it with its PID
        return self.proc.returncode


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start(
    argv_for_port: Sequence[str],
    *,
    env: dict[str, str],
    log_path: Path,
    port: int | None = None,
    healthy_within_s: float = 240.0,
    name: str = "engine",
) -> EngineProcess:
    """Start ``argv_for_port`` (``{port}`` in any argument is replaced by the port) and wait for ``GET /health``.

    Raises :class:`EngineError` with the log's tail when the process exits or is not healthy in time (it is stopped
    first). When no port is given and the chosen one was taken meanwhile, tries once more with another.
    """
    for attempt in range(2):
        chosen = port if port is not None else free_port()
        argv = [a.replace("{port}", str(chosen)) for a in argv_for_port]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"\n=== {name}: {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        engine = EngineProcess(f"http://127.0.0.1:{chosen}", chosen, proc, log_path)
        deadline = time.monotonic() + healthy_within_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_tail(log_path)
                engine.stop()
                if port is None and attempt == 0 and "address already in use" in tail.lower():
                    break  # lost the race for the port: once more
                raise EngineError(
                    f"{name} exited with code {proc.returncode} before it was healthy (log {log_path})", tail
                )
            if _healthy(engine.url):
                return engine
            time.sleep(0.5)
        else:
            engine.stop()
            raise EngineError(
                f"{name} was not healthy within {healthy_within_s:.0f} s (log {log_path})", log_tail(log_path)
            )
    raise EngineError(f"{name} could not bind a free port (log {log_path})", log_tail(log_path))
