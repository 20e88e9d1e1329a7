"""Request bodies in the engines' other APIs, for ``specproxy run --endpoint``: the OpenAI chat body the plan
builds, said the way each API says it (the shapes of docs/engines.md). Streaming is always on; the sampling settings
carry over (temperature, the token limit under each API's own name). Pure.
"""

from __future__ import annotations

from typing import Any

# --endpoint name -> path
DIALECT_ENDPOINTS = {
    "ollama-chat": "/api/chat",
    "ollama-generate": "/api/generate",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
    "llamacpp": "/completion",
    "sglang": "/generate",
}


def _as_text(messages: list[dict[str, Any]]) -> str:
    return "\n\n".join(str(m.get("content", "")) for m in messages)


def dialect_body(endpoint: str, chat: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(path, body) of ``endpoint`` for the OpenAI chat body ``chat``."""
    path = DIALECT_ENDPOINTS[endpoint]
    messages: list[dict[str, Any]] = chat.get("messages") or []
    model, max_tokens, temperature = chat.get("model"), chat.get("max_tokens"), chat.get("temperature", 0.0)
    if endpoint in ("ollama-chat", "ollama-generate"):
        body: dict[str, Any] = {"model": model, "stream": True}
        if endpoint == "ollama-chat":
            body["messages"] = messages
        else:
            body["prompt"] = _as_text(messages)
        body["options"] = {"temperature": temperature, **({"num_predict": max_tokens} if max_tokens else {})}
        return path, body
    if endpoint == "messages":
        system = [m for m in messages if m.get("role") == "system"]
        body = {
            "model": model,
            "messages": [m for m in messages if m.get("role") != "system"],
            "max_tokens": max_tokens or 1024,
            "temperature": temperature,
            "stream": True,
        }
        if system:
            body["system"] = _as_text(system)
        return path, body
    if endpoint == "responses":
        body = {"model": model, "input": messages, "temperature": temperature, "stream": True}
        if max_tokens:
            body["max_output_tokens"] = max_tokens
        return path, body
    if endpoint == "llamacpp":
        return path, {
            "prompt": _as_text(messages),
            "n_predict": max_tokens or -1,
            "temperature": temperature,
            "stream": True,
        }
    params: dict[str, Any] = {"temperature": temperature}
    if max_tokens:
        params["max_new_tokens"] = max_tokens
    return path, {"text": _as_text(messages), "sampling_params": params, "stream": True}
