"""The live table ``run`` and ``replay`` draw on a terminal: one row per workload with requests done and in flight,
output tok/s, mean TTFT, acceptance and errors, a total row, and the time left.

Built from the same progress snapshots as the one-line display (counts taken when requests end, acceptance from the
recorder's per-workload totals), so nothing runs per chunk. Time left: the requests still to send at the rate they
have finished so far (a fixed plan), or the rest of ``--duration``; per workload, its share of the plan's remaining
requests is not known ahead (a seeded plan mixes workloads at random), so the time left is the run's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from specproxy.loadgen.progress import ProgressSnapshot


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 3600:
        return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
    if seconds >= 60:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds:.0f}s"


def time_left(snap: ProgressSnapshot, elapsed_s: float, *, total: int | None, duration_s: float | None) -> float | None:
    """Seconds left: the rest of ``duration_s``, or the requests not yet finished at the rate seen so far."""
    if duration_s is not None:
        return max(0.0, duration_s - elapsed_s)
    if total is None:
        return None
    done = sum(c["done"] for c in snap.values())
    if done <= 0 or elapsed_s <= 0:
        return None
    return max(0.0, total - done) * elapsed_s / done


def build_table(snap: ProgressSnapshot, elapsed_s: float, *, total: int | None, duration_s: float | None) -> Table:
    t = max(elapsed_s, 1e-9)
    done_all = sum(c["done"] for c in snap.values())
    head = f"{int(done_all)}/{total}" if total is not None else f"{int(done_all)}"
    left = time_left(snap, elapsed_s, total=total, duration_s=duration_s)
    table = Table(
        title=f"specproxy run: {head} requests, {_fmt_s(elapsed_s)} elapsed, {_fmt_s(left)} left",
        title_justify="left",
        expand=False,
    )
    for name, justify in (
        ("workload", "left"),
        ("done", "right"),
        ("in flight", "right"),
        ("tok/s", "right"),
        ("TTFT mean", "right"),
        ("acceptance", "right"),
        ("errors", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def row(name: str, c: dict[str, float], *, style: str | None = None) -> None:
        ttft = f"{c['ttft_sum'] / c['ttft_n'] * 1000:.0f} ms" if c["ttft_n"] else "-"
        acc = f"{c['accepted'] / c['draft_tokens']:.1%}" if c["draft_tokens"] else "-"
        errors = int(c["errors"])
        table.add_row(
            name,
            str(int(c["done"])),
            str(int(c["in_flight"])),
            f"{c['tokens'] / t:.0f}",
            ttft,
            acc,
            f"[red]{errors}[/red]" if errors else "0",
            style=style,
        )

    totals: dict[str, float] = {}
    for w in sorted(snap):
        row(w, snap[w])
        for k, v in snap[w].items():
            totals[k] = totals.get(k, 0.0) + v
    if len(snap) > 1:
        table.add_section()
        row("all", totals, style="bold")
    return table


class LiveTable:
    """Redraws ``table()`` on ``stream`` (a terminal) about twice a second while running; the last one stays."""

    def __init__(self, table: Callable[[], Table], *, stream: TextIO | None = None, interval_s: float = 0.5) -> None:
        self._table = table
        self._console = Console(file=stream, stderr=stream is None)
        self._interval_s = interval_s
        self._live: Live | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._live is not None:
            return
        self._live = Live(self._table(), console=self._console, auto_refresh=False, transient=False)
        self._live.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="specproxy-live-table")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self.draw()

    def draw(self) -> None:
        if self._live is not None:
            with contextlib.suppress(OSError, ValueError):
                self._live.update(self._table(), refresh=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._live is not None:
            self.draw()
            with contextlib.suppress(OSError, ValueError):
                self._live.stop()
            self._live = None
