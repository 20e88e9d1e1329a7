"""What every wire dialect gives the timeline: one :class:`~specproxy.core.openai_stream.StreamChunk` per event.

A dialect is created per response (some keep state: SGLang's native API streams cumulative text) and is fed either SSE
events (``event`` name and ``data``) or parsed JSON objects (an NDJSON line, or a whole non-streamed body).
"""

from __future__ import annotations

from typing import Any, ClassVar

from specproxy.core.openai_stream import StreamChunk, interpret, interpret_json


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def as_num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None


def as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


class Dialect:
    """The OpenAI shapes (chat, completions), and everything :func:`interpret` reads from them."""

    name: ClassVar[str] = "openai"
    framing: ClassVar[str] = "sse"  # how a stream of this dialect is framed: "sse" or "ndjson"

    def event(self, event: str, data: str) -> StreamChunk:
        """One SSE event: its ``event:`` name (``message`` when none) and its data."""
        return interpret(data, self.json)

    def json(self, obj: Any) -> StreamChunk:
        """One parsed JSON object: a streamed chunk, an NDJSON line or a whole response body."""
        return self.chunk(obj) if isinstance(obj, dict) else interpret_json(obj)

    def chunk(self, obj: dict[str, Any]) -> StreamChunk:
        return interpret_json(obj)
