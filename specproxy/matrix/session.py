"""A whole ``specproxy matrix`` run: read the file and the workloads, derive the plan, open the results folder,
measure what is not measured yet, then read every configuration's records and print the tables.

Everything that can be wrong with the input (the file, a workload, an unset ``${NAME}``, an unusable results folder)
is found before the first server starts, and raised as :class:`MatrixError`. On SIGINT or SIGTERM the
configuration being measured is stopped (its server's process group too), what was measured is kept, and the
tables of the measured configurations are printed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from specproxy.core.record import Record, RecordError, read_records
from specproxy.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM
from specproxy.matrix.plan import MatrixPlan, build_plan
from specproxy.matrix.progress import Tracker
from specproxy.matrix.report import Failure, GroupResult, analyse, matrix_text
from specproxy.matrix.results import Results
from specproxy.matrix.runner import ConfigResult, MatrixRunner, prepare
from specproxy.matrix.spec import MatrixError, MatrixSpec
from specproxy.serving import stop_signals
from specproxy.workloads import Workload, WorkloadError, load_workload
from specproxy.workloads.builtin import builtin_names


@dataclass(frozen=True, slots=True)
class MatrixOutcome:
    text: str
    exit_code: int
    groups: tuple[GroupResult, ...]
    results: tuple[ConfigResult, ...]
    folder: Path


def results_folder(spec: MatrixSpec, matrix_path: Path, given: Path | None) -> Path:
    if given is not None:
        return given
    if spec.results is not None:
        p = Path(os.path.expanduser(spec.results))
        return p if p.is_absolute() else matrix_path.parent / p
    return matrix_path.parent / f"{matrix_path.stem}-results"


def load_workloads(spec: MatrixSpec, base: Path) -> list[Workload]:
    builtins = set(builtin_names())
    out: list[Workload] = []
    for w in spec.workloads:
        name = w
        if w not in builtins and not Path(w).is_absolute():
            name = str(base / w)  # a workload file is found next to the matrix file
        try:
            out.append(load_workload(name))
        except WorkloadError as e:
            raise MatrixError(f"workloads: {e}") from None
    names = [wl.name for wl in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MatrixError(f"workloads: the name {dup[0]!r} is used by more than one workload")
    return out


def _read(results: Results, label: str) -> list[Record]:
    path = results.records_path(label)
    if not path.exists():
        return []
    try:
        return list(read_records(path))
    except (RecordError, OSError):
        return []


async def run_matrix(
    spec: MatrixSpec,
    matrix_path: Path,
    *,
    results_dir: Path | None = None,
    force: bool = False,
    environ: Mapping[str, str] | None = None,
    on_progress: Callable[[Tracker], None] | None = None,
    handle_signals: bool = True,
) -> MatrixOutcome:
    env = dict(os.environ if environ is None else environ)
    workloads = load_workloads(spec, matrix_path.parent)
    plan: MatrixPlan = build_plan(spec, workloads)
    folder = results_folder(spec, matrix_path, results_dir).resolve()
    results = Results(folder)
    try:
        results.open()
        (folder / "cache").mkdir(exist_ok=True)
    except (OSError, ValueError) as e:
        raise MatrixError(f"results folder {folder}: {getattr(e, 'strerror', None) or e}") from None
    runner = MatrixRunner(spec, plan, results, environ=env, on_progress=on_progress)
    todo = runner.to_measure(force)
    for config in todo:
        prepare(config, folder, env, None)  # an unset ${NAME} fails now, before any server starts
    tracker = Tracker(len(todo), len(plan.warmup) + plan.measured)
    signal_seen: list[int] = []
    task = asyncio.ensure_future(runner.run(todo, tracker))

    def stop(signum: int) -> None:
        if not signal_seen:  # the first signal stops the run; the server being measured is still stopped cleanly
            signal_seen.append(signum)
            task.cancel()

    outcomes: list[ConfigResult] = []
    try:
        if handle_signals:
            with stop_signals(stop):
                outcomes = await task
        else:
            outcomes = await task
    except asyncio.CancelledError:
        if not signal_seen:
            raise
    records = {c.label: await asyncio.to_thread(_read, results, c.label) for c in spec.configurations}
    groups = analyse(spec, records)
    failures = []
    for c in spec.configurations:
        entry = results.entries.get(c.label)
        if entry is not None and entry.status != "measured":
            log = str(results.log_path(c.label)) if c.command else ""
            failures.append(Failure(c.label, entry.error or "failed", entry.log_tail, log))
    measured_now = sum(1 for o in outcomes if o.status == "measured")
    skipped = len(spec.configurations) - len(todo)
    text = matrix_text(spec, groups, failures, measured=measured_now, skipped=skipped, results=str(folder))
    if signal_seen:
        text += "\ninterrupted: the configurations measured so far are kept; rerun to measure the rest"
    try:
        (folder / "summary.txt").write_text(text + "\n", encoding="utf-8")
    except OSError as e:
        text += f"\nsummary.txt not written: {e.strerror or e}"
    if signal_seen:
        code = EXIT_SIGINT if signal_seen[0] == 2 else EXIT_SIGTERM
    else:
        code = EXIT_FAILURE if failures else EXIT_OK
    return MatrixOutcome(text, code, tuple(groups), tuple(outcomes), folder)


def stderr_progress(tty: bool | None = None) -> Callable[[Tracker], None]:
    """A reporter for :class:`MatrixRunner`: on a terminal one line redrawn in place, else one line per change of
    configuration or phase (a CI log stays short)."""
    is_tty = sys.stderr.isatty() if tty is None else tty
    last: list[str] = [""]

    def report(t: Tracker) -> None:
        key = f"{t.index} {t.phase_text}"
        if is_tty:
            line = t.line()
            sys.stderr.write("\r" + line + " " * max(0, len(last[0]) - len(line)))
            last[0] = line
        elif key != last[0]:
            last[0] = key
            sys.stderr.write(t.line() + "\n")
        sys.stderr.flush()

    return report
