"""One :class:`~specproxy.sim.dialects.Api` per dialect the simulator speaks, and the paths that reach them.

Each follows the engine's own wire shape (sources in docs/engines.md); figures the engine reports about itself are
taken from the request's ground truth.
"""

from __future__ import annotations

from typing import Any

import orjson

from specproxy.sim.dialects import ANTHROPIC_STOP, NDJSON, Api, Ctx, durations, histogram, sse
from specproxy.sim.records import RequestTruth


class Ollama(Api):
    content_type = NDJSON
    per_token = True

    def __init__(self, chat: bool) -> None:
        self.chat = chat

    def _line(self, c: Ctx, text: str, done: bool) -> dict[str, Any]:
        line: dict[str, Any] = {"model": c.model, "created_at": "2026-01-01T00:00:00Z"}
        if self.chat:
            line["message"] = {"role": "assistant", "content": text}
        else:
            line["response"] = text
        line["done"] = done
        return line

    def step(self, c: Ctx, text: str, ids: list[int], completion: int, finish: str | None) -> bytes:
        return orjson.dumps(self._line(c, text, False)) + b"\n"

    def tail(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return orjson.dumps(self._final(c, t, finish, completion, "")) + b"\n"  # the text went line by line

    def _final(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str) -> dict[str, Any]:
        prompt_s, decode_s, total_s = durations(t)
        line = self._line(c, text, True)
        line.update(
            done_reason=finish,
            total_duration=round(total_s * 1e9),
            load_duration=0,
            prompt_eval_count=c.prompt_tokens,
            prompt_eval_duration=round(prompt_s * 1e9),
            eval_count=completion,
            eval_duration=round(decode_s * 1e9),
        )
        return line

    def whole(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return orjson.dumps(self._final(c, t, finish, completion, text))


class Anthropic(Api):
    id_prefix = "msg_"

    def head(self, c: Ctx) -> bytes:
        msg: dict[str, Any] = {
            "id": c.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": c.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": c.prompt_tokens, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": msg}) + sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )

    def step(self, c: Ctx, text: str, ids: list[int], completion: int, finish: str | None) -> bytes:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return sse("content_block_delta", delta)

    def tail(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        usage = {"input_tokens": c.prompt_tokens, "output_tokens": completion}
        return (
            sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            + sse(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": ANTHROPIC_STOP.get(finish)}, "usage": usage},
            )
            + sse("message_stop", {"type": "message_stop"})
        )

    def whole(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return orjson.dumps(
            {
                "id": c.id,
                "type": "message",
                "role": "assistant",
                "model": c.model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": ANTHROPIC_STOP.get(finish),
                "stop_sequence": None,
                "usage": {"input_tokens": c.prompt_tokens, "output_tokens": completion},
            }
        )


class Responses(Api):
    id_prefix = "resp_"

    def __init__(self) -> None:
        self.seq = 0

    def _ev(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, obj)

    def _response(self, c: Ctx, status: str, text: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        output = (
            []
            if text is None
            else [
                {
                    "id": "msg_" + c.id,
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ]
        )
        resp: dict[str, Any] = {
            "id": c.id,
            "object": "response",
            "created_at": c.created,
            "model": c.model,
            "status": status,
            "output": output,
            "usage": usage,
        }
        if status == "incomplete":
            resp["incomplete_details"] = {"reason": "max_output_tokens"}
        return resp

    def head(self, c: Ctx) -> bytes:
        return self._ev("response.created", response=self._response(c, "in_progress", None, None))

    def step(self, c: Ctx, text: str, ids: list[int], completion: int, finish: str | None) -> bytes:
        return self._ev(
            "response.output_text.delta",
            item_id="msg_" + c.id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _usage(self, c: Ctx, completion: int) -> dict[str, Any]:
        return {
            "input_tokens": c.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": c.prompt_tokens + completion,
        }

    def tail(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        status = "incomplete" if finish == "length" else "completed"
        kind = "response." + status
        return self._ev(kind, response=self._response(c, status, text, self._usage(c, completion)))

    def whole(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        status = "incomplete" if finish == "length" else "completed"
        return orjson.dumps(self._response(c, status, text, self._usage(c, completion)))


def llamacpp_timings(c: Ctx, t: RequestTruth, completion: int) -> dict[str, Any]:
    """llama.cpp's ``timings`` object; ``draft_n`` / ``draft_n_accepted`` only when it drafted."""
    prompt_s, decode_s, _ = durations(t)
    out: dict[str, Any] = {
        "prompt_n": c.prompt_tokens,
        "prompt_ms": prompt_s * 1e3,
        "prompt_per_token_ms": prompt_s * 1e3 / c.prompt_tokens if c.prompt_tokens else 0.0,
        "prompt_per_second": c.prompt_tokens / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": completion,
        "predicted_ms": decode_s * 1e3,
        "predicted_per_token_ms": decode_s * 1e3 / completion if completion else 0.0,
        "predicted_per_second": completion / decode_s if decode_s > 0 else 0.0,
    }
    if t.draft_tokens > 0:
        out["draft_n"] = t.draft_tokens
        out["draft_n_accepted"] = t.counted_accepted
    return out


class LlamaCpp(Api):
    per_token = True

    def step(self, c: Ctx, text: str, ids: list[int], completion: int, finish: str | None) -> bytes:
        return sse(
            None,
            {
                "index": 0,
                "content": text,
                "tokens": ids,
                "stop": False,
                "id_slot": 0,
                "tokens_predicted": completion,
                "tokens_evaluated": c.prompt_tokens,
            },
        )

    def _final(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str) -> dict[str, Any]:
        return {
            "index": 0,
            "content": text,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": c.model,
            "tokens_predicted": completion,
            "tokens_evaluated": c.prompt_tokens,
            "has_new_line": False,
            "truncated": False,
            "stop_type": "limit" if finish == "length" else "eos",
            "stopping_word": "",
            "tokens_cached": c.prompt_tokens + completion,
            "timings": llamacpp_timings(c, t, completion),
        }

    def tail(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return sse(None, self._final(c, t, finish, completion, ""))

    def whole(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return orjson.dumps(self._final(c, t, finish, completion, text))


def sglang_meta(c: Ctx, t: RequestTruth | None, completion: int, finish: str | None, k: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": c.id,
        "finish_reason": {"type": finish} if finish else None,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": completion,
        "cached_tokens": 0,
    }
    if t is not None and k > 0:
        meta["spec_verify_ct"] = t.drafts
        if t.drafts:
            meta.update(
                spec_accept_rate=t.counted_accepted / t.draft_tokens if t.draft_tokens else 0.0,
                spec_accept_length=completion / t.drafts,
                spec_num_correct_drafts=t.counted_accepted,
                spec_num_proposed_drafts=t.draft_tokens,
                spec_accepted_drafts=t.counted_accepted,
                spec_proposed_drafts=t.draft_tokens,
                spec_correct_drafts_histogram=histogram(t, k),
                spec_accept_histogram=histogram(t, k),
            )
    return meta


class SGLang(Api):
    def __init__(self) -> None:
        self.text = ""

    def step(self, c: Ctx, text: str, ids: list[int], completion: int, finish: str | None) -> bytes:
        self.text += text  # SGLang streams the whole text so far
        return sse(None, {"text": self.text, "meta_info": sglang_meta(c, None, completion, None, 0)})

    def tail(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        meta = sglang_meta(c, t, completion, finish, k)
        return sse(None, {"text": self.text, "meta_info": meta}) + b"data: [DONE]\n\n"

    def whole(self, c: Ctx, t: RequestTruth, finish: str, completion: int, text: str, k: int) -> bytes:
        return orjson.dumps({"text": text, "meta_info": sglang_meta(c, t, completion, finish, k)})


def make_api(name: str) -> Api:
    """A fresh formatter (some keep per-response state) for one of :data:`PATHS`' apis."""
    if name in ("ollama_chat", "ollama_generate"):
        return Ollama(chat=name == "ollama_chat")
    return {"anthropic": Anthropic, "responses": Responses, "llamacpp": LlamaCpp, "sglang": SGLang}[name]()


PATHS = {
    "/api/chat": "ollama_chat",
    "/api/generate": "ollama_generate",
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
    "/completion": "llamacpp",
    "/generate": "sglang",
}
