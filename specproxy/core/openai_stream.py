"""Interpretation of OpenAI-compatible streamed events (chat and completions), as vLLM, SGLang and llama.cpp send them.

One :func:`interpret` call per SSE event: one small JSON parse, nothing rebuilt. The result says what the event is
(data chunk, ``[DONE]``, an in-stream error, or data that is not JSON: kept and flagged, never a crash) and pulls out
what a recorder needs: text deltas, finish reason, usage (with ``prompt_tokens_details.cached_tokens``, the prompt
tokens served from the engine's prefix cache), token ids, and the engine's own per-request speculative figures
wherever they ride (:func:`server_spec`), as one dict in vLLM's keys that names its ``shape``.
A negative usage count is read as missing and marked (``bad_usage``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

ChunkKind = Literal["chunk", "done", "error", "non_json"]


@dataclass(slots=True)  # not frozen: made per event, and a frozen __init__ is several times slower
class StreamChunk:
    kind: ChunkKind
    id: str | None = None
    model: str | None = None
    n_choices: int = 0
    role: bool = False  # the chat role chunk (``delta.role``)
    text: str = ""  # content + reasoning + tool-call argument deltas, all choices
    tool: bool = False  # a delta carried tool calls: its text is (mostly) their JSON arguments
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # cumulative, as the server reports it
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details)
    bad_usage: bool = False  # the usage block held a negative count: read as missing
    n_token_ids: int | None = None  # ``token_ids`` lengths summed over choices, when the server sent them
    max_index: int = 0  # the highest choice index: above 0 means n > 1, several sequences per request
    spec: dict[str, Any] | None = None  # per-request speculative figures in vLLM's keys, with their ``shape``
    llama_timings: dict[str, Any] | None = None  # llama.cpp ``timings`` (draft_n / draft_n_accepted)
    engine_timings: dict[str, float] | None = None  # the engine's own timings, normalised (core.dialects.engine)
    engine: str | None = None  # the engine this event's shape names, when it names one
    final: bool = False  # the dialect's last event of a response (Ollama ``done``, llama.cpp ``stop``, ...)
    error: Any = None
    raw: str | None = None  # kept for non-JSON data only

    @property
    def has_choices(self) -> bool:
        return self.n_choices > 0


def _delta_text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        text = choice.get("text")  # /v1/completions
        return text if isinstance(text, str) else ""
    parts: list[str] = []
    for key in ("content", "reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str):
            parts.append(value)
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                for key in ("name", "arguments"):
                    value = fn.get(key)
                    if isinstance(value, str):
                        parts.append(value)
    return "".join(parts)


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage_count(value: Any) -> tuple[int | None, bool]:
    """A usage count and whether it was bad: a token count is never negative (OpenAI's CompletionUsage), so a
    negative one is an upstream fault, kept out of the figures rather than recorded as a count."""
    n = _as_int(value)
    if n is not None and n < 0:
        return None, True
    return n, False


# The common streamed chunk (vLLM, SGLang, and the rest alike: one choice, a text delta, perhaps a usage block) is
# read by :func:`plain_fields` in one pass. At the top level it is told by what it lacks: a key that the whole reading
# (or a dialect built on it: core.dialects.native) reads beyond the plain fields takes the whole reading, and any
# other key (a gateway's ``provider``, a bench's stamp) says nothing either reading uses. Within the choice and its
# delta it is told by what it has: those keys and no other.
_WHOLE_TOP = frozenset(
    ("error", "metrics", "timings", "system_fingerprint", "kv_transfer_params", "meta_info", "sglext", "content")
)
_PLAIN_CHOICE = frozenset(
    ("index", "delta", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids")
)
_PLAIN_DELTA = frozenset(("content", "role", "reasoning_content", "reasoning"))
_PLAIN_USAGE = frozenset(("prompt_tokens", "completion_tokens", "total_tokens", "completion_tokens_details"))


# What :func:`plain_fields` reads from the common chunk: text, whether it is the role chunk, finish reason,
# prompt and completion tokens (cumulative), id, choice index.
PlainFields = tuple[str, bool, str | None, int | None, int | None, str | None, int]


def plain_fields(obj: dict[str, Any]) -> PlainFields | None:
    """The common streamed chunk read the way :func:`interpret_json` reads it, with fewer steps (it is the
    bookkeeper's most frequent call), as a tuple; None for any other shape, which the whole reading then takes. All
    else a :class:`StreamChunk` can say is at its default for this shape."""
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1 or not obj.keys().isdisjoint(_WHOLE_TOP):
        return None
    choice = choices[0]
    if type(choice) is not dict or not choice.keys() <= _PLAIN_CHOICE or choice.get("token_ids") is not None:
        return None
    index = choice.get("index", 0)
    if type(index) is not int:
        return None
    delta = choice.get("delta")
    if delta is None:
        text = choice.get("text")  # /v1/completions
        text = text if type(text) is str else ""
        role = False
    elif type(delta) is dict and delta.keys() <= _PLAIN_DELTA:
        if "reasoning_content" in delta or "reasoning" in delta:
            text = _delta_text(choice)  # joined in the whole reading's order
        else:
            text = delta.get("content")
            if type(text) is not str:
                text = ""
        role = "role" in delta
    else:
        return None
    usage = obj.get("usage")
    prompt_tokens = completion_tokens = None
    if usage is not None:
        if type(usage) is not dict or not usage.keys() <= _PLAIN_USAGE:
            return None
        if usage.get("completion_tokens_details") is not None:
            return None  # may carry a gateway's accepted / rejected prediction tokens: the whole reading reads them
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        for n in (prompt_tokens, completion_tokens):
            if n is not None and (type(n) is not int or n < 0):
                return None  # a count of another kind, or a negative one: the whole reading flags it
    if obj.get("object") == "error":
        return None
    fr = choice.get("finish_reason")
    rid = obj.get("id")
    return (
        text,
        role,
        fr if type(fr) is str else None,
        prompt_tokens,
        completion_tokens,
        rid if type(rid) is str else None,
        index if index > 0 else 0,
    )


def _plain_chunk(obj: dict[str, Any]) -> StreamChunk | None:
    """:func:`plain_fields` as a :class:`StreamChunk`."""
    f = plain_fields(obj)
    if f is None:
        return None
    text, role, finish, prompt_tokens, completion_tokens, rid, index = f
    model = obj.get("model")
    return StreamChunk(
        kind="chunk",
        id=rid,
        model=model if type(model) is str else None,
        n_choices=1,
        role=role,
        text=text,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        max_index=index,
    )


def interpret_json(obj: Any) -> StreamChunk:
    """Interpret one parsed JSON payload (a streamed chunk or a whole non-streaming response body)."""
    if type(obj) is dict:
        plain = _plain_chunk(obj)
        if plain is not None:
            return plain
    return _whole_chunk(obj)


def _whole_chunk(obj: Any) -> StreamChunk:
    """Any payload, every field read."""
    if not isinstance(obj, dict):
        return StreamChunk(kind="non_json", raw=orjson.dumps(obj).decode())
    if "error" in obj and "choices" not in obj:
        rid = obj.get("id")
        return StreamChunk(kind="error", error=obj["error"], id=rid if isinstance(rid, str) else None)
    if obj.get("object") == "error":  # older vLLM ErrorResponse at top level
        return StreamChunk(kind="error", error=obj)
    choices = obj.get("choices")
    n_choices = 0
    role = tool = False
    texts: list[str] = []
    finish: str | None = None
    n_ids: int | None = None
    max_index = 0
    if isinstance(choices, list):
        n_choices = len(choices)
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            if isinstance(index, int) and index > max_index:
                max_index = index
            delta = choice.get("delta")
            if isinstance(delta, dict):
                role = role or "role" in delta
                tool = tool or "tool_calls" in delta
            message = choice.get("message")
            if isinstance(message, dict):  # non-streaming chat body
                content = message.get("content")
                if isinstance(content, str):
                    texts.append(content)
            else:
                texts.append(_delta_text(choice))
            fr = choice.get("finish_reason")
            if isinstance(fr, str) and finish is None:
                finish = fr
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                n_ids = (n_ids or 0) + len(ids)
    usage = obj.get("usage")
    prompt_tokens = completion_tokens = None
    cached_tokens = None
    bad_prompt = bad_completion = bad_cached = False
    if isinstance(usage, dict):
        prompt_tokens, bad_prompt = _usage_count(usage.get("prompt_tokens"))
        completion_tokens, bad_completion = _usage_count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")  # null unless the engine reports prefix-cache hits
        if isinstance(details, dict):
            cached_tokens, bad_cached = _usage_count(details.get("cached_tokens"))
    vllm_times = None
    metrics = obj.get("metrics")
    if isinstance(metrics, dict):
        vllm_times = vllm_timings(metrics, completion_tokens) or None
    spec = server_spec(obj)
    timings = obj.get("timings")
    model = obj.get("model")
    rid = obj.get("id")
    vllm_spec = spec is not None and spec.get("shape") == VLLM_METRICS
    engine = "vllm" if vllm_spec or vllm_times or n_ids is not None or "kv_transfer_params" in obj else None
    if obj.get("system_fingerprint") == "fp_ollama":  # Ollama's OpenAI-compatible endpoint says so on every chunk
        engine = "ollama"
    if isinstance(timings, dict):
        engine = "llamacpp"
    return StreamChunk(
        kind="chunk",
        id=rid if isinstance(rid, str) else None,
        model=model if isinstance(model, str) else None,
        n_choices=n_choices,
        role=role,
        text="".join(texts),
        tool=tool,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        bad_usage=bad_prompt or bad_completion or bad_cached,
        n_token_ids=n_ids,
        max_index=max_index,
        spec=spec,
        llama_timings=timings if isinstance(timings, dict) else None,
        engine_timings=llamacpp_timings(timings) if isinstance(timings, dict) else vllm_times,
        engine=engine,
    )


def interpret(data: str, on_json: Callable[[Any], StreamChunk] = interpret_json) -> StreamChunk:
    """Interpret the data of one SSE event: the ``[DONE]`` marker, text that is not JSON, or JSON that ``on_json``
    reads (OpenAI shapes by default; a dialect passes its own)."""
    stripped = data.strip()
    if stripped == "[DONE]":
        return StreamChunk(kind="done")
    try:
        obj = orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return StreamChunk(kind="non_json", raw=data)
    return on_json(obj)


def vllm_timings(m: dict[str, Any], completion_tokens: int | None) -> dict[str, float]:
    """vLLM's per-request ``metrics`` (server flag ``--enable-per-request-metrics``, on the final usage chunk; read in
    vllm/entrypoints/generate/base/serving.py) in the record's units. Its clock is the engine core's:
    ``queue_time_ms`` is queued to scheduled, ``time_to_first_token_ms`` scheduled to first token, and
    ``generation_time_ms`` first token to last, so decoding advanced ``completion_tokens - 1`` tokens in ``decode_s``
    (``mean_itl_ms`` is that span over those tokens)."""
    out: dict[str, float] = {}
    for key, name in (
        ("queue_time_ms", "queue_s"),
        ("time_to_first_token_ms", "ttft_s"),
        ("generation_time_ms", "decode_s"),
    ):
        v = m.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
            out[name] = v * 1e-3
    if "decode_s" in out and completion_tokens is not None and completion_tokens >= 1:
        out["decode_tokens"] = float(completion_tokens - 1)
    return out


def llamacpp_timings(t: dict[str, Any]) -> dict[str, float]:
    """llama.cpp's ``timings`` (tools/server: ``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``, and
    ``draft_n`` / ``draft_n_accepted`` when it drafted) in the record's units: tokens and seconds."""
    out: dict[str, float] = {}
    for key, name, scale in (
        ("prompt_n", "prompt_tokens", 1.0),
        ("prompt_ms", "prompt_s", 1e-3),
        ("predicted_n", "decode_tokens", 1.0),
        ("predicted_ms", "decode_s", 1e-3),
        ("draft_n", "draft_tokens", 1.0),
        ("draft_n_accepted", "draft_accepted", 1.0),
    ):
        v = t.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
            out[name] = v * scale
    return out


# The shapes the engines' own per-request speculative figures come in (a record's ``spec.server_source``).
VLLM_METRICS = "vllm_metrics"  # vLLM >= 0.29 ``metrics.speculative_decoding`` (final usage chunk, or the body)
TRTLLM_CHOICE = "trtllm_choice"  # TensorRT-LLM ``choices[].speculative_decoding``
USAGE_PREDICTION = "usage_prediction_tokens"  # ``usage.completion_tokens_details`` accepted / rejected predictions


def server_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The per-request speculative figures an OpenAI-shaped payload carries, in the keys of vLLM's block (what
    :func:`specproxy.attribution.estimates.from_server` reads) plus ``shape``; None when it carries none.
    SGLang's ``meta_info`` / ``sglext`` are read by :mod:`specproxy.core.dialects.native`."""
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and isinstance(block := metrics.get("speculative_decoding"), dict):
        return {**block, "shape": VLLM_METRICS}
    choices = obj.get("choices")
    if isinstance(choices, list):
        blocks = [c["speculative_decoding"] for c in choices if isinstance(c, dict) and "speculative_decoding" in c]
        if len(blocks) == 1 and isinstance(blocks[0], dict):  # n > 1 is flagged and never uses a server figure
            return trtllm_spec(blocks[0])
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(details := usage.get("completion_tokens_details"), dict):
        return prediction_tokens_spec(details)
    return None


def trtllm_spec(block: dict[str, Any]) -> dict[str, Any] | None:
    """TensorRT-LLM's per-request ``speculative_decoding`` (``total_accepted_draft_tokens``, ``total_draft_tokens``,
    ``acceptance_rate``: tensorrt_llm/metrics/perf_utils.py ``request_perf_metrics_to_dict``). It counts no steps,
    so drafts are unknown. The engine leaves the block out when it drafted nothing."""
    accepted, drafted = block.get("total_accepted_draft_tokens"), block.get("total_draft_tokens")
    if accepted is None and drafted is None:
        return None
    return {
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_steps": None,
        "shape": TRTLLM_CHOICE,
    }


def prediction_tokens_spec(details: dict[str, Any]) -> dict[str, Any] | None:
    """A gateway's per-request counts in OpenAI's ``completion_tokens_details``: accepted draft tokens as
    ``accepted_prediction_tokens``, the rest of the drafted ones as ``rejected_prediction_tokens`` (the field
    names are OpenAI's API reference; smg declares them in crates/protocols/src/common.rs). Steps are unknown.
    Many servers send both as 0 whatever happened (OpenAI's own predicted outputs, most proxies): 0 and 0 say
    nothing, so they are not read as a figure."""
    accepted, rejected = details.get("accepted_prediction_tokens"), details.get("rejected_prediction_tokens")
    if accepted is None and rejected is None:
        return None
    if not accepted and not rejected:
        return None
    acc, rej = _as_int(accepted), _as_int(rejected)
    drafted = acc + rej if acc is not None and rej is not None else None
    return {
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_steps": None,
        "shape": USAGE_PREDICTION,
    }
