"""Anthropic Messages (``POST /v1/messages``), which vLLM serves (vllm/entrypoints/anthropic/serving.py) and coding
agents speak. Streaming events (docs.anthropic.com, "Streaming Messages"), each an SSE ``event:`` line naming the type
and a ``data:`` object with the same ``type``:

``message_start`` (``message.id``, ``model``, ``usage.input_tokens``), then per content block ``content_block_start``,
``content_block_delta`` (``delta.type``: ``text_delta`` / ``thinking_delta`` / ``input_json_delta`` /
``signature_delta``), ``content_block_stop``; then ``message_delta`` (``delta.stop_reason``, ``usage.output_tokens``:
the total), ``message_stop``. ``ping`` may come anywhere; ``error`` carries ``error.type`` / ``error.message``.

vLLM turns each chat chunk into one ``content_block_delta``, so a delta is an engine step as a chat chunk is; the
deltas carry no token counts (only ``message_delta`` has the total), so the counts per delta come from the text.
"""

from __future__ import annotations

from typing import Any

from specproxy.core.dialects.base import Dialect, as_int, as_str
from specproxy.core.openai_stream import StreamChunk

# Anthropic stop reasons in the OpenAI words the records use (vLLM maps them the other way round)
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def _usage(u: Any) -> tuple[int | None, int | None, int | None]:
    if not isinstance(u, dict):
        return None, None, None
    return as_int(u.get("input_tokens")), as_int(u.get("output_tokens")), as_int(u.get("cache_read_input_tokens"))


def _finish(reason: Any) -> str | None:
    r = as_str(reason)
    return STOP_REASONS.get(r, r) if r is not None else None


class AnthropicDialect(Dialect):
    name = "anthropic"

    def event(self, event: str, data: str) -> StreamChunk:
        if event == "message_stop":
            return StreamChunk(kind="done")
        return super().event(event, data)

    def chunk(self, obj: dict[str, Any]) -> StreamChunk:
        kind = obj.get("type")
        if kind == "error" or ("error" in obj and kind != "message"):
            return StreamChunk(kind="error", error=obj.get("error"))
        if kind == "message_stop":
            return StreamChunk(kind="done")
        if kind == "message_start":
            msg = obj.get("message")
            msg = msg if isinstance(msg, dict) else {}
            prompt, _, cached = _usage(msg.get("usage"))
            return StreamChunk(
                kind="chunk",
                id=as_str(msg.get("id")),
                model=as_str(msg.get("model")),
                prompt_tokens=prompt,
                cached_tokens=cached,
            )
        if kind == "content_block_delta":
            delta = obj.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            text = ""
            for key in ("text", "thinking", "partial_json"):
                v = delta.get(key)
                if isinstance(v, str):
                    text += v
            if not text:  # signature_delta: no token of the answer
                return StreamChunk(kind="chunk")
            return StreamChunk(kind="chunk", n_choices=1, text=text)
        if kind == "message_delta":
            delta = obj.get("delta")
            prompt, completion, cached = _usage(obj.get("usage"))
            return StreamChunk(
                kind="chunk",
                finish_reason=_finish(delta.get("stop_reason")) if isinstance(delta, dict) else None,
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
            )
        if kind == "message":  # a whole non-streamed response
            texts = []
            content = obj.get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict):
                    for key in ("text", "thinking"):
                        v = block.get(key)
                        if isinstance(v, str):
                            texts.append(v)
            prompt, completion, cached = _usage(obj.get("usage"))
            return StreamChunk(
                kind="chunk",
                id=as_str(obj.get("id")),
                model=as_str(obj.get("model")),
                text="".join(texts),
                finish_reason=_finish(obj.get("stop_reason")),
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
                final=True,
            )
        return StreamChunk(kind="chunk")  # ping, content_block_start / _stop: nothing to count
