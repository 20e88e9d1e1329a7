"""Which engine serves the responses: the ``--engine`` names and the clues that tell them apart.

Clues, strongest first (:func:`resolve`): what the user said (``--engine``); what a response's shape names
(SGLang's ``meta_info``, llama.cpp's ``timings`` or ``/completion`` chunks, Ollama's NDJSON or ``fp_ollama``,
vLLM's ``speculative_decoding`` / ``token_ids`` / ``kv_transfer_params``); the ``/metrics`` prefixes
(``vllm:``, ``sglang:``, ``llamacpp:``); the ``Server`` header (llama.cpp sends ``llama.cpp``); the probe of
well-known paths at start (Ollama's ``GET /api/version``, llama.cpp's ``GET /props``, SGLang's
``GET /get_server_info``, vLLM's ``GET /version``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specproxy.core.figures import token_span

ENGINES = ("vllm", "sglang", "ollama", "llamacpp")
ENGINE_CHOICES = ("auto", *ENGINES)

# Engines that stream one event per token, whatever they drafted: their chunks say nothing about steps.
PER_TOKEN_ENGINES = frozenset({"ollama", "llamacpp"})

# GET paths probed at start, in order, and what a 200 with a JSON object there means.
PROBES: tuple[tuple[str, str], ...] = (
    ("/api/version", "ollama"),
    ("/props", "llamacpp"),
    ("/get_server_info", "sglang"),
    ("/version", "vllm"),
)


def from_metrics(kind: str | None) -> str | None:
    """The engine named by :func:`specproxy.core.prom.detect_engine`'s answer."""
    if kind in ("vllm", "vllm-v0"):
        return "vllm"
    return kind if kind in ENGINES else None


def from_server_header(value: str | None) -> str | None:
    v = (value or "").lower()
    if "llama.cpp" in v:
        return "llamacpp"
    if "ollama" in v:
        return "ollama"
    return None


def from_probe(path: str, status: int, body: Any) -> str | None:
    """The engine a probe answer shows: a 200 with the JSON the engine's own endpoint returns."""
    if status != 200 or not isinstance(body, Mapping):
        return None
    for probe_path, engine in PROBES:
        if path != probe_path:
            continue
        if engine == "ollama" and isinstance(body.get("version"), str) and "default_generation_settings" not in body:
            return "ollama" if path == "/api/version" else None
        if engine == "llamacpp" and "default_generation_settings" in body:
            return "llamacpp"
        if engine == "sglang" and ("model_path" in body or "tp_size" in body):
            return "sglang"
        if engine == "vllm" and isinstance(body.get("version"), str):
            return "vllm"
    return None


def resolve(configured: str | None, *clues: str | None) -> str | None:
    """``--engine`` when it names one, else the first clue given (callers pass them strongest first)."""
    if configured in ENGINES:
        return configured
    return next((c for c in clues if c in ENGINES), None)


def decode_rate(timings: Mapping[str, float] | None) -> float | None:
    """Decode tokens per second as the engine timed them (Ollama's eval_count / eval_duration, llama.cpp's
    predicted_n / predicted_ms), from a record's ``engine_timings``."""
    if not timings:
        return None
    n, s = timings.get("decode_tokens"), timings.get("decode_s")
    return n / s if n and s else None


# A decode span timed from chunks further than this from the engine's own timing of the same request says the chunks
# arrived late (the reader or the engine's API server descheduled on a busy host). Spans, not rates: a rate timed
# from chunks counts tokens from text when the usage comes only at the end, and may differ from the engine's count
# for that reason alone.
OFF_ENGINE = 0.25
OFF_ENGINE_FLAG = "decode_rate_off_engine"
OFF_ENGINE_MIN_TOKENS = 8  # too few tokens, and one late read moves the span by more than that


def decode_off_engine(span_s: float, timings: Mapping[str, float] | None) -> bool:
    """Whether the decode span timed from chunks (first token chunk to last) is more than :data:`OFF_ENGINE` off the
    engine's own (``decode_s``), or was not timed at all (every token in one read) while the engine timed it. False
    when the engine did not time the request or decoded fewer than :data:`OFF_ENGINE_MIN_TOKENS` tokens after the
    first."""
    t = timings or {}
    engine_s, tokens = t.get("decode_s"), t.get("decode_tokens")
    if not engine_s or engine_s <= 0 or tokens is None or tokens < OFF_ENGINE_MIN_TOKENS:
        return False
    return span_s <= 0 or abs(span_s / engine_s - 1.0) > OFF_ENGINE


def decode_figure(
    engines: tuple[str | None, ...],
    stream: bool,
    chunks: Sequence[tuple[float, int]],
    chunk_rate: float | None,
    timings: Mapping[str, float] | None,
) -> tuple[float | None, str | None]:
    """A record's ``decode_tok_s`` and the flag that qualifies it. ``engines``: the engine resolved for the record and
    the one the response's shape names. Ollama and llama.cpp stream one event per token whatever they drafted: their
    own timing replaces the chunks' (``decode_rate_from_engine``). vLLM's (``--enable-per-request-metrics``) is kept
    beside the chunk-timed rate, which is what clients see, and only marks a rate timed from chunks that arrived late
    (:data:`OFF_ENGINE_FLAG`)."""
    if PER_TOKEN_ENGINES.intersection(engines) and (rate := decode_rate(timings)) is not None:
        return rate, "decode_rate_from_engine"
    if stream and decode_off_engine(token_span(chunks), timings):
        return chunk_rate, OFF_ENGINE_FLAG
    return chunk_rate, None
