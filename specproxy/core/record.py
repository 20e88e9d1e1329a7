"""The per-request record: one JSON object per line, written by the proxy and by ``specproxy run``.

The schema is documented in ``docs/records.md``. Every record carries ``schema_version``; readers accept every older
version by upgrading it through :data:`_UPGRADES` (one converter per version step), so files written by an older
specproxy keep working. Pure: :func:`parse_line` takes bytes; the thin file reading is :func:`read_records`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

SCHEMA_VERSION = 1

OUTCOMES = ("ok", "upstream_error", "upstream_reset", "client_cancelled", "timeout", "proxy_error")
SPEC_SOURCES = ("server", "chunks", "counters")

Record = dict[str, Any]


class RecordError(ValueError):
    pass


def _upgrade_0_to_1(rec: Record) -> Record:
    # Version 0 (pre-release) called the chunk timeline "timeline" and had no label.
    rec = dict(rec)
    if "timeline" in rec and "chunks" not in rec:
        rec["chunks"] = rec.pop("timeline")
    rec.setdefault("label", None)
    rec["schema_version"] = 1
    return rec


_UPGRADES: dict[int, Callable[[Record], Record]] = {0: _upgrade_0_to_1}


def upgrade(rec: Record) -> Record:
    version = rec.get("schema_version", 0)
    if not isinstance(version, int) or version < 0:
        raise RecordError(f"bad schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise RecordError(f"record schema_version {version} is newer than this specproxy reads ({SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        rec = _UPGRADES[version](rec)
        version = rec["schema_version"]
    return rec


def parse_line(line: bytes) -> Record | None:
    """One line of a record file; None for a blank line. Raises RecordError for anything else that is not a record."""
    line = line.strip()
    if not line:
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise RecordError(f"not JSON: {e}") from e
    if not isinstance(obj, dict) or "request_id" not in obj:
        raise RecordError("not a specproxy record (no request_id)")
    return upgrade(obj)


def record_files(path: Path) -> list[Path]:
    """A record file and its rotated predecessors (``x.jsonl.1``, ``x.jsonl.2`` ...), oldest first; or every
    ``*.jsonl`` in a directory."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(".jsonl") or ".jsonl." in p.name)
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, path] if path.exists() else rotated


def read_records(path: str | Path) -> Iterator[Record]:
    """Every record of a run file (with its rotations) or directory. Errors name the file and line."""
    p = Path(path)
    files = record_files(p)
    if not files:
        raise RecordError(f"{p}: no such record file or directory")
    for f in files:
        try:
            fh = f.open("rb")
        except OSError as e:
            raise RecordError(f"{f}: cannot read: {e.strerror}") from e
        with fh:
            for lineno, line in enumerate(fh, 1):
                try:
                    rec = parse_line(line)
                except RecordError as e:
                    raise RecordError(f"{f}:{lineno}: {e}") from e
                if rec is not None:
                    yield rec


_SECRET_KEY = re.compile(
    r"(?i)^(api[_-]?key|authorization|proxy[_-]?authorization|password|passwd|secret|"
    r"client[_-]?secret|access[_-]?token|refresh[_-]?token|id[_-]?token|cookie|set[_-]?cookie)$"
)
REDACTED = "[redacted]"


def redact(value: Any) -> Any:
    """A copy of a captured body with every value under a secret-looking key replaced: headers are never recorded,
    but some clients put keys in the body too."""
    if isinstance(value, dict):
        return {k: REDACTED if isinstance(k, str) and _SECRET_KEY.match(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def dumps(rec: Record) -> bytes:
    return orjson.dumps(rec) + b"\n"
