"""OpenAI Responses (``POST /v1/responses``), which vLLM serves (vllm/entrypoints/openai/responses/). Streaming events
(platform.openai.com, "Streaming events" of the Responses API), each with a ``type`` (also sent as the SSE ``event:``
name) and a ``sequence_number``:

``response.created`` / ``response.in_progress`` (``response.id``, ``model``), ``response.output_item.added``,
``response.content_part.added``, then the deltas ``response.output_text.delta``, ``response.reasoning_text.delta``,
``response.function_call_arguments.delta`` (``delta``: text), their ``.done`` events, and at the end
``response.completed`` (or ``response.incomplete``: ``incomplete_details.reason`` is ``max_output_tokens`` when cut,
or ``response.failed``) whose ``response.usage`` has ``input_tokens``, ``output_tokens`` and
``input_tokens_details.cached_tokens``. ``error`` events carry ``code`` and ``message``. No ``[DONE]``.
vLLM (vllm/entrypoints/openai/responses/simple_streaming_events.py) sends one text delta per engine output, with a
``logprobs`` entry per token when the request asks for them: then the count per delta is exact.
"""

from __future__ import annotations

from typing import Any

from specproxy.core.dialects.base import Dialect, as_int, as_str
from specproxy.core.openai_stream import StreamChunk

_DELTAS = (
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
    "response.refusal.delta",
)
_ENDS = ("response.completed", "response.incomplete", "response.failed")


def _usage(u: Any) -> tuple[int | None, int | None, int | None]:
    if not isinstance(u, dict):
        return None, None, None
    details = u.get("input_tokens_details")
    cached = as_int(details.get("cached_tokens")) if isinstance(details, dict) else None
    return as_int(u.get("input_tokens")), as_int(u.get("output_tokens")), cached


def _output_text(resp: dict[str, Any]) -> str:
    texts: list[str] = []
    output = resp.get("output")
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        if isinstance(item.get("arguments"), str):
            texts.append(item["arguments"])
    return "".join(texts)


def _whole(resp: dict[str, Any], *, streamed: bool) -> StreamChunk:
    status = resp.get("status")
    details = resp.get("incomplete_details")
    finish = "stop" if status == "completed" else None
    if status == "incomplete":
        reason = details.get("reason") if isinstance(details, dict) else None
        finish = "length" if reason == "max_output_tokens" else as_str(reason) or "incomplete"
    if status == "failed":
        return StreamChunk(kind="error", error=resp.get("error") or "response failed", id=as_str(resp.get("id")))
    prompt, completion, cached = _usage(resp.get("usage"))
    return StreamChunk(
        kind="chunk",
        id=as_str(resp.get("id")),
        model=as_str(resp.get("model")),
        text="" if streamed else _output_text(resp),
        finish_reason=finish,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        final=True,
    )


class ResponsesDialect(Dialect):
    name = "responses"

    def chunk(self, obj: dict[str, Any]) -> StreamChunk:
        kind = obj.get("type")
        if kind == "error":
            return StreamChunk(kind="error", error={"code": obj.get("code"), "message": obj.get("message")})
        if kind in _DELTAS:
            delta = obj.get("delta")
            if not isinstance(delta, str) or not delta:
                return StreamChunk(kind="chunk")
            # with logprobs asked for, vLLM sends one entry per token of the delta: an exact count
            lps = obj.get("logprobs")
            n_ids = len(lps) if isinstance(lps, list) and lps else None
            return StreamChunk(kind="chunk", n_choices=1, text=delta, n_token_ids=n_ids)
        resp = obj.get("response")
        if kind in _ENDS and isinstance(resp, dict):
            return _whole(resp, streamed=True)
        if kind in ("response.created", "response.in_progress") and isinstance(resp, dict):
            return StreamChunk(kind="chunk", id=as_str(resp.get("id")), model=as_str(resp.get("model")))
        if obj.get("object") == "response":  # a whole non-streamed response
            return _whole(obj, streamed=False)
        if "error" in obj and kind is None:
            return StreamChunk(kind="error", error=obj["error"])
        return StreamChunk(kind="chunk")
