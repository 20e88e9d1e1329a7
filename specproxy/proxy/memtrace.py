"""``SPECPROXY_TRACEMALLOC=DIR``: each of the proxy's processes traces its Python allocations and says what grew.

Off unless the variable names a directory. Each process (``main``, each relay, the bookkeeper) then starts
:mod:`tracemalloc` (``SPECPROXY_TRACEMALLOC_FRAMES`` frames a trace, 1 unless set), takes a snapshot once
``SPECPROXY_TRACEMALLOC_WARMUP_S`` seconds (60 unless set) have passed, and from then on, every
``SPECPROXY_TRACEMALLOC_EVERY_S`` seconds (30 unless set) and as it ends:

- appends a line to ``DIR/NAME-PID.log``: seconds since it started, the memory tracemalloc traces (MB) and the
  process's RSS (MB). RSS that grows while the traced memory stays flat is the allocator's (fragmentation, arenas
  kept), not Python objects';
- rewrites ``DIR/NAME-PID.txt``: the 40 places whose traced memory grew most since the warm-up snapshot.

``SPECPROXY_TRACEMALLOC_PROCESSES`` (names, comma-separated, such as ``sp-bookkeeper``) traces those processes
only, so that the others run at their own speed.

Tracing costs: every traced process is slower (a traced bookkeeper fell behind at a load it sustains untraced), so
a traced run is for finding what grows, not for how fast or how large the proxy is.
"""

from __future__ import annotations

import asyncio
import contextlib
import linecache
import os
import time
import tracemalloc
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

ENV = "SPECPROXY_TRACEMALLOC"
TOP = 40

T = TypeVar("T")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _snapshot() -> tracemalloc.Snapshot:
    """The traces now, less those of the tracing and reporting themselves (this module, ``tracemalloc``, the source
    lines ``linecache`` reads to format a report)."""
    return tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, __file__, all_frames=True),
            tracemalloc.Filter(False, tracemalloc.__file__, all_frames=True),
            tracemalloc.Filter(False, linecache.__file__, all_frames=True),
        ]
    )


class MemTrace:
    """One process's tracing (see the module's doc); :meth:`report` writes what it has now."""

    def __init__(self, directory: Path, name: str) -> None:
        self.base = directory / f"{name}-{os.getpid()}"
        self.start = time.monotonic()
        self.warm: tracemalloc.Snapshot | None = None
        tracemalloc.start(max(1, int(_env_float(ENV + "_FRAMES", 1))))

    def report(self) -> None:
        if not tracemalloc.is_tracing():
            return
        traced, _ = tracemalloc.get_traced_memory()
        with open(f"{self.base}.log", "a") as f:
            f.write(f"{time.monotonic() - self.start:.1f} {traced / 2**20:.3f} {_rss_mb():.3f}\n")
        if self.warm is None:
            return
        stats = _snapshot().compare_to(self.warm, "traceback")
        lines: list[str] = []
        for st in stats[:TOP]:
            lines.append(f"{st.size_diff / 1024:+.1f} KiB, {st.count_diff:+d} blocks ({st.size / 1024:.1f} KiB now):")
            lines += st.traceback.format()
        Path(f"{self.base}.txt").write_text("\n".join(lines) + "\n")

    def mark_warm(self) -> None:
        """Warm-up is over: a line of what it left, and the snapshot later reports compare with."""
        self.report()
        self.warm = _snapshot()

    async def run(self) -> None:
        await asyncio.sleep(_env_float(ENV + "_WARMUP_S", 60.0))
        self.mark_warm()
        every = max(1.0, _env_float(ENV + "_EVERY_S", 30.0))
        while True:
            await asyncio.sleep(every)
            self.report()


def from_env(name: str) -> MemTrace | None:
    """This process's tracing when ``SPECPROXY_TRACEMALLOC`` names a directory (made if missing), else None."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    only = {p.strip() for p in os.environ.get(ENV + "_PROCESSES", "").split(",") if p.strip()}
    if only and name not in only:
        return None
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    return MemTrace(path, name)


async def traced(main: Coroutine[Any, Any, T], name: str) -> T:
    """Run ``main`` (a proxy process's), traced as ``name`` when ``SPECPROXY_TRACEMALLOC`` says so."""
    trace = from_env(name)
    if trace is None:
        return await main
    task = asyncio.get_running_loop().create_task(trace.run())
    try:
        return await main
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        trace.report()
