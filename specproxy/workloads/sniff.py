"""What a workload file holds, as the formats see it: its text (checked to be UTF-8) and the cheap decodings the
format modules look at to recognise a file of their kind.

Several formats ask the same questions (is this one JSON document? JSON lines? what is the first record?), and a
file can be large, so `WorkloadText` answers each once and keeps the answer; the reader that claims the file then
reuses the decoded document instead of parsing it again. Which format wins is the registry's business
(`registry.detect`); this module only describes the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any, Final

import orjson

from specproxy.workloads.types import WorkloadError

# A JSON workload file starts with one of these: an object, an array, or (a JSON lines file of) a prompt string.
_JSON_STARTS = ("{", "[", '"')
_JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")
# Keys of a single request or trace record: a file holding one such object is one line of JSON lines, not a
# specproxy workload file.
_RECORD_KEYS = frozenset({"messages", "prompt", "input_length"})


class _Unparsed:
    """Not one JSON value: the text did not decode, or is not a file to decode whole. Unlike a decoded `null`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNPARSED"


UNPARSED: Final = _Unparsed()
_NOT_TRIED: Final = object()  # a cache slot not filled yet (None would be a decoded JSON null)


def read_text(path: Path, source: str) -> str:
    """A file's text; a missing, unreadable or non-UTF-8 file is a `WorkloadError` naming `source` (and the line)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WorkloadError(f"{source}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkloadError(f"{source}:{line}: not UTF-8 text (byte {e.start})") from None


def loads(text: str, source: str) -> Any:
    """The text as one JSON document; broken JSON is a `WorkloadError` with its line and column."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise WorkloadError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def json_lines(text: str, source: str) -> Iterator[tuple[str, int, Any]]:
    """(where, line number, record) for each non-blank line of JSON lines; a broken line is a `WorkloadError`."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{source}:{lineno}", lineno, orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise WorkloadError(f"{source}:{lineno}: invalid JSON at column {e.colno}: {e.msg}") from None


class WorkloadText:
    """A workload file's text and its name (`source`: a path as the user gave it, or any label), before reading.

    The properties decode lazily and remember the result, which is why this is a slotted class rather than a frozen
    dataclass: the text never changes, the cached answers are filled in on first use.
    """

    __slots__ = ("_document", "_first_record", "source", "text")

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self._document: Any = _NOT_TRIED
        self._first_record: Any = _NOT_TRIED

    @property
    def suffix(self) -> str:
        return PurePath(self.source).suffix.lower()

    @property
    def first_line(self) -> str:
        """The first line after leading blank space, as a CSV header would be."""
        return self.text.lstrip().split("\n", 1)[0]

    @property
    def looks_like_json(self) -> bool:
        """Starts like JSON and is not named .csv (a file named .csv is never taken for JSON, whatever it holds)."""
        return self.suffix != ".csv" and self.text.lstrip().startswith(_JSON_STARTS)

    @property
    def document(self) -> Any:
        """The whole text decoded as one JSON value, or UNPARSED when it is not JSON or is named as JSON lines."""
        if self._document is _NOT_TRIED:
            ok = self.looks_like_json and self.suffix not in _JSON_LINES_SUFFIXES
            self._document = _decode(self.text) if ok else UNPARSED
        return self._document

    @property
    def first_record(self) -> Any:
        """The first non-blank line decoded as JSON, or UNPARSED."""
        if self._first_record is _NOT_TRIED:
            line = next((ln for ln in self.text.splitlines() if ln.strip()), "")
            self._first_record = _decode(line)
        return self._first_record

    @property
    def is_json_lines(self) -> bool:
        """One JSON value a line: named so, or not one JSON document although its first line is one, or a single
        request or trace record (an object with a record's keys and no "items") in a .json file."""
        if not self.looks_like_json:
            return False
        if self.suffix in _JSON_LINES_SUFFIXES:
            return True
        doc = self.document
        if doc is UNPARSED:
            return self.first_record is not UNPARSED
        return isinstance(doc, dict) and "items" not in doc and bool(_RECORD_KEYS & set(doc))

    def decode(self) -> Any:
        """The whole text as one JSON document, reusing the sniffed decoding; broken JSON is a `WorkloadError`."""
        doc = self._document
        return doc if doc is not _NOT_TRIED and doc is not UNPARSED else loads(self.text, self.source)


def _decode(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return UNPARSED
