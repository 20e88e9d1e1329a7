"""A whole ``run`` or ``replay`` from the command's point of view: check the target, run (in this process or in
worker processes), read the records back, and summarise them. What the command prints and its exit code come from
the :class:`RunOutcome` returned here.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

from rich.table import Table

from specproxy.core.record import Record, read_records
from specproxy.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM
from specproxy.loadgen.live_table import LiveTable, build_table
from specproxy.loadgen.plan import iter_plan
from specproxy.loadgen.progress import ProgressLine, ProgressSnapshot, render
from specproxy.loadgen.replay import ReplayPlan, run_replay
from specproxy.loadgen.runner import DriveResult, LoadSpec, run_shard
from specproxy.loadgen.summary import RunSummary, summarize_run
from specproxy.loadgen.target import Target, counters_k, find_model, wait_ready
from specproxy.loadgen.workers import run_workers
from specproxy.recorder.recorder import RecorderConfig


@dataclass(frozen=True, slots=True)
class RunOutcome:
    summary: RunSummary
    out: Path | None
    run_id: str
    signal: int | None
    records_dropped: int = 0

    @property
    def exit_code(self) -> int:
        if self.signal == signal.SIGINT:
            return EXIT_SIGINT
        if self.signal is not None:
            return EXIT_SIGTERM
        if self.summary.failed or self.records_dropped:
            return EXIT_FAILURE
        return EXIT_OK


async def check_target(target: Target, model: str | None, *, wait_ready_s: float | None) -> str | None:
    """Wait for ``/health`` if asked, then make sure the target answers; find its model unless ``model`` is given
    (``""``: not needed). Raises TargetError."""
    async with target.session() as session:
        headers = dict(target.headers)
        if wait_ready_s is not None:
            await wait_ready(session, target.url, wait_ready_s, headers=headers)
        found = await find_model(session, target.url, model, headers=headers)
        return found or None


def _read_run(path: Path, run_id: str) -> list[Record]:
    if not path.exists():
        return []
    return [r for r in read_records(path) if r["run_id"] == run_id]


class _Live:
    """The latest progress snapshot and what shows it: the live table on a terminal, else (``--progress`` without
    a terminal, e.g. a CI log) the one line."""

    def __init__(
        self,
        total: int | None,
        duration_s: float | None,
        show: bool | None,
        per_workload: Mapping[str, int] | None = None,
    ) -> None:
        self.snap: ProgressSnapshot = {}
        self.t0 = self.snap_t = time.monotonic()
        self.total = total
        self.duration_s = duration_s
        self.per_workload = per_workload
        self.line: ProgressLine | LiveTable | None = None
        if show is not False:
            line = ProgressLine(self.text, force=bool(show))
            self.line = LiveTable(self.table) if line.enabled and _isatty(sys.stderr) else line

    def update(self, snap: ProgressSnapshot) -> None:
        self.snap = snap
        self.snap_t = time.monotonic()  # rates over the time the counts were taken at, not the time of drawing

    def text(self) -> str:
        return render(self.snap, self.snap_t - self.t0, total=self.total, duration_s=self.duration_s)

    def table(self) -> Table:
        return build_table(
            self.snap,
            self.snap_t - self.t0,
            total=self.total,
            duration_s=self.duration_s,
            per_workload=self.per_workload,
        )

    @property
    def enabled(self) -> bool:
        return isinstance(self.line, LiveTable) or (self.line is not None and self.line.enabled)


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


def planned_per_workload(spec: LoadSpec) -> dict[str, int] | None:
    """How many measured requests of each workload this machine's shard sends over all repeats, a conversation
    counting its turns (None with a duration, or for a plan too long to count up front)."""
    if spec.requests is None or spec.requests > _COUNT_UP_TO:
        return None
    counts: Counter[str] = Counter()
    for entry in spec.shard.take(islice(iter_plan(spec.workloads, spec.body, spec.seed), spec.requests)):
        counts[entry.workload] += entry.turns
    return {w: n * spec.repeat for w, n in counts.items()}


_COUNT_UP_TO = 200_000  # planned entries counted for the live table (about a second's work)


def shard_requests(spec: LoadSpec) -> int | None:
    """How many measured requests this machine's shard sends over all repeats (None with a duration)."""
    if spec.requests is None:
        return None
    return len(range(spec.shard.index, spec.requests, spec.shard.count)) * spec.repeat


async def run_load(
    spec: LoadSpec,
    *,
    out: Path,
    workers: int = 1,
    model: str | None = None,
    wait_ready_s: float | None = None,
    progress: bool | None = None,
    handle_signals: bool = True,
    notes: tuple[str, ...] = (),
    learn_k_from: str | None = None,
) -> RunOutcome:
    """``progress``: None draws the line only on a terminal, True always, False never. ``learn_k_from``: a metrics
    URL to read k from once, for runs whose recorders do not scrape (split over processes) and were given no k."""
    found = await check_target(spec.target, model, wait_ready_s=wait_ready_s)
    spec = replace(spec, body=replace(spec.body, model=found or ""))
    notes_out = list(notes)
    if learn_k_from is not None and spec.recorder.k is None:
        async with spec.target.session() as session:
            k = await counters_k(session, learn_k_from)
        if k is not None:
            spec = replace(spec, recorder=replace(spec.recorder, k=k))
            notes_out.append(f"k = {k} (num_speculative_tokens) read from the engine's counters before the run")
        else:
            notes_out.append(
                "k unknown (the engine's counters showed no drafts yet): acceptance needs --k N for a split run"
            )
    run_id = spec.recorder.run_id
    if run_id is None:
        raise ValueError("a run needs a run id (shards and workers must share it)")
    live = _Live(shard_requests(spec), spec.duration_s, progress, planned_per_workload(spec))
    reporter = live.update if live.enabled else None
    if live.line is not None:
        live.line.start()
    try:
        if workers > 1:
            result = await run_workers(spec, workers, out, on_progress=reporter)
        else:
            spec = replace(spec, recorder=replace(spec.recorder, record_path=str(out)))
            result = await run_shard(spec, reporter=reporter, handle_signals=handle_signals)
    finally:
        if live.line is not None:
            await live.line.stop()
    records = await asyncio.to_thread(_read_run, out, run_id)
    return _outcome(records, result, out, run_id, [w.name for w in spec.workloads], notes_out)


async def replay(
    plan: ReplayPlan,
    *,
    target: Target,
    recorder_cfg: RecorderConfig,
    cap: int | None,
    wait_ready_s: float | None = None,
    progress: bool | None = None,
    handle_signals: bool = True,
) -> RunOutcome:
    await check_target(target, "", wait_ready_s=wait_ready_s)
    if recorder_cfg.run_id is None or recorder_cfg.record_path is None:
        raise ValueError("a replay needs a record path and a run id")
    live = _Live(len(plan.timed), None, progress, Counter(e.workload for _, e in plan.timed))
    if live.line is not None:
        live.line.start()
    try:
        result = await run_replay(
            plan,
            target=target,
            recorder_cfg=recorder_cfg,
            cap=cap,
            reporter=live.update if live.enabled else None,
            handle_signals=handle_signals,
        )
    finally:
        if live.line is not None:
            await live.line.stop()
    out, run_id = Path(recorder_cfg.record_path), recorder_cfg.run_id
    records = await asyncio.to_thread(_read_run, out, run_id)
    return _outcome(records, result, out, run_id, plan.workloads, plan.notes())


def _outcome(
    records: list[Record], result: DriveResult, out: Path, run_id: str, order: list[str], notes: list[str]
) -> RunOutcome:
    notes = list(notes)
    if result.records_dropped:
        notes.append(f"{result.records_dropped} records could not be written to {out}")
    if result.conversations_cut:
        notes.append(
            f"{result.conversations_cut} conversations ended before their last turn (a turn failed or brought no text)"
        )
    summary = summarize_run(
        records,
        lags_s=result.lags_s,
        warmup_sent=result.warmup_sent,
        warmup_failed=result.warmup_failed,
        notes=notes,
        interrupted=result.signal is not None,
        order=order,
    )
    return RunOutcome(summary, out, run_id, result.signal, result.records_dropped)
