"""Incremental decoder for newline-delimited JSON (NDJSON / JSON Lines), as Ollama streams ``/api/chat`` and
``/api/generate`` (``Content-Type: application/x-ndjson``, one JSON object per line).

A ``feed(bytes) -> lines`` / ``flush()`` pair like :class:`specproxy.core.sse.SSEDecoder`, so a test can feed it one
byte at a time. Lines end at LF (a CR before it is dropped: JSON allows it as whitespace anyway); blank lines are
skipped; a line is decoded only once complete, so UTF-8 split across reads needs no care.
"""

from __future__ import annotations


class NDJSONDecoder:
    __slots__ = ("_line",)

    def __init__(self) -> None:
        self._line = bytearray()

    def feed(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self._line:
                self._line += chunk[start:end]
                raw = bytes(self._line)
                self._line.clear()
            else:
                raw = chunk[start:end]
            line = raw.decode("utf-8", errors="replace").strip()
            if line:
                out.append(line)
            start = end + 1
        if start < len(chunk):
            self._line += chunk[start:]
        return out

    def flush(self) -> list[str]:
        """End of stream: a last line without its newline still counts."""
        line = self._line.decode("utf-8", errors="replace").strip()
        self._line.clear()
        return [line] if line else []

    @property
    def buffered(self) -> int:
        return len(self._line)
