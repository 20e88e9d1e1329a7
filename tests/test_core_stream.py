"""OpenAI stream interpretation and per-chunk token counts on the real captures."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from specproxy.core.dialects.engine import decode_figure
from specproxy.core.openai_stream import interpret, interpret_json
from specproxy.core.sse import SSEDecoder
from specproxy.core.stats import decode_tok_s, percentile, step_and_token_gaps, summarize, token_span
from specproxy.core.timeline import ResponseTimeline
from specproxy.core.tokens import ApproxTokenizer, ChunkTokenCounter

DATA = Path(__file__).parent / "data"


def chunk_tokens(name: str, *, use_usage: bool = True) -> list[int]:
    counter = ChunkTokenCounter(ApproxTokenizer())
    d = SSEDecoder()
    out = []
    for ev in d.feed((DATA / name).read_bytes()):
        c = interpret(ev.data)
        if c.kind != "chunk" or not c.has_choices:
            continue
        n, src = counter.count(
            has_choices=c.has_choices,
            completion_tokens=c.completion_tokens if use_usage else None,
            n_token_ids=c.n_token_ids,
            text=c.text,
            finish_reason=c.finish_reason,
            role=c.role,
        )
        assert src == ("usage" if use_usage else src)
        if n:
            out.append(n)
    return out


def test_ngram_code_tokens_per_chunk_and_accepted_match_readme() -> None:
    toks = chunk_tokens("chat-stream-ngram-k3-code.sse")
    assert Counter(toks) == Counter({1: 71, 2: 1, 3: 4, 4: 4})  # as the data README lists
    assert sum(n - 1 for n in toks[1:]) == 21  # == the counter delta of accepted tokens
    assert sum(toks) == 101


def test_draft_model_capture() -> None:
    toks = chunk_tokens("chat-stream-draftmodel-k3-code.sse")
    assert toks[0] == 1 and Counter(toks[1:])[4] == 23
    assert sum(n - 1 for n in toks[1:]) == 69


def test_per_request_metrics_capture_agrees_with_chunks() -> None:
    d = SSEDecoder()
    chunks = [interpret(ev.data) for ev in d.feed((DATA / "chat-stream-ngram-k3-per-request-metrics.sse").read_bytes())]
    assert chunks[0].role and chunks[-1].kind == "done"
    final = chunks[-2]
    assert final.n_choices == 0 and final.spec is not None
    assert final.spec["num_accepted_draft_tokens"] == 13 and final.spec["num_spec_steps"] == 14
    toks = chunk_tokens("chat-stream-ngram-k3-per-request-metrics.sse")
    assert sum(n - 1 for n in toks[1:]) == 13
    assert sum(toks) == final.completion_tokens == 97
    # --enable-per-request-metrics: the engine core's own timing of this request, in seconds; mean_itl_ms is
    # generation_time_ms over the tokens after the first, so the two must agree
    t = final.engine_timings
    assert final.engine == "vllm" and t is not None
    assert t["decode_s"] == pytest.approx(2.7612986750000346) and t["decode_tokens"] == 96
    assert t["ttft_s"] == pytest.approx(1.4557361429999673) and t["queue_s"] == pytest.approx(4.208199993627204e-05)
    assert t["decode_s"] / t["decode_tokens"] == pytest.approx(28.763527864583693e-3)
    assert all(c.engine_timings is None for c in chunks[:-2])  # only the final usage chunk carries them


def test_completions_stream_shape() -> None:
    d = SSEDecoder()
    chunks = [
        interpret(ev.data) for ev in d.feed((DATA / "completions-stream-ngram-k3-per-request-metrics.sse").read_bytes())
    ]
    assert not chunks[0].role and chunks[0].text and chunks[0].completion_tokens == 1
    assert chunks[-2].spec is not None
    toks = chunk_tokens("completions-stream-ngram-k3-per-request-metrics.sse")
    assert sum(toks) == chunks[-2].completion_tokens


def test_nonstream_body() -> None:
    body = json.loads((DATA / "chat-nonstream-ngram-k3-per-request-metrics.json").read_text())
    c = interpret_json(body)
    assert c.completion_tokens == 60 and c.prompt_tokens == 125
    assert c.spec is not None and c.spec["num_draft_tokens"] == 54
    assert c.text.startswith("def fibonacci") and c.finish_reason == "stop"
    assert c.engine_timings is not None and c.engine_timings["decode_tokens"] == 59
    assert c.engine_timings["decode_s"] / 59 == pytest.approx(10.576735474576369e-3)


def test_without_usage_the_tokenizer_counts_and_says_so() -> None:
    counter = ChunkTokenCounter(ApproxTokenizer())
    assert counter.count(has_choices=True, completion_tokens=None, n_token_ids=None, text="hello world") == (
        2,
        "approx",
    )
    assert counter.count(has_choices=True, completion_tokens=None, n_token_ids=3, text="x") == (3, "token_ids")
    # usage on the final choices-[] chunk only is a total, not a step
    assert counter.count(has_choices=False, completion_tokens=120, n_token_ids=None, text="") == (0, "none")


def test_steps_without_text_are_tokens_when_usage_comes_only_at_the_end() -> None:
    """vLLM streams a step whose tokens end inside a character with empty text (SmolLM2's byte-level tokens on
    Japanese; captured with usage only at the end). Each such chunk is a step, so it counts a token, and the first of
    them is the first token's time; only the role chunk before it is no step."""
    events = list(SSEDecoder().feed((DATA / "chat-stream-ngram-k3-ja-usage-at-end.sse").read_bytes()))
    parsed = [interpret(ev.data) for ev in events]
    assert parsed[0].role and not parsed[0].text
    empty_steps = [i for i, c in enumerate(parsed) if c.has_choices and not c.role and not c.text]
    assert len(empty_steps) == 5 and empty_steps[0] == 1  # the capture's shape
    tl = ResponseTimeline(0, stream=True, tokenizer=ApproxTokenizer())
    for i, ev in enumerate(events):  # one event per millisecond, as its own read
        tl.feed((i + 1) * 1_000_000, f"data: {ev.data}\n\n".encode())
    r = tl.result(len(events) * 1_000_000)
    step_chunks = sum(1 for c in parsed if c.has_choices and not c.role)
    assert len(tl.chunks) == step_chunks == 12 and all(n >= 1 for _, n in tl.chunks)
    assert tl.first_token_ns == 2_000_000  # the second event: a token with no text
    assert r.completion_tokens == 24


def test_a_text_counted_reply_read_on_time_is_not_off_the_engines_clock() -> None:
    """With usage only at the end, the chunks' token counts come from text and need not match the engine's count, so
    their rate differs from vLLM's own though nothing was read late: the check compares time spans, not rates."""
    events = list(SSEDecoder().feed((DATA / "chat-stream-ngram-k3-ja-usage-at-end.sse").read_bytes()))
    parsed = [interpret(ev.data) for ev in events]
    timed = parsed[-2].engine_timings
    assert timed is not None and timed["decode_tokens"] == 23 and timed["decode_s"] == pytest.approx(0.9659864640)
    steps = [i for i, c in enumerate(parsed) if c.has_choices and not c.role]
    gap_ns = int(timed["decode_s"] * 1e9 / (len(steps) - 1))  # the token chunks spread over the engine's own span
    tl = ResponseTimeline(0, stream=True, tokenizer=ApproxTokenizer())
    t_ns = 0
    for i, ev in enumerate(events):
        t_ns += gap_ns if i in steps[1:] else 1_000
        tl.feed(t_ns, f"data: {ev.data}\n\n".encode())
    r = tl.result(t_ns)
    rate = decode_tok_s(tl.chunks)
    assert rate is not None and abs(rate / (23 / timed["decode_s"]) - 1) > 0.25  # the rates disagree by counting
    assert token_span(tl.chunks) == pytest.approx(timed["decode_s"], rel=1e-3)
    assert decode_figure(("vllm", r.engine_hint), True, tl.chunks, rate, timed) == (rate, None)  # the spans agree


def test_odd_events_never_crash() -> None:
    assert interpret("[DONE]").kind == "done"
    assert interpret("not json {").kind == "non_json"
    assert interpret("not json {").raw == "not json {"
    assert interpret("[1, 2]").kind == "non_json"
    err = interpret('{"error": {"message": "boom", "code": 500}}')
    assert err.kind == "error" and err.error["message"] == "boom"
    tool = interpret(
        '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":1}"}}]}}]}'
    )
    assert tool.text == '{"a":1}'
    reasoning = interpret('{"choices":[{"index":0,"delta":{"reasoning_content":"hmm","content":null}}]}')
    assert reasoning.text == "hmm"
    assert interpret('{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":null}').text == "a"


def test_approx_tokenizer_japanese_and_code() -> None:
    t = ApproxTokenizer()
    assert t.count("こんにちは") == 5
    assert t.count("def f(x):\n    return x") >= 5
    assert t.count("") == 0


def test_stats() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1], 101)
    s = summarize([3, 1, 2])
    assert (s.count, s.p50, s.min, s.max) == (3, 2, 1, 3)
    chunks = [(0.0, 0), (0.1, 1), (0.2, 4), (0.3, 1)]
    steps, toks = step_and_token_gaps(chunks)
    assert steps == pytest.approx([0.1, 0.1])
    assert toks == pytest.approx([0.025] * 4 + [0.1])
    assert decode_tok_s(chunks) == pytest.approx(5 / 0.2)
    assert decode_tok_s([(0.0, 1)]) is None


def test_the_approximate_count_of_ascii_text_is_the_general_counts() -> None:
    """ASCII text skips the CJK passes; every text must count as the general rule counts it (CJK characters one
    each, the rest by words)."""
    import random

    from specproxy.core.tokens import _CJK, _WORDS

    def general(text: str) -> int:
        cjk = len(_CJK.findall(text))
        return cjk + sum(max(1, (len(w) + 2) // 6) for w in _WORDS.findall(_CJK.sub(" ", text)))

    rng = random.Random(7)
    alphabet = "ab Z09_ .,;(){}\n\t\r-+=*/\\'\"\x00\x7f" + "é漢字かなカナ한글ｶ　"
    texts = ["", " ", "the", " Hello world", "def foo(x):\n    return x", "こんにちは", "a漢b", "ｶﾀｶﾅ", "日本語 text"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(3000)]
    tok = ApproxTokenizer()
    for text in texts:
        assert tok.count(text) == (general(text) if text else 0), text
    assert any(t.isascii() and t for t in texts) and any(not t.isascii() for t in texts)
    # what the ASCII path assumes: no ASCII character is one the CJK pattern takes
    assert _CJK.search("漢") and not any(_CJK.search(chr(c)) for c in range(128))
