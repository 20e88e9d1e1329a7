"""vLLM 0.32's OpenAI wire format as the simulator speaks it: request parsing, error and response bodies.

Pure: bytes and dicts in, bytes and dicts out. Field order follows the real captures in tests/data/ exactly
(orjson keeps dict insertion order), because clients and recorders are tested against this shape.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from specproxy.core.tokens import approx_token_count
from specproxy.sim.config import SimConfig
from specproxy.sim.corpus import classify
from specproxy.sim.prefix_cache import PrefixKeys, prefix_keys
from specproxy.sim.records import RequestTruth

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """A request the server refuses, with vLLM's JSON error shape."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    err_type = _ERROR_TYPES.get(status, "Error")
    return orjson.dumps({"error": {"message": message, "type": err_type, "param": param, "code": status}})


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the simulator needs from one /v1/chat/completions or /v1/completions body."""

    kind: str  # "chat" | "completion"
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    max_tokens: int
    prompt_tokens: int
    profile: str
    content_key: bytes
    prefix_keys: PrefixKeys = ()  # what the prefix cache looks up (messages; a completion's whole prompt)


def _message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if content is None:
        return ""
    raise ApiError(400, "message content must be a string or a list of content parts")


def parse_request(kind: str, raw: bytes, cfg: SimConfig, profile_header: str | None) -> ParsedRequest:
    """Validate a request body like vLLM does (400 / 404 with its error shape); unknown fields are ignored."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"JSON decode error: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != cfg.served_model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "Field required: messages must be a non-empty list")
        texts: list[str] = []
        roles: list[str] = []
        last_user = ""
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, "each message must be an object with a string role")
            text = _message_text(m.get("content"))
            texts.append(text)
            roles.append(m["role"])
            if m["role"] == "user":
                last_user = text
        prompt_tokens = sum(approx_token_count(t) + 4 for t in texts) + 3  # chat template markers per message
        keys = prefix_keys([(f"{r}\0{t}", 4) for r, t in zip(roles, texts, strict=True)], approx_token_count)
        classify_text = last_user or texts[-1]
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        key_body: dict[str, object] = {"messages": messages}
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_tokens = max(1, approx_token_count(prompt))
            classify_text = prompt
            keys = prefix_keys([(prompt, 0)], approx_token_count)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_tokens = len(prompt)
            classify_text = ""
            keys = ()
        else:
            raise ApiError(400, "Field required: prompt must be a string or a list of token ids")
        max_tokens = body.get("max_tokens")
        key_body = {"prompt": prompt}
    if max_tokens is None:
        max_tokens = cfg.default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise ApiError(400, f"n must be 1 on this server, got {n}.", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ApiError(400, "stream must be a boolean", "stream")
    stream = bool(stream)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    continuous = include_usage and bool(options and options.get("continuous_usage_stats"))
    if prompt_tokens + max_tokens > cfg.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion).",
        )
    profile = profile_header.strip() if profile_header else classify(classify_text)
    if profile not in cfg.profiles:
        raise ApiError(400, f"unknown X-Sim-Profile {profile!r} (known: {', '.join(cfg.profiles)})")
    # The answer depends on what was asked, not on how it is delivered (stream / usage options).
    key = orjson.dumps({"kind": kind, "profile": profile, **key_body}, option=orjson.OPT_SORT_KEYS)
    return ParsedRequest(
        kind=kind,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        return_token_ids=body.get("return_token_ids") is True,
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        profile=profile,
        content_key=hashlib.sha256(key).digest(),
        prefix_keys=keys,
    )


def request_metrics(truth: RequestTruth, detail: str, k: int) -> dict[str, Any]:
    """vLLM's per-request `metrics` object (--enable-per-request-metrics, --per-request-spec-decode-metrics), from the
    ground truth, with vLLM's definitions (vllm/entrypoints/generate/base/serving.py): queue time is queued to
    scheduled, time to first token and tokens per second start at scheduled, generation time is first token to last."""
    first = truth.first_token_at_s if truth.first_token_at_s is not None else truth.started_at_s
    end = truth.finished_at_s if truth.finished_at_s is not None else first
    submitted = truth.submitted_at_s if truth.submitted_at_s is not None else truth.started_at_s
    admitted = truth.admitted_at_s if truth.admitted_at_s is not None else submitted
    ttft_s = first - admitted  # vLLM times these from the step that scheduled the request, not from its arrival
    gen_s = end - first
    n = truth.completion_tokens
    out: dict[str, Any] = {
        "time_to_first_token_ms": ttft_s * 1000.0,
        "generation_time_ms": gen_s * 1000.0,
        "queue_time_ms": (admitted - submitted) * 1000.0,
        "mean_itl_ms": gen_s * 1000.0 / (n - 1) if n > 1 else 0.0,
        "tokens_per_second": n / (ttft_s + gen_s) if ttft_s + gen_s > 0 else 0.0,
    }
    if k > 0:
        steps = truth.drafts
        histogram = [0] * (k + 1)
        for a in truth.per_step_accepted:
            histogram[min(a, k)] += 1
        spec: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + truth.counted_accepted / steps if steps else 1.0,
            "draft_acceptance_rate": truth.counted_accepted / truth.draft_tokens if truth.draft_tokens else 0.0,
            "acceptance_histogram": histogram,
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": truth.counted_accepted,
            "num_draft_tokens": truth.draft_tokens,
            "num_spec_tokens": k,
        }
        if detail == "detailed":
            spec["per_step_accepted"] = list(truth.per_step_accepted)
            spec["per_step_drafted"] = list(truth.per_step_drafted)
        out["speculative_decoding"] = spec
    return out


@dataclass(slots=True)
class StreamFormatter:
    """Builds one response's SSE events, byte-compatible with vLLM 0.32."""

    kind: str
    response_id: str
    created: int
    model: str
    prompt_tokens: int
    continuous_usage: bool
    return_token_ids: bool
    system_fingerprint: str
    # vLLM --enable-prompt-tokens-details: the final usage says how many prompt tokens the prefix cache served, when
    # any (vllm/entrypoints/openai/serving_chat.py: `if self.enable_prompt_tokens_details and num_cached_tokens`)
    cached_tokens: int | None = None

    def _head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.model}

    def _usage(self, completion_tokens: int) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if self.kind == "chat":
            usage["completion_tokens_details"] = None
        return usage

    def role_event(self) -> bytes:
        chunk = self._head()
        chunk["choices"] = [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ]
        if self.continuous_usage:
            chunk["usage"] = self._usage(0)
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def delta_event(
        self,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        completion_tokens: int,
        extra: dict[str, Any] | None = None,  # more top-level fields (llama.cpp's final ``timings``)
    ) -> bytes:
        ids = token_ids if self.return_token_ids else None
        choice: dict[str, Any]
        if self.kind == "chat":
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = ids
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": ids,
            }
        chunk = self._head()
        chunk["choices"] = [choice]
        if self.continuous_usage:
            chunk["usage"] = self._usage(completion_tokens)
        if extra:
            chunk.update(extra)
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def usage_event(self, completion_tokens: int, metrics: dict[str, Any] | None) -> bytes:
        chunk = self._head()
        chunk["choices"] = []
        chunk["usage"] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        if self.cached_tokens:
            chunk["usage"]["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        chunk["system_fingerprint"] = self.system_fingerprint
        if metrics is not None:
            chunk["metrics"] = metrics
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


def error_event(status: int, message: str) -> bytes:
    return b"data: " + error_body(status, message) + b"\n\n"


def full_body(
    fmt: StreamFormatter, text: str, token_ids: list[int], finish_reason: str, metrics: dict[str, Any] | None
) -> bytes:
    """The non-streaming response body (chat.completion or text_completion)."""
    n = len(token_ids)
    ids = token_ids if fmt.return_token_ids else None
    usage = {
        "prompt_tokens": fmt.prompt_tokens,
        "total_tokens": fmt.prompt_tokens + n,
        "completion_tokens": n,
        "prompt_tokens_details": {"cached_tokens": fmt.cached_tokens} if fmt.cached_tokens else None,
    }
    head: dict[str, Any] = {"id": fmt.response_id}
    if fmt.kind == "chat":
        usage["completion_tokens_details"] = None
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        head.update(object="chat.completion", created=fmt.created, model=fmt.model)
        head["choices"] = [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": ids,
                "routed_experts": None,
            }
        ]
        head.update(service_tier=None, system_fingerprint=fmt.system_fingerprint, usage=usage)
        head.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    else:
        head.update(object="text_completion", created=fmt.created, model=fmt.model)
        head["choices"] = [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "token_ids": ids,
            }
        ]
        head.update(service_tier=None, system_fingerprint=fmt.system_fingerprint, usage=usage)
    head.update(kv_transfer_params=None, ec_transfer_params=None, metrics=metrics)
    return orjson.dumps(head)
