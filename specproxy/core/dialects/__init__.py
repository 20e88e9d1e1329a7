"""The wire dialects a recorder reads, chosen per response from its path and content type.

| path (suffix)       | dialect                                    | stream framing          |
|---------------------|--------------------------------------------|-------------------------|
| ``/api/chat``, ``/api/generate`` | Ollama native (:mod:`.ollama`)  | NDJSON                  |
| ``/v1/messages``    | Anthropic Messages (:mod:`.anthropic`)     | SSE with event names    |
| ``/v1/responses``   | OpenAI Responses (:mod:`.responses`)       | SSE with event names    |
| anything else       | OpenAI chat / completions, SGLang ``/generate``, llama.cpp ``/completion`` | SSE  |
|                     | (:mod:`.native`)                           |                         |

The content type decides whether a response is a stream at all (``text/event-stream``, ``application/x-ndjson``);
a dialect then reads the events or the whole body. Pure: strings in, a dialect out.
"""

from __future__ import annotations

from specproxy.core.dialects.anthropic import AnthropicDialect
from specproxy.core.dialects.base import Dialect
from specproxy.core.dialects.native import NativeDialect
from specproxy.core.dialects.ollama import OllamaDialect
from specproxy.core.dialects.responses import ResponsesDialect

NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines")


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def dialect_for(path: str) -> Dialect:
    p = path.rstrip("/")
    if p.endswith(("/api/chat", "/api/generate")):
        return OllamaDialect()
    if p.endswith("/v1/messages"):
        return AnthropicDialect()
    if p.endswith("/v1/responses"):
        return ResponsesDialect()
    return NativeDialect()


def stream_framing(content_type: str | None) -> str | None:
    """``"sse"``, ``"ndjson"``, or None for a response that is not a stream."""
    media = _media_type(content_type)
    if media == "text/event-stream":
        return "sse"
    if media in NDJSON_TYPES:
        return "ndjson"
    return None


__all__ = ["Dialect", "dialect_for", "stream_framing"]
