"""Incremental Server-Sent Events decoder, following the WHATWG event-stream parsing rules.

https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation

The decoder is a ``feed(bytes) -> events`` / ``flush()`` pair so it can be fed one byte at a time. Lines are split on
bytes (CR and LF never occur inside a multi-byte UTF-8 sequence), and a line is decoded only once it is complete, so
UTF-8 split across reads needs no special handling. Lines of any length are buffered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(slots=True)  # not frozen: made per event, and a frozen __init__ is several times slower
class SSEEvent:
    """One dispatched event. ``terminated`` is False only for an event cut off by the end of the stream."""

    data: str
    event: str = "message"
    id: str = ""
    retry_ms: int | None = None
    terminated: bool = True


class SSEDecoder:
    """Turns a byte stream into :class:`SSEEvent` values; counts comment lines (keep-alives) as it goes."""

    __slots__ = (
        "_data",
        "_data_len",
        "_event",
        "_first_line",
        "_last_id",
        "_line",
        "_pending_cr",
        "_retry_ms",
        "comments",
    )

    def __init__(self) -> None:
        self._line = bytearray()  # an incomplete line carried over from the previous feed
        self._pending_cr = False  # the previous feed ended with CR: a leading LF now belongs to it
        self._first_line = True
        self._data: list[str] = []
        self._data_len = 0
        self._event = ""
        self._last_id = ""
        self._retry_ms: int | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if (
            # The common read, one whole ``data: ...`` event and nothing else, on a clean state: what the general
            # parser below would make of it, without splitting it into lines (a read costs the proxy's bookkeeping
            # once per streamed step).
            not self._line
            and not self._data
            and not self._event
            and not self._pending_cr
            and chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            self._first_line = False
            data = chunk[6:-2].decode("utf-8", errors="replace")
            return [SSEEvent(data, "message", self._last_id, self._retry_ms, True)]
        events: list[SSEEvent] = []
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._pending_cr = chunk[-1:] == b"\r"
        start = 0
        for m in _EOL.finditer(chunk):
            if self._line:
                self._line += chunk[start : m.start()]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = chunk[start : m.start()]
            self._process(line, events)
            start = m.end()
        if start < len(chunk):
            self._line += chunk[start:]
        return events

    def flush(self) -> list[SSEEvent]:
        """End of stream. The spec discards an event not followed by a blank line; it is returned here with
        ``terminated=False`` so a recorder can keep what arrived without mistaking it for a clean event."""
        events: list[SSEEvent] = []
        if self._line:
            line = bytes(self._line)
            self._line.clear()
            self._process(line, events)
        if self._data:
            events.append(self._make_event(terminated=False))
        self._data = []
        self._data_len = 0
        self._event = ""
        return events

    @property
    def buffered(self) -> int:
        """Bytes (about) held for the event being read: a caller can bound its memory with it."""
        return len(self._line) + self._data_len

    @property
    def between_events(self) -> bool:
        """Past the stream's first line and holding nothing of an event: the next byte starts a new line of a new
        event, so a read of whole ``data:`` events can be read without this decoder and leave it as it is."""
        return not (self._line or self._data or self._event or self._pending_cr or self._first_line)

    @property
    def has_partial(self) -> bool:
        """True when bytes of an unfinished event are buffered."""
        return bool(self._line) or bool(self._data)

    def _process(self, raw: bytes, events: list[SSEEvent]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if self._first_line:
            self._first_line = False
            if line.startswith("\ufeff"):
                line = line[1:]
        if not line:
            if self._data:
                events.append(self._make_event(terminated=True))
            self._data = []
            self._data_len = 0
            self._event = ""
            return
        if line[0] == ":":
            self.comments += 1
            return
        field, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._data_len += len(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._last_id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry_ms = int(value)

    def _make_event(self, *, terminated: bool) -> SSEEvent:
        # WHATWG: an event with only "event:"/"id:" fields and no data is not dispatched (handled by callers);
        # data lines are joined with LF and the final LF removed.
        return SSEEvent(
            data="\n".join(self._data),
            event=self._event or "message",
            id=self._last_id,
            retry_ms=self._retry_ms,
            terminated=terminated,
        )
