"""Ollama's native API: ``/api/chat`` and ``/api/generate`` (docs/api.md in ollama/ollama).

Streamed as NDJSON (``application/x-ndjson``; streaming is the default, ``"stream": false`` gives one JSON body).
Each line is ``{"model", "created_at", "message": {"role", "content", "thinking"?, "tool_calls"?}, "done": false}``
(``/api/generate``: ``"response"`` instead of ``"message"``); the last has ``"done": true``, ``done_reason``
(``stop``, ``length``, ``load``, ``unload``) and the engine's own counts and timings, durations in nanoseconds:
``total_duration``, ``load_duration``, ``prompt_eval_count``, ``prompt_eval_duration``, ``eval_count``,
``eval_duration``. An error is a line ``{"error": "..."}``. Ollama does not speculate: no draft figures.
"""

from __future__ import annotations

from typing import Any

import orjson

from specproxy.core.dialects.base import Dialect, as_int, as_num, as_str
from specproxy.core.openai_stream import StreamChunk

_NS = 1e-9


def ollama_timings(obj: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name, scale in (
        ("prompt_eval_count", "prompt_tokens", 1.0),
        ("prompt_eval_duration", "prompt_s", _NS),
        ("eval_count", "decode_tokens", 1.0),
        ("eval_duration", "decode_s", _NS),
        ("load_duration", "load_s", _NS),
        ("total_duration", "total_s", _NS),
    ):
        v = as_num(obj.get(key))
        if v is not None:
            out[name] = v * scale
    return out


def _text(obj: dict[str, Any]) -> str:
    parts: list[str] = []
    msg = obj.get("message")
    src = msg if isinstance(msg, dict) else obj
    for key in ("thinking", "content", "response"):
        v = src.get(key)
        if isinstance(v, str):
            parts.append(v)
    calls = src.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                name = fn.get("name")
                if isinstance(name, str):
                    parts.append(name)
                args = fn.get("arguments")
                if args is not None:  # Ollama sends arguments as an object, whole, in one message
                    parts.append(orjson.dumps(args).decode())
    return "".join(parts)


class OllamaDialect(Dialect):
    name = "ollama"
    framing = "ndjson"

    def chunk(self, obj: dict[str, Any]) -> StreamChunk:
        if "error" in obj:
            return StreamChunk(kind="error", error=obj["error"], engine="ollama")
        text = _text(obj)
        if obj.get("done") is True:
            return StreamChunk(
                kind="chunk",
                model=as_str(obj.get("model")),
                n_choices=0,  # totals, not a step; its text (a non-streamed body's whole answer) is kept
                text=text,
                finish_reason=as_str(obj.get("done_reason")) or "stop",
                prompt_tokens=as_int(obj.get("prompt_eval_count")),
                completion_tokens=as_int(obj.get("eval_count")),
                engine_timings=ollama_timings(obj),
                engine="ollama",
                final=True,
            )
        return StreamChunk(kind="chunk", model=as_str(obj.get("model")), n_choices=1, text=text, engine="ollama")
