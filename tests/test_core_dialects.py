"""The wire dialects beside OpenAI chat: golden transcripts fed whole, split at every byte offset and one byte at a
time must read the same (events, token counts, totals, timings, text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from specproxy.attribution.choice import Evidence, decide
from specproxy.attribution.estimates import from_server
from specproxy.core.dialects import dialect_for, stream_framing
from specproxy.core.dialects.engine import (
    decode_figure,
    decode_off_engine,
    from_probe,
    from_server_header,
    resolve,
)
from specproxy.core.dialects.native import sglang_spec
from specproxy.core.ndjson import NDJSONDecoder
from specproxy.core.openai_stream import interpret
from specproxy.core.stats import token_span
from specproxy.core.timeline import timeline_for
from specproxy.core.tokens import ApproxTokenizer

DATA = Path(__file__).parent / "data" / "dialects"
TOK = ApproxTokenizer()  # one deterministic count, whatever is installed

CASES = {
    "ollama_chat.ndjson": ("/api/chat", "application/x-ndjson"),
    "ollama_generate.ndjson": ("/api/generate", "application/x-ndjson; charset=utf-8"),
    "anthropic.sse": ("/v1/messages", "text/event-stream; charset=utf-8"),
    "responses.sse": ("/v1/responses", "text/event-stream"),
    "sglang_generate.sse": ("/generate", "text/event-stream"),
    "llamacpp_completion.sse": ("/completion", "text/event-stream"),
}


def _read(name: str, pieces: list[bytes]) -> dict[str, Any]:
    path, ctype = CASES[name]
    tl = timeline_for(0, path=path, content_type=ctype, tokenizer=TOK, keep_text=True)
    for i, p in enumerate(pieces):
        tl.feed(1000 * (i + 1), p)
    r = tl.result(10**9)
    return {
        "tokens": [n for _, n in r.chunks],
        "text": r.response_text,
        "source": r.token_source,
        "completion": r.completion_tokens,
        "prompt": r.prompt_tokens,
        "cached": r.cached_tokens,
        "finish": r.finish_reason,
        "id": r.upstream_id,
        "done": r.done,
        "engine": r.engine_hint,
        "timings": r.engine_timings,
        "spec": r.server_spec,
        "llama": r.llama_timings,
        "events": r.events,
        "non_json": r.non_json_events,
        "error": r.error,
        "dialect": r.dialect,
    }


EXPECTED: dict[str, dict[str, Any]] = {
    "ollama_chat.ndjson": {
        "text": "Hello 世界",
        "completion": 3,
        "prompt": 26,
        "finish": "length",
        "engine": "ollama",
        "done": True,
        "timings": {
            "prompt_tokens": 26,
            "prompt_s": 0.2,
            "decode_tokens": 3,
            "decode_s": 0.3,
            "load_s": 0.001,
            "total_s": 1.23456789,
        },
        "events": 4,
        "dialect": "ollama",
    },
    "ollama_generate.ndjson": {
        "text": "def f():",
        "completion": 2,
        "prompt": 4,
        "finish": "stop",
        "engine": "ollama",
        "done": True,
    },
    "anthropic.sse": {
        "text": "HmmHello, 世界",
        "completion": 6,
        "prompt": 12,
        "finish": "length",
        "id": "msg_01",
        "done": True,
        "tokens_n": 3,
        "dialect": "anthropic",
    },
    "responses.sse": {
        "text": "print(1)",
        "completion": 4,
        "prompt": 7,
        "cached": 3,
        "finish": "stop",
        "id": "resp_7",
        "done": True,
        "tokens_n": 2,
        "dialect": "responses",
    },
    "sglang_generate.sse": {
        "text": "Hello world!",
        "tokens": [1, 3, 2],
        "source": "usage",
        "completion": 6,
        "prompt": 9,
        "finish": "stop",
        "id": "9f1",
        "engine": "sglang",
        "done": True,
    },
    "llamacpp_completion.sse": {
        "text": "Hi there",
        "tokens": [1, 1],
        "source": "token_ids",
        "completion": 2,
        "prompt": 5,
        "finish": "length",
        "engine": "llamacpp",
        "done": True,
        "timings": {
            "prompt_tokens": 5,
            "prompt_s": 0.0105,
            "decode_tokens": 2,
            "decode_s": 0.04,
            "draft_tokens": 4,
            "draft_accepted": 1,
        },
    },
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_transcript_reads_the_same_at_every_split(name: str) -> None:
    data = (DATA / name).read_bytes()
    whole = _read(name, [data])
    want = EXPECTED[name]
    for key, value in want.items():
        if key == "tokens_n":
            assert len(whole["tokens"]) == value and all(n >= 1 for n in whole["tokens"])
        elif key == "timings":
            assert whole["timings"] == pytest.approx(value)
        else:
            assert whole[key] == value, key
    assert whole["error"] is None and whole["non_json"] == 0
    for cut in range(1, len(data)):
        assert _read(name, [data[:cut], data[cut:]]) == whole, cut
    assert _read(name, [data[i : i + 1] for i in range(len(data))]) == whole
    # CRLF line ends read the same
    assert {k: v for k, v in _read(name, [data.replace(b"\n", b"\r\n")]).items()} == whole


def test_sglang_spec_reads_as_vllm_per_request_stats() -> None:
    whole = _read("sglang_generate.sse", [(DATA / "sglang_generate.sse").read_bytes()])
    est = from_server(whole["spec"])
    assert est is not None and est.exact and est.draft_tokens_known
    assert (est.counts.accepted, est.counts.drafts, est.counts.draft_tokens) == (3, 2, 6)
    assert est.counts.per_position == (2, 1, 0)  # from the histogram: steps that accepted more than i
    # older SGLang: only spec_verify_ct; accepted = completion - steps - 1 (the prefill token), marked derived
    old = sglang_spec({"spec_verify_ct": 4, "completion_tokens": 11})
    est = from_server(old or {})
    assert est is not None and not est.exact and not est.draft_tokens_known
    assert (est.counts.accepted, est.counts.drafts) == (6, 4)
    assert sglang_spec({"completion_tokens": 11}) is None and sglang_spec({"spec_verify_ct": 0}) is None


def test_per_token_engines_get_no_chunk_estimate_but_their_own_figures() -> None:
    whole = _read("llamacpp_completion.sse", [(DATA / "llamacpp_completion.sse").read_bytes()])
    ev = Evidence(
        stream=True,
        tokens=whole["tokens"],
        exact_counts=True,
        several_choices=False,
        k=None,
        llama_timings=whole["llama"],
        per_token_events=True,
    )
    choice = decide(ev)
    assert choice.chunks is None and not choice.chunks_are_steps and "chunks_not_steps_engine" in choice.flags
    assert choice.source == "server" and choice.server is not None
    assert (choice.server.counts.accepted, choice.server.counts.draft_tokens) == (1, 4)
    # the same chunks from an engine that steps (vLLM) do give a chunk estimate
    assert decide(Evidence(stream=True, tokens=[1, 2, 1], exact_counts=True, several_choices=False, k=2)).chunks


def test_openai_shapes_name_their_engine() -> None:
    assert interpret('{"choices":[{"index":0,"delta":{"content":"a"}}],"system_fingerprint":"fp_ollama"}').engine == (
        "ollama"
    )
    final = interpret('{"choices":[],"usage":{"completion_tokens":3},"timings":{"predicted_n":3,"predicted_ms":30}}')
    assert final.engine == "llamacpp" and final.engine_timings == {"decode_tokens": 3, "decode_s": 0.03}
    vllm = interpret('{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":[4]}]}')
    assert vllm.engine == "vllm"
    sg = dialect_for("/v1/chat/completions").json(
        {"choices": [{"index": 0, "delta": {"content": "a"}}], "sglext": {"spec_verify_ct": 2, "completion_tokens": 5}}
    )
    assert sg.engine == "sglang" and sg.spec is not None and sg.spec["num_accepted_draft_tokens"] == 2


def test_responses_logprobs_give_exact_counts() -> None:
    tl = timeline_for(0, path="/v1/responses", content_type="text/event-stream")
    delta = {"type": "response.output_text.delta", "delta": "ab c", "logprobs": [{"token": "ab"}, {"token": " c"}]}
    tl.feed(1, b"data: " + orjson.dumps(delta) + b"\n\n")
    r = tl.result(2)
    assert r.chunks == [(1e-9, 2)] and r.token_source == "token_ids"


def test_non_streamed_bodies() -> None:
    cases = [
        (
            "/api/chat",
            {
                "model": "m",
                "message": {"role": "assistant", "content": "hi"},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 3,
                "eval_count": 2,
                "eval_duration": 10**8,
            },
            ("hi", 2, 3, "stop"),
        ),
        (
            "/v1/messages",
            {
                "id": "m1",
                "type": "message",
                "content": [{"type": "text", "text": "yo"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 4, "output_tokens": 1},
            },
            ("yo", 1, 4, "stop"),
        ),
        (
            "/v1/responses",
            {
                "id": "r1",
                "object": "response",
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "ab"}]}],
                "usage": {"input_tokens": 5, "output_tokens": 2},
            },
            ("ab", 2, 5, "length"),
        ),
        (
            "/generate",
            {
                "text": "xyz",
                "meta_info": {
                    "id": "s",
                    "finish_reason": {"type": "length"},
                    "prompt_tokens": 6,
                    "completion_tokens": 3,
                },
            },
            ("xyz", 3, 6, "length"),
        ),
        (
            "/completion",
            {
                "content": "ok",
                "stop": True,
                "stop_type": "eos",
                "tokens_predicted": 1,
                "tokens_evaluated": 2,
                "timings": {"predicted_n": 1, "predicted_ms": 5.0},
            },
            ("ok", 1, 2, "stop"),
        ),
    ]
    for path, body, (text, completion, prompt, finish) in cases:
        tl = timeline_for(0, path=path, content_type="application/json", keep_text=True)
        assert not tl.stream
        tl.feed(1, orjson.dumps(body))
        r = tl.result(2)
        assert (r.response_text, r.completion_tokens, r.prompt_tokens, r.finish_reason) == (
            text,
            completion,
            prompt,
            finish,
        ), path
        assert r.done and r.error is None


def test_errors_in_each_dialect() -> None:
    for path, ctype, data in [
        ("/api/chat", "application/x-ndjson", b'{"error":"model \\"x\\" not found"}\n'),
        (
            "/v1/messages",
            "text/event-stream",
            b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n',
        ),
        ("/v1/responses", "text/event-stream", b'data: {"type":"error","code":"x","message":"bad"}\n\n'),
        (
            "/v1/responses",
            "text/event-stream",
            b'data: {"type":"response.failed","response":{"id":"r","status":"failed","error":{"message":"oom"}}}\n\n',
        ),
    ]:
        tl = timeline_for(0, path=path, content_type=ctype)
        tl.feed(1, data)
        assert tl.result(2).error is not None, path


def test_ndjson_decoder_and_framing() -> None:
    d = NDJSONDecoder()
    assert d.feed(b'{"a":1}\r\n\n{"b"') == ['{"a":1}'] and d.buffered == 4
    assert d.feed(b":2}") == [] and d.flush() == ['{"b":2}'] and d.flush() == []
    garbage = timeline_for(0, path="/api/chat", content_type="application/x-ndjson")
    garbage.feed(1, b"not json\n")
    assert garbage.result(2).non_json_events == 1
    assert stream_framing("application/x-ndjson") == "ndjson" and stream_framing("application/json") is None
    assert stream_framing("Text/Event-Stream; charset=utf-8") == "sse"


def test_engine_clues() -> None:
    assert from_server_header("llama.cpp") == "llamacpp" and from_server_header("uvicorn") is None
    assert from_probe("/api/version", 200, {"version": "0.12.3"}) == "ollama"
    assert from_probe("/props", 200, {"default_generation_settings": {}, "total_slots": 1}) == "llamacpp"
    assert from_probe("/get_server_info", 200, {"model_path": "x", "tp_size": 1}) == "sglang"
    assert from_probe("/version", 200, {"version": "0.32.0"}) == "vllm"
    assert from_probe("/version", 404, {"version": "0.32.0"}) is None
    assert resolve("llamacpp", "vllm") == "llamacpp" and resolve("auto", None, "sglang", "vllm") == "sglang"
    assert resolve("auto", None, None) is None


def test_a_decode_span_far_from_the_engines_own_is_told() -> None:
    timed = {"decode_tokens": 63.0, "decode_s": 0.63}  # the engine decoded 63 tokens after the first in 0.63 s
    assert not decode_off_engine(0.63, timed) and not decode_off_engine(0.48, timed)
    assert not decode_off_engine(0.78, timed)
    assert decode_off_engine(0.47, timed) and decode_off_engine(0.79, timed) and decode_off_engine(0.07, timed)
    assert decode_off_engine(0.0, timed)  # every chunk in one read: untimed, though the engine timed it
    assert not decode_off_engine(0.0, None) and not decode_off_engine(5.0, {"decode_s": 1.0})  # the engine did not
    assert not decode_off_engine(5.0, {"decode_tokens": 7.0, "decode_s": 0.07})  # too short to tell
    assert token_span([(0.1, 0), (0.2, 1), (0.3, 0), (0.5, 2), (0.6, 0)]) == pytest.approx(0.3)
    assert token_span([(0.2, 1)]) == 0.0


def test_the_decode_figure_follows_the_engine_that_timed_it() -> None:
    llama = {"decode_tokens": 30.0, "decode_s": 0.3}
    chunks = [(0.0, 1), (1.0, 1)]
    # llama.cpp's own rate replaces the chunks', whichever engine was configured, if the response's shape says llama.cpp
    assert decode_figure(("vllm", "llamacpp"), True, chunks, 1.0, llama) == (100.0, "decode_rate_from_engine")
    assert decode_figure(("ollama", None), True, chunks, 1.0, llama) == (100.0, "decode_rate_from_engine")
    # vLLM's is only a check: 1 s of chunks against the engine's 0.3 s
    assert decode_figure(("vllm", "vllm"), True, chunks, 29.0, llama) == (29.0, "decode_rate_off_engine")
    assert decode_figure(("vllm", "vllm"), True, [(0.0, 1), (0.31, 1)], 29.0, llama) == (29.0, None)
    assert decode_figure(("vllm", "vllm"), False, chunks, 29.0, llama) == (29.0, None)  # not streamed: no span
