"""The live table ``run`` and ``replay`` draw on a terminal: one row per workload with requests done (of the
planned) and in flight, output tok/s, mean TTFT, acceptance, errors and time left, a total row.

Built from the same progress snapshots as the one-line display (counts taken when requests end, acceptance from the
recorder's per-workload totals), so nothing runs per chunk. Time left: a workload's requests still to finish at the
rate its requests have finished so far (a fixed plan; the run's in the title), or the rest of ``--duration``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import TextIO

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from specproxy.core.figures import acceptance_rate
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
    return _left(sum(c["done"] for c in snap.values()), total, elapsed_s)


def _left(done: float, total: int | None, elapsed_s: float) -> float | None:
    if total is None or done <= 0 or elapsed_s <= 0:
        return None
    return max(0.0, total - done) * elapsed_s / done


def build_table(
    snap: ProgressSnapshot,
    elapsed_s: float,
    *,
    total: int | None,
    duration_s: float | None,
    per_workload: Mapping[str, int] | None = None,
) -> Table:
    """``per_workload``: the requests planned for each workload (a fixed plan), for its own done/planned and time
    left."""
    t = max(elapsed_s, 1e-9)
    if per_workload is not None:
        total = sum(per_workload.values())  # turns of conversations included, as requests are counted when done
    done_all = sum(c["done"] for c in snap.values())
    head = f"{int(done_all)}/{total}" if total is not None else f"{int(done_all)}"
    left = time_left(snap, elapsed_s, total=total, duration_s=duration_s)
    table = Table(
        title=f"specproxy run: {head} requests, {_fmt_s(elapsed_s)} elapsed, {_fmt_s(left)} left",
        title_justify="left",
        expand=False,
        box=box.SIMPLE_HEAD,  # no vertical rules, collapsed padding: eight columns fit an 80-column terminal
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    for name, justify in (
        ("workload", "left"),
        ("done", "right"),
        ("in flight", "right"),
        ("tok/s", "right"),
        ("TTFT", "right"),  # mean
        ("acceptance", "right"),
        ("errors", "right"),
        ("left", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=name != "workload")  # type: ignore[arg-type]

    def row(name: str, c: dict[str, float], planned: int | None, *, style: str | None = None) -> None:
        ttft = f"{c['ttft_sum'] / c['ttft_n'] * 1000:.0f} ms" if c["ttft_n"] else "-"
        rate = acceptance_rate(c["accepted"], c["draft_tokens"])
        acc = f"{rate:.1%}" if rate is not None else "-"
        errors = int(c["errors"])
        if duration_s is not None:
            left = _fmt_s(max(0.0, duration_s - elapsed_s))
        else:
            left = _fmt_s(_left(c["done"], planned, elapsed_s))
        table.add_row(
            name,
            f"{int(c['done'])}/{planned}" if planned is not None else str(int(c["done"])),
            str(int(c["in_flight"])),
            f"{c['tokens'] / t:.0f}",
            ttft,
            acc,
            f"[red]{errors}[/red]" if errors else "0",
            left,
            style=style,
        )

    totals: dict[str, float] = {}
    for w in sorted(snap):
        row(w, snap[w], per_workload.get(w) if per_workload is not None else None)
        for k, v in snap[w].items():
            totals[k] = totals.get(k, 0.0) + v
    if len(snap) > 1:
        table.add_section()
        row("all", totals, total, style="bold")
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
