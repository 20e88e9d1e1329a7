"""The engines' own APIs beside their OpenAI ones, on the same SSE framing: SGLang's ``/generate`` and llama.cpp's
``/completion``. Which one a chunk belongs to is read from its shape, so one :class:`NativeDialect` serves every
OpenAI-style path too.

- SGLang ``/generate`` (python/sglang/srt/entrypoints/http_server.py, managers/tokenizer_manager.py): ``data:`` events
  ``{"text": ..., "meta_info": {...}}`` then ``data: [DONE]``. ``text`` is the whole text so far (unless the server
  runs ``--incremental-streaming-output``), ``meta_info.completion_tokens`` is cumulative, ``finish_reason`` is null
  or ``{"type": "stop"|"length"|"abort", ...}``. With speculation ``meta_info`` carries ``spec_verify_ct`` (verify
  steps) and, in newer versions, ``spec_num_correct_drafts`` / ``spec_num_proposed_drafts`` (older:
  ``spec_accept_token_num`` / ``spec_draft_token_num``, aliases ``spec_accepted_drafts`` / ``spec_proposed_drafts``)
  and a histogram of drafts accepted per step (``spec_correct_drafts_histogram``, older ``spec_accept_histogram``).
- SGLang's OpenAI API: the same fields in ``meta_info`` (``return_meta_info``), or, for a request that sets
  ``return_spec_tokens_details`` (SGLang >= 0.5.19), in ``sglext.spec_tokens_details`` on a chunk of its own with
  ``choices: []`` (python/sglang/srt/entrypoints/openai/utils.py ``spec_tokens_details_from_meta_info``; a list
  when n > 1, which is not read).
- llama.cpp ``/completion`` (tools/server/server.cpp): one event per token ``{"content": ..., "tokens": [...],
  "stop": false}``, the last ``stop: true`` with ``tokens_predicted``, ``tokens_evaluated``, ``stop_type``
  (``eos``, ``word``, ``limit``) and ``timings``. No ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from specproxy.core.dialects.base import Dialect, as_int, as_str
from specproxy.core.openai_stream import StreamChunk, interpret_json, llamacpp_timings

_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def _first(meta: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((meta[k] for k in keys if meta.get(k) is not None), None)


SGLANG_META_INFO = "sglang_meta_info"  # the shapes a record's spec.server_source names
SGLANG_SPEC_DETAILS = "sglang_spec_tokens_details"


def sglang_spec(meta: Mapping[str, Any], shape: str = SGLANG_META_INFO) -> dict[str, Any] | None:
    """SGLang's per-request speculative fields as vLLM's ``speculative_decoding`` block (the keys
    :func:`specproxy.attribution.estimates.from_server` reads), or None without ``spec_verify_ct``.

    Without an accepted count (SGLang before the explicit fields) it is derived: the prefill step brings the first
    token and each verify step 1 + accepted, so accepted = completion_tokens - spec_verify_ct - 1; marked
    ``derived`` (a request cut by its token limit may have had drafts accepted that were never emitted)."""
    steps = as_int(meta.get("spec_verify_ct"))
    if not steps:
        return None
    accepted = as_int(_first(meta, _ACCEPTED))
    derived = accepted is None
    if accepted is None:
        completion = as_int(meta.get("completion_tokens"))
        if completion is None:
            return None
        accepted = max(0, completion - steps - 1)
    hist = _first(meta, _HISTOGRAM)
    out: dict[str, Any] = {
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": as_int(_first(meta, _PROPOSED)),
        "engine": "sglang",
        "shape": shape,
    }
    if isinstance(hist, list) and all(as_int(h) is not None for h in hist):
        out["acceptance_histogram"] = hist
    if derived:
        out["derived"] = True
    return out


def _finish(v: Any) -> str | None:
    if isinstance(v, Mapping):
        return as_str(v.get("type"))
    return as_str(v)


class NativeDialect(Dialect):
    """OpenAI shapes, SGLang's ``/generate`` and llama.cpp's ``/completion``, told apart per chunk."""

    name = "openai"

    def __init__(self) -> None:
        self._text_so_far = 0  # SGLang streams the whole text so far: the delta is what follows it

    def chunk(self, obj: dict[str, Any]) -> StreamChunk:
        if "choices" in obj:
            c = interpret_json(obj)
            ext = obj.get("sglext")
            details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
            for m, shape in (
                (obj.get("meta_info"), SGLANG_META_INFO),  # return_meta_info
                (details, SGLANG_SPEC_DETAILS),  # return_spec_tokens_details
                (ext, SGLANG_META_INFO),  # the meta_info fields put straight on sglext
            ):
                if isinstance(m, dict) and (spec := sglang_spec(m, shape)) is not None:
                    return replace(c, spec=spec, engine="sglang")
            return c
        if isinstance(obj.get("meta_info"), dict) and "error" not in obj:
            return self._sglang(obj, obj["meta_info"])
        if "content" in obj and "stop" in obj and "error" not in obj:
            return self._llamacpp(obj)
        return interpret_json(obj)

    def _sglang(self, obj: dict[str, Any], meta: dict[str, Any]) -> StreamChunk:
        text = obj.get("text")
        text = text if isinstance(text, str) else ""
        if len(text) >= self._text_so_far:
            delta = text[self._text_so_far :]
            self._text_so_far = len(text)
        else:  # --incremental-streaming-output: each event carries only its own text
            delta = text
        finish = _finish(meta.get("finish_reason"))
        completion = as_int(meta.get("completion_tokens"))
        rid = meta.get("id")
        return StreamChunk(
            kind="chunk",
            id=rid if isinstance(rid, str) else None,
            n_choices=1,
            text=delta,
            finish_reason=finish,
            prompt_tokens=as_int(meta.get("prompt_tokens")),
            completion_tokens=completion,
            cached_tokens=as_int(meta.get("cached_tokens")),
            spec=sglang_spec(meta),
            engine="sglang",
            final=finish is not None,
        )

    def _llamacpp(self, obj: dict[str, Any]) -> StreamChunk:
        text = obj.get("content")
        text = text if isinstance(text, str) else ""
        final = obj.get("stop") is True
        ids = obj.get("tokens")
        stop_type = obj.get("stop_type")
        finish = None
        if final:
            finish = "length" if stop_type == "limit" else "stop"
        timings = obj.get("timings")
        return StreamChunk(
            kind="chunk",
            id=as_str(obj.get("id")),
            model=as_str(obj.get("model")),
            # the final event carries totals, not a step of its own (its text, if any, is kept but not counted)
            n_choices=0 if final else 1,
            text=text,
            finish_reason=finish,
            prompt_tokens=as_int(obj.get("tokens_evaluated")) if final else None,
            completion_tokens=as_int(obj.get("tokens_predicted")) if final else None,
            n_token_ids=len(ids) if isinstance(ids, list) and not final else None,
            llama_timings=timings if isinstance(timings, dict) else None,
            engine_timings=llamacpp_timings(timings) if isinstance(timings, dict) else None,
            engine="llamacpp",
            final=final,
        )
