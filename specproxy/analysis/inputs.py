"""Reading runs for the analysis commands: record files (with rotations) or directories, checked and labelled.

The one IO module of :mod:`specproxy.analysis`. A record without a ``label`` takes its run's name (the file name
without ``.jsonl``, or the directory name), so runs recorded without ``--label`` still compare side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specproxy.core.record import Record, RecordError, read_records, record_files


class InputError(ValueError):
    """A run could not be read: the message is one line naming the path (and line)."""


def run_name(path: Path) -> str:
    name = path.name
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else name


def load_run(path: str | Path) -> list[Record]:
    p = Path(path)
    if p.is_dir() and not record_files(p):
        raise InputError(f"{p}: no *.jsonl record files in this directory")
    if not p.exists() and not record_files(p):
        raise InputError(f"{p}: no such record file or directory")
    try:
        records = list(read_records(p))
    except RecordError as e:
        raise InputError(str(e)) from None
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    if not records:
        raise InputError(f"{p}: no records (the file is empty; did the run finish any request?)")
    default = run_name(p)
    for rec in records:
        if rec["label"] is None:
            rec["label"] = default
    return records


def load_runs(paths: Sequence[str | Path]) -> list[Record]:
    """Every record of every run, in the order the runs were given."""
    out: list[Record] = []
    for p in paths:
        out.extend(load_run(p))
    return out
