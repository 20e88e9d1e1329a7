"""The results folder of a matrix: one record file and one server log per configuration, and a small manifest.

``manifest.json`` says, per configuration label, whether it was measured (with the fingerprint of what was
measured: the plan's requests and the configuration as written) or failed (with the error and its log's last lines).
Records are written to ``LABEL.jsonl.part`` and renamed to ``LABEL.jsonl`` once the configuration is measured, so a
record file is always a whole measurement; a failed configuration's partial records stay in ``LABEL.failed.jsonl``.
A rerun skips a configuration whose manifest entry is measured with the same fingerprint and whose record file is
there. The manifest is replaced atomically (written aside, then renamed) after every configuration.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from specproxy.matrix.spec import Configuration

MANIFEST = "manifest.json"
MANIFEST_KIND = "specproxy.matrix-results"


@dataclass(frozen=True, slots=True)
class Entry:
    status: str  # "measured" or "failed"
    fingerprint: str
    error: str | None = None
    log_tail: tuple[str, ...] = ()
    records: int = 0
    seconds: float = 0.0
    finished_at: float = 0.0


def config_fingerprint(config: Configuration, plan_fingerprint: str) -> str:
    """The configuration as written (before ``${NAME}`` expansion, so no secret from the environment goes into
    the hash input) and the plan it is measured with."""
    doc = asdict(config)
    doc["env"] = dict(sorted(config.env.items()))
    h = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + plan_fingerprint.encode())
    return h.hexdigest()[:16]


class Results:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entries: dict[str, Entry] = {}

    def records_path(self, label: str) -> Path:
        return self.folder / f"{label}.jsonl"

    def partial_path(self, label: str) -> Path:
        return self.folder / f"{label}.jsonl.part"

    def failed_path(self, label: str) -> Path:
        return self.folder / f"{label}.failed.jsonl"

    def log_path(self, label: str) -> Path:
        return self.folder / f"{label}.log"

    def open(self) -> None:
        """Create the folder, read an earlier manifest. Raises OSError or ValueError (not a manifest)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / MANIFEST
        if not path.exists():
            return
        doc = orjson.loads(path.read_bytes())
        if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
            raise ValueError(f"{path} is not a specproxy matrix manifest")
        for label, e in (doc.get("configurations") or {}).items():
            if isinstance(e, dict) and isinstance(e.get("status"), str):
                self.entries[label] = Entry(
                    status=e["status"],
                    fingerprint=str(e.get("fingerprint", "")),
                    error=e.get("error"),
                    log_tail=tuple(e.get("log_tail") or ()),
                    records=int(e.get("records") or 0),
                    seconds=float(e.get("seconds") or 0.0),
                    finished_at=float(e.get("finished_at") or 0.0),
                )

    def measured(self, label: str, fingerprint: str) -> bool:
        e = self.entries.get(label)
        return (
            e is not None
            and e.status == "measured"
            and e.fingerprint == fingerprint
            and self.records_path(label).exists()
        )

    def begin(self, label: str) -> Path:
        """A fresh partial record file for ``label`` (earlier files of it are removed)."""
        for p in (self.records_path(label), self.partial_path(label), self.failed_path(label)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        return self.partial_path(label)

    def finish(self, label: str, entry: Entry) -> None:
        part = self.partial_path(label)
        if part.exists():
            os.replace(part, self.records_path(label) if entry.status == "measured" else self.failed_path(label))
        self.entries[label] = entry
        self.write()

    def write(self, order: list[str] | None = None) -> None:
        labels = order or list(self.entries)
        doc: dict[str, Any] = {
            "kind": MANIFEST_KIND,
            "version": 1,
            "updated_at": time.time(),
            "configurations": {
                label: {**asdict(self.entries[label]), "log_tail": list(self.entries[label].log_tail)}
                for label in labels
                if label in self.entries
            },
        }
        tmp = self.folder / (MANIFEST + ".tmp")
        tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.folder / MANIFEST)
