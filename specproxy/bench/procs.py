"""The bench's processes: start them, find their URLs, read their CPU and memory from ``/proc``, stop them.

CPU and RSS are read for a process *tree* (the process and every live descendant; CPU also counts descendants that
have ended and were waited for), so a relay made of several processes (specproxy's workers, nginx's master and
workers) is measured whole.

Each process can be started on a set of CPUs (``cpus``: its affinity is set in the child before it runs Python, so
every process it starts later inherits it), so that the load and the relays under test do not take each other's
cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specproxy.proxy.names import BOOKKEEPER, RELAY_PREFIX

_URL = re.compile(rb"(http://[\d.]+:\d+)")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def named_stat(pid: int) -> tuple[str, list[str]] | None:
    """The process's name and the fields of ``/proc/PID/stat`` after it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, sep, rest = f.read().rpartition(")")  # the command name may hold spaces: split after it
    except OSError:
        return None
    return (head.partition("(")[2], rest.split()) if sep else None


def _stat(pid: int) -> list[str] | None:
    named = named_stat(pid)
    return named[1] if named is not None else None


def tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                children.setdefault(int(st[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_cpu_s(root: int) -> float:
    """User + system seconds of the tree, ended-and-waited children included (utime, stime, cutime, cstime)."""
    ticks = 0
    for pid in tree(root):
        st = _stat(pid)
        if st is not None:
            ticks += sum(int(x) for x in st[11:15])
    return ticks / _TICK


def tree_cpu_by_role(root: int) -> dict[str, float]:
    """Live processes' user + system seconds by role: specproxy names its children (:mod:`specproxy.proxy.names`)
    ``relay`` and ``bookkeeping``; everything else of the tree is ``other``; ``named`` counts the processes that had
    a role."""
    out = {"relay": 0.0, "bookkeeping": 0.0, "other": 0.0, "named": 0.0}
    for pid in tree(root):
        named = named_stat(pid)
        if named is None:
            continue
        comm, st = named
        role = "relay" if comm.startswith(RELAY_PREFIX) else "bookkeeping" if comm == BOOKKEEPER else "other"
        out["named"] += role != "other"
        out[role] += sum(int(x) for x in st[11:13]) / _TICK
    return out


def tree_rss_by_process(root: int) -> dict[str, int]:
    """RSS in bytes of each live process of the tree, by name: ``main`` for ``root``, else its ``/proc/PID/comm``
    (specproxy names its children: :mod:`specproxy.proxy.names`), with `` PID`` added when two share a name."""
    out: dict[str, int] = {}
    for pid in tree(root):
        named = named_stat(pid)
        if named is None:
            continue
        comm, st = named
        name = "main" if pid == root else comm
        if name in out:
            name = f"{comm} {pid}"
        out[name] = int(st[21]) * _PAGE
    return out


def tree_rss_bytes(root: int) -> int:
    total = 0
    for pid in tree(root):
        st = _stat(pid)
        if st is not None:
            total += int(st[21]) * _PAGE
    return total


class CpuListError(ValueError):
    """A CPU list that cannot be used here; the message says why, in one line."""


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, which a container or ``taskset`` may have narrowed)."""
    return frozenset(os.sched_getaffinity(0))


def format_cpus(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` as ``0-3,8``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpus(text: str, option: str = "--cpus", available: frozenset[int] | None = None) -> frozenset[int]:
    """``0-3,8`` (``taskset -c``'s form) as a set of CPU numbers, each of which this process may run on."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise CpuListError(f"{option} takes CPU numbers and ranges like 0-3,8, got {text!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise CpuListError(f"{option}: the range {part} runs backwards")
        cpus.update(range(lo, hi + 1))
    have = available_cpus() if available is None else available
    missing = cpus - have
    if missing:
        raise CpuListError(
            f"{option}: CPU {format_cpus(missing)} not available to this process (available: {format_cpus(have)})"
        )
    return frozenset(cpus)


def on_cpus(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that puts the child (and all it starts) on ``cpus``; None when not pinned."""
    if not cpus:
        return None
    chosen = set(cpus)

    def pin() -> None:
        os.sched_setaffinity(0, chosen)

    return pin


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Put a running process, every thread of it, on ``cpus`` (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """A started process: its URL once it listens, its pid, the last lines it wrote to stderr."""

    url: str
    pid: int
    log: deque[str] = field(default_factory=lambda: deque(maxlen=20))


class StartError(RuntimeError):
    """A process under test exited or never listened; the message holds its last words."""


async def _drain(stream: asyncio.StreamReader, log: deque[str]) -> None:
    while line := await stream.readline():
        log.append(line.decode(errors="replace").rstrip())


@contextlib.asynccontextmanager
async def python_child(
    *args: str,
    url_on: str = "stderr",
    wait_s: float = 30.0,
    cpus: frozenset[int] | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Child]:
    """``python ARGS`` (on ``cpus``, when given; ``env`` added to this process's environment); its URL is the first
    ``http://host:port`` it prints on ``url_on``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=on_cpus(cpus),
        env={**os.environ, **env} if env else None,
    )
    assert proc.stdout is not None and proc.stderr is not None
    log: deque[str] = deque(maxlen=20)
    first, other = (proc.stderr, proc.stdout) if url_on == "stderr" else (proc.stdout, proc.stderr)
    drains = [asyncio.create_task(_drain(other, log))]
    try:
        url = None
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout(wait_s):
                while url is None:
                    line = await first.readline()
                    if not line:
                        break
                    log.append(line.decode(errors="replace").rstrip())
                    m = _URL.search(line)
                    url = m.group(1).decode() if m else None
        if url is None:
            await asyncio.sleep(0.2)  # let the other stream's last words arrive
            raise StartError(" / ".join(log) or f"exited with {proc.returncode}")
        drains.append(asyncio.create_task(_drain(first, log)))
        yield Child(url, proc.pid, log)
    finally:
        await _stop(proc)
        for d in drains:
            d.cancel()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def spawn_client(
    spec: str,
    flowing: asyncio.Event | None = None,
    module: str = "specproxy.bench.client",
    cpus: frozenset[int] | None = None,
    on_line: Callable[[bytes], bool] | None = None,
) -> bytes:
    """One client process (on ``cpus``, when given); its JSON result. ``flowing`` is set once every stream has its
    first event; ``on_line`` is given every other line the client writes to stderr, and says whether it took it (a
    line it does not take is kept for the error message)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        spec,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=on_cpus(cpus),
    )
    assert proc.stdout is not None and proc.stderr is not None
    log: deque[str] = deque(maxlen=5)

    async def watch(stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            if line.strip() == b"flowing" and flowing is not None:
                flowing.set()
            elif on_line is None or not on_line(line):
                log.append(line.decode(errors="replace").rstrip())

    watcher = asyncio.create_task(watch(proc.stderr))
    out = await proc.stdout.read()
    await watcher
    if await proc.wait() != 0:
        raise StartError(f"bench client failed: {' / '.join(log)}")
    return out


def nginx_path() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def nginx_conf(tmp: Path, port: int, upstream_port: int, workers: int) -> str:
    """SSE relay as nginx documents it: no buffering either way, HTTP/1.1 with kept-alive upstream connections."""
    return f"""daemon off;
worker_processes {workers};
worker_rlimit_nofile 65536;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream_port}; keepalive 2048; }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 64m;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


@contextlib.asynccontextmanager
async def nginx(
    binary: str, upstream_url: str, workers: int = 1, cpus: frozenset[int] | None = None
) -> AsyncIterator[Child]:
    """nginx in the foreground as a child, with its own config, pid, logs and temp paths; on a free loopback port."""
    with tempfile.TemporaryDirectory(prefix="specproxy-bench-nginx-") as d:
        tmp = Path(d)
        port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(nginx_conf(tmp, port, int(upstream_url.rsplit(":", 1)[1]), workers))
        os.chmod(tmp, 0o755)  # workers may run as another user: they must reach the temp paths
        proc = await asyncio.create_subprocess_exec(
            binary,
            "-c",
            str(conf),
            "-p",
            str(tmp),
            "-e",
            str(tmp / "error.log"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=on_cpus(cpus),
        )
        try:
            for _ in range(100):
                if proc.returncode is not None:
                    break
                with contextlib.suppress(OSError):
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    w.close()
                    break
                await asyncio.sleep(0.05)
            else:
                raise StartError("nginx did not listen within 5 s")
            if proc.returncode is not None:
                err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
                log = (tmp / "error.log").read_text(errors="replace") if (tmp / "error.log").exists() else ""
                raise StartError(f"nginx exited: {(err + log).strip()[-300:]}")
            yield Child(f"http://127.0.0.1:{port}", proc.pid)
        finally:
            if proc.returncode is None:
                proc.terminate()  # SIGTERM: nginx's fast shutdown
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def client_result(out: bytes, who: str) -> dict[str, Any]:
    """A client process's JSON result; StartError (one line) when it is not a JSON object. The bytes are kept in the
    temp folder to look at."""
    try:
        doc = json.loads(out)
    except ValueError as e:
        Path(tempfile.gettempdir(), "specproxy-bench-client-output.json").write_bytes(out)
        raise StartError(
            f"the bench client's result through {who} is not JSON ({e}); kept in the temp folder"
        ) from None
    if not isinstance(doc, dict):
        raise StartError(f"the bench client's result through {who} is not a JSON object")
    return doc


def write_result(doc: bytes) -> None:
    """A client process's result, whole, on stdout. The pipe the bench reads may be non-blocking (the event loop's
    subprocess pipes are): a large result written through ``sys.stdout`` could then stop short of its end while the
    bench is busy, so the descriptor is made blocking and written to the end."""
    fd = sys.stdout.fileno()
    sys.stdout.flush()
    os.set_blocking(fd, True)
    view = memoryview(doc)
    while view:
        view = view[os.write(fd, view) :]
