"""The other APIs the simulator speaks, as the engines send them: Ollama's ``/api/chat`` and ``/api/generate``
(NDJSON), Anthropic Messages ``/v1/messages`` and OpenAI Responses ``/v1/responses`` (vLLM's SSE), llama.cpp's
``/completion`` (one event per token, ``timings`` at the end) and SGLang's ``/generate`` (``meta_info``).

Pure: a request body becomes the chat or completion body the engine core understands (:func:`translate`), and
each :class:`Api` (one per dialect, in :mod:`specproxy.sim.dialect_apis`) turns the engine's outputs into bytes.
Engine figures (SGLang's ``spec_*``, llama.cpp's ``draft_n``, Ollama's durations) come from the request's ground
truth, so a test can check them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from specproxy.sim.records import RequestTruth
from specproxy.sim.wire import ApiError

NDJSON = "application/x-ndjson"
SSE = "text/event-stream; charset=utf-8"
ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens"}


@dataclass(frozen=True, slots=True)
class Ctx:
    id: str
    model: str
    prompt_tokens: int
    created: int


def _obj(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"JSON decode error: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _int_or_none(v: Any, name: str) -> int | None:
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v < 0 and name == "n_predict"):
        return None  # llama.cpp: n_predict -1 is "until the end"
    if not isinstance(v, int) or isinstance(v, bool):
        raise ApiError(400, f"{name} must be an integer")
    return v


def translate(api: str, raw: bytes, model: str) -> tuple[str, bytes, bool]:
    """(engine kind, OpenAI-style body, stream) for a request in ``api``'s shape."""
    body = _obj(raw)
    out: dict[str, Any] = {"model": body.get("model", model)}
    stream = body.get("stream")
    if api in ("ollama_chat", "ollama_generate"):
        out["model"] = model if body.get("model") in (None, model) else body.get("model")
        options = body.get("options")
        num_predict = options.get("num_predict") if isinstance(options, dict) else None
        out["max_tokens"] = _int_or_none(num_predict, "num_predict")
        stream = True if stream is None else stream  # Ollama streams unless told not to
    if api == "ollama_chat" or api == "anthropic":
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise ApiError(400, "messages must be a list")
        system = body.get("system")
        if isinstance(system, str):
            messages = [{"role": "system", "content": system}, *messages]
        out["messages"] = messages
        kind = "chat"
        if api == "anthropic":
            if not isinstance(body.get("max_tokens"), int):
                raise ApiError(400, "max_tokens: Field required")
            out["max_tokens"] = body["max_tokens"]
    elif api == "responses":
        given = body.get("input")
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
        if not isinstance(messages, list):
            raise ApiError(400, "input must be a string or a list of messages")
        if isinstance(body.get("instructions"), str):
            messages = [{"role": "system", "content": body["instructions"]}, *messages]
        out["messages"] = messages
        out["max_tokens"] = _int_or_none(body.get("max_output_tokens"), "max_output_tokens")
        kind = "chat"
    else:
        kind = "completion"
        if api == "ollama_generate":
            out["prompt"] = body.get("prompt")
        elif api == "llamacpp":
            out["prompt"] = body.get("prompt")
            out["max_tokens"] = _int_or_none(body.get("n_predict"), "n_predict")
        elif api == "sglang":
            params = body.get("sampling_params")
            out["prompt"] = body.get("text")
            out["max_tokens"] = _int_or_none(
                params.get("max_new_tokens") if isinstance(params, dict) else None, "max_new_tokens"
            )
    if out.get("max_tokens") is None:
        out.pop("max_tokens", None)
    return kind, orjson.dumps(out), bool(stream)


def sse(event: str | None, obj: dict[str, Any]) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def durations(t: RequestTruth) -> tuple[float, float, float]:
    """(prompt, decode, total) seconds of a finished request, on the engine's own clock."""
    first = t.first_token_at_s if t.first_token_at_s is not None else t.started_at_s
    end = t.finished_at_s if t.finished_at_s is not None else first
    admitted = t.admitted_at_s if t.admitted_at_s is not None else t.started_at_s
    submitted = t.submitted_at_s if t.submitted_at_s is not None else t.started_at_s
    return first - admitted, end - first, end - submitted


def histogram(t: RequestTruth, k: int) -> list[int]:
    hist = [0] * (k + 1)
    for a in t.per_step_accepted:
        hist[min(a, k)] += 1
    return hist


class Api:
    """One dialect's bytes. ``per_token``: the engine sends one event per token, whatever a step brought."""

    content_type = SSE
    per_token = False
    id_prefix = "sim-"

    def head(self, c: Ctx) -> bytes:
        return b""

    def step(self, c: Ctx, text: str, ids: list[int], completion: int, finish: str | None) -> bytes:
        raise NotImplementedError

    def tail(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        raise NotImplementedError

    def whole(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return self.tail(c, t, finish, completion, text, k)
