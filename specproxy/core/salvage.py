"""Whole records inside a damaged line of a record file. Pure: bytes in, bytes out.

Older versions of the proxy, restarted after a write cut short, appended the next record right behind the partial
line, without ending it: ``{"schema_version": 4, "request_id": "a", ... {"schema_version": 4, "request_id": "b",
...}``. Every record starts with ``{"schema_version":``, so the whole record at the end of such a line is found by
trying those starts, left to right, a bounded number of times.
"""

from __future__ import annotations

import orjson

RECORD_START = b'{"schema_version":'
MAX_STARTS = 64  # record starts tried per line: bounded work on any line
GLUED = "skipped a partial record an older version glued the next one to; kept that one"  # the readers' warning


def glued_tail(line: bytes) -> bytes | None:
    """The whole record a line ends with, behind one or more records cut short; None when the line is not that."""
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    start = 0
    for _ in range(MAX_STARTS):
        start = line.find(RECORD_START, start + 1)
        if start < 0:
            return None
        tail = line[start:]
        try:
            obj = orjson.loads(tail)
        except orjson.JSONDecodeError:
            continue  # another cut-short record, glued too: the whole one comes later
        if isinstance(obj, dict) and "request_id" in obj:
            return tail
        return None
    return None
