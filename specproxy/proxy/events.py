"""The bookkeeping events a relay sends, and the answers it gets back: one wire format for both directions.

Every event is one length-prefixed frame: a fixed header (:data:`HEADER`: kind, the request's number within its
relay, a time or small integer, the payload's length) and the payload. A relay appends frames to one buffer and
writes it once per loop iteration; a reader takes whole frames from whatever bytes arrived (:class:`FrameReader`).
Times are ``time.perf_counter_ns()`` (CLOCK_MONOTONIC on Linux, so comparable across the processes of one machine).

Payloads are raw bytes where they are large (a chunk, a request body) and small orjson documents otherwise. Pure:
bytes in, tuples out; nothing here does IO.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

HEADER = struct.Struct("<BIqI")  # kind, request number (or query id), time in ns (or a small integer), payload length
_BEGIN_HEAD = struct.Struct("<II")  # length of the JSON part, length of the body part that follows it

# relay -> bookkeeper
BEGIN = 1  # t: start_ns; payload: begin_payload()
HEAD = 2  # t: when the response head arrived; payload: [status, content type, content encoding]
CHUNK = 3  # t: when the read arrived; payload: the bytes as relayed
FINISH = 4  # t: end_ns; payload: [outcome, error, overhead ns, max, count, shed, resent: why or null]
REFUSED = 5  # t: the status the proxy answered with (413, 408), no record
STATS = 6  # payload: the relay's counters (orjson object)
QUERY = 7  # seq: query id; payload: the path of an own endpoint (/specproxy/status, /specproxy/metrics)
# bookkeeper -> relay
HEALTH = 16  # t: 1 when records can be written, 0 when not (--fail-closed)
REPLY = 17  # seq: query id; t: HTTP status; payload: content type, a line feed, the body
ACK = 18  # seq: the request's number; t: 1 when its record is written, 0 when the sink dropped it (counted lost)

MAX_PAYLOAD = 1 << 31  # a frame longer than this is a broken stream, not an event


def frame(kind: int, seq: int, t: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, seq, t, len(payload)) + payload


def begin_payload(meta: dict[str, Any], body: bytes) -> bytes:
    """A request's facts (JSON) and its body, or the part of it the bookkeeper is to read."""
    doc = orjson.dumps(meta)
    return _BEGIN_HEAD.pack(len(doc), len(body)) + doc + body


def split_begin(payload: bytes | memoryview) -> tuple[dict[str, Any], bytes]:
    n_doc, n_body = _BEGIN_HEAD.unpack_from(payload)
    start = _BEGIN_HEAD.size
    doc = orjson.loads(payload[start : start + n_doc])
    body = bytes(payload[start + n_doc : start + n_doc + n_body])
    return doc, body


def reply_payload(content_type: str, body: bytes) -> bytes:
    return content_type.encode() + b"\n" + body


def split_reply(payload: bytes) -> tuple[str, bytes]:
    content_type, _, body = payload.partition(b"\n")
    return content_type.decode(), body


class FrameError(ValueError):
    """The byte stream is not a sequence of frames (a bug, or a stream cut mid-frame and resumed)."""


class FrameReader:
    """Whole frames out of a byte stream, as the bytes arrive in pieces of any size."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """(kind, seq, t, payload) of every frame completed by ``data``, in order."""
        buf = self._buf
        buf += data
        size = HEADER.size
        unpack = HEADER.unpack_from
        out: list[tuple[int, int, int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= size:
            kind, seq, t, n = unpack(buf, pos)
            if n >= MAX_PAYLOAD or kind == 0:
                raise FrameError(f"bad frame header at byte {pos}: kind {kind}, length {n}")
            stop = pos + size + n
            if stop > end:
                break
            out.append((kind, seq, t, bytes(buf[pos + size : stop])))
            pos = stop
        if pos:
            del buf[:pos]
        return out
