"""What the proxy learns from a request body before relaying it, with bounded work whatever the body is.

The relay forwards the bytes untouched; the recorder wants the body's ``model``, ``stream``, the last user message
(for workload rules) and, per ``--capture``, the body itself. Parsing a body costs time and memory in proportion to
its number of elements, not its bytes: a large body of tiny elements would freeze every stream for seconds on the
event loop. So only a body up to ``limit`` bytes is parsed; a larger one is relayed as it is, its
``model`` and ``stream`` read by pattern from its first :data:`SCAN_BYTES` (top-level keys usually come first),
and it is not captured (the record says ``body_too_large``). Pure: bytes in, facts out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

SCAN_BYTES = 64 * 1024
_MODEL = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,256})"')
_STREAM = re.compile(rb'"stream"\s*:\s*(true|false)')
_JSON_START = (b"{", b"[", b" ", b"\n", b"\r", b"\t")


def stalled(idle_s: float) -> str:
    """The reason a request body that stopped coming is refused with (408), as both front doors give it."""
    return f"request body not received: no byte for {idle_s:g} s"


class Body:
    """A request body in the pieces it arrived in. A large body is never joined into one object: copying tens of
    megabytes at once (``bytes(bytearray)``) stalls every other stream on the relay's loop. It is
    forwarded piece by piece (:meth:`pieces`), and the bookkeeping gets at most its head (:meth:`head`)."""

    __slots__ = ("_pieces", "size")

    def __init__(self, pieces: list[bytes] | None = None) -> None:
        self._pieces: list[bytes] = []
        self.size = 0
        for p in pieces or ():
            self.append(p)

    def append(self, piece: bytes) -> None:
        if piece:
            self._pieces.append(piece)
            self.size += len(piece)

    def __len__(self) -> int:
        return self.size

    def head(self, n: int) -> bytes:
        """The first ``n`` bytes (all of it when shorter): joins only the pieces that hold them."""
        out: list[bytes] = []
        got = 0
        for p in self._pieces:
            if got >= n:
                break
            out.append(p[: n - got])
            got += len(out[-1])
        return b"".join(out)

    def whole(self) -> bytes:
        """Every byte as one object: for a body small enough to copy at once."""
        return self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)

    def pieces(self) -> list[bytes]:
        return list(self._pieces)


@dataclass(frozen=True, slots=True)
class BodyFacts:
    parsed: Any  # the parsed JSON body; None when not JSON, or over the limit
    model: str | None
    stream: bool
    over_limit: bool  # larger than the parse limit: relayed, not parsed, not captured
    size: int

    def text(self, body: bytes) -> str | None:
        """A body that is not JSON, as text for capture (None for JSON, an empty body, or one over the limit)."""
        if self.parsed is not None or self.over_limit or not body:
            return None
        return body.decode("utf-8", "replace")


def inspect_body(body: bytes, limit: int) -> BodyFacts:
    size = len(body)
    if size > limit:
        head = body[:SCAN_BYTES]
        m = _MODEL.search(head)
        model = None
        if m is not None:
            try:
                model = orjson.loads(b'"' + m.group(1) + b'"')
            except orjson.JSONDecodeError:
                model = None
        s = _STREAM.search(head)
        return BodyFacts(
            None, model if isinstance(model, str) else None, s is not None and s.group(1) == b"true", True, size
        )
    parsed: Any = None
    if body and body[:1] in _JSON_START:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
    obj = parsed if isinstance(parsed, dict) else None
    model = obj.get("model") if obj is not None and isinstance(obj.get("model"), str) else None
    return BodyFacts(parsed, model, bool(obj.get("stream")) if obj is not None else False, False, size)
