"""The bench's wire format, pure: stamped SSE events framed as HTTP chunks, and the scan that reads the stamps back.

Every event carries ``"t_ns"``: ``CLOCK_MONOTONIC`` in nanoseconds when the upstream wrote it. That clock is one per
machine, so a client process subtracts it from its own reading of the same clock on receipt.
"""

from __future__ import annotations

import re
import time

STAMP_KEY = b'"t_ns":'
STAMP = re.compile(rb'"t_ns":(\d+)')
DONE = b"data: [DONE]\n\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def now_ns() -> int:
    """The one clock of the bench: CLOCK_MONOTONIC, comparable across processes of one machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def event(stream_id: int, t_ns: int, finish: bool = False, tokens: int = 1) -> bytes:
    """One OpenAI chat-completion chunk as an SSE event of ``tokens`` tokens, stamped with its send time."""
    reason = b'"stop"' if finish else b"null"
    return (
        b'data: {"id":"chatcmpl-bench%d","object":"chat.completion.chunk","created":0,"model":"bench",'
        b'"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}],"t_ns":%d}\n\n'
        % (stream_id, b"tok " * tokens, reason, t_ns)
    )


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class StampScan:
    """Feed the bytes of one response as they arrive; returns the stamps of the events completed by each read.

    Events split across reads are kept until their blank line arrives (SSE events end with an empty line).
    """

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def _complete(self, data: bytes) -> tuple[bytes, int]:
        """``data`` after what an earlier read left, and where its last complete event ends (-1: none; the rest is
        kept for the next read)."""
        if self._tail:
            data = self._tail + data
        end = data.rfind(b"\n\n")
        self._tail = data if end < 0 else data[end + 2 :]
        return data, end

    def feed(self, data: bytes) -> list[bytes]:
        data, end = self._complete(data)
        return STAMP.findall(data, 0, end) if end >= 0 else []

    def count(self, data: bytes) -> tuple[int, int | None]:
        """As :meth:`feed`, but only how many events the read completed and the stamp of the newest: at
        saturation the client must cost less per event than a relay, which a stamp per event read in Python does
        not."""
        data, end = self._complete(data)
        n = data.count(STAMP_KEY, 0, end) if end >= 0 else 0
        if not n:
            return 0, None
        match = STAMP.match(data, data.rfind(STAMP_KEY, 0, end))
        return n, int(match.group(1)) if match else None
