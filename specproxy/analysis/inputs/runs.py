"""Reading runs for the analysis commands, as a stream: record files with their rotations (compressed or not), or
directories, checked and labelled.

The IO module of :mod:`specproxy.analysis` (with :mod:`.sources`, which lists and decompresses the files). Records
come one at a time as :class:`specproxy.analysis.inputs.scan.Item` (the record, its chunk timeline still as bytes), so
no command holds a run in memory. A record without a ``label`` takes its run's name (the file name without rotation
number, ``.gz``/``.zst`` and ``.jsonl``, or the directory name), so runs recorded without ``--label`` still compare
side by side.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from specproxy.analysis.inputs.scan import Item, decode_line
from specproxy.analysis.inputs.sources import SourceError, file_lines, run_files, run_name
from specproxy.core.inference import is_inference
from specproxy.core.record import NotJSONError, Reconciler, Record, RecordError, cut_short, log
from specproxy.core.salvage import GLUED, glued_tail

__all__ = ["InputError", "read_records_of", "read_run", "read_runs", "run_name", "worth_a_second_process"]


class InputError(ValueError):
    """A run could not be read: the message is one line naming the path (and line)."""


def _items(path: Path) -> Iterator[Item]:
    merge: Reconciler[Item] = Reconciler(lambda item: item.rec, lambda item, rec: item.corrected(rec))
    for f in run_files(path):
        for lineno, line, complete in file_lines(f):
            try:
                item = decode_line(line)
            except NotJSONError as e:
                if not complete:
                    log.warning("%s: skipped a partial last line (a write cut short)", f.path)
                    continue
                if cut_short(line):
                    log.warning("%s:%d: skipped a partial line (a write cut short, then appended to)", f.path, lineno)
                    continue
                if (tail := glued_tail(line)) is None:
                    raise RecordError(f"{f.path}:{lineno}: {e}") from e
                log.warning("%s:%d: %s", f.path, lineno, GLUED)
                item = decode_line(tail)
            except RecordError as e:
                raise RecordError(f"{f.path}:{lineno}: {e}") from e
            if item is not None:
                yield from merge.feed(item)
    yield from merge.rest()


def read_run(path: str | Path) -> Iterator[Item]:
    """Every record of one run, in file order (oldest rotation first), labelled. Raises InputError (one line)."""
    p = Path(path)
    default = run_name(p)
    n = passed = 0
    try:
        for item in _items(p):
            n += 1
            if not is_inference(item.rec["method"], item.rec["path"]):
                passed += 1  # an older specproxy recorded every request relayed: not a workload's
                continue
            if item.rec["label"] is None:
                item.rec["label"] = default
            yield item
    except (SourceError, RecordError) as e:
        raise InputError(str(e)) from None
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    if not n:
        raise InputError(f"{p}: no records (the file is empty; did the run finish any request?)")
    if passed:
        log.warning(
            "%s: left out %d records of requests that are not inference (GET /metrics, /health, ...)", p, passed
        )


PARALLEL_BYTES = 64 * 1024 * 1024


def worth_a_second_process(paths: Sequence[str | Path]) -> bool:
    """Whether the runs are big enough (:data:`PARALLEL_BYTES` on disk) for a second process to pay for its start."""
    total = 0
    for p in paths:
        try:
            total += sum(f.path.stat().st_size * (8 if f.compression else 1) for f in run_files(Path(p)))
        except (OSError, SourceError):
            continue  # reading it will say what is wrong
    return total >= PARALLEL_BYTES


def read_runs(paths: Sequence[str | Path]) -> Iterator[Item]:
    """Every record of every run, in the order the runs were given."""
    for p in paths:
        yield from read_run(p)


def read_records_of(paths: Sequence[str | Path]) -> Iterator[Record]:
    """Whole records (chunk timelines typed again), for the few readers that need them one at a time."""
    for item in read_runs(paths):
        yield item.full()
