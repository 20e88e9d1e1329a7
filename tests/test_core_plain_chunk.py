"""The common streamed chunk's quick reading gives what the whole reading gives, on every shape it takes, and leaves
every other shape to the whole reading."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from specproxy.core.openai_stream import _plain_chunk, _whole_chunk, interpret_json
from specproxy.core.sse import SSEDecoder

DATA = Path(__file__).parent / "data"

# values a field may hold: the usual, and the odd ones a careless or hostile server sends
ODD = [None, True, False, 0, 1, -1, 2.5, "", "x", [], [1, 2], {}, {"a": 1}]
TEXTS = [None, "", "tok", "トークン", 3, ["a"]]
COUNTS = [None, 0, 7, -3, True, 1.5, "4"]


def _maybe(rng: random.Random, d: dict[str, Any], key: str, values: list[Any], p: float = 0.6) -> None:
    if rng.random() < p:
        d[key] = rng.choice(values)


def _random_chunk(rng: random.Random) -> Any:
    if rng.random() < 0.03:
        return rng.choice([[], "x", 1, None, [{"choices": []}]])
    delta: dict[str, Any] = {}
    calls = [None, [], [{"function": {"arguments": "{}"}}]]
    for key, values in (("content", TEXTS), ("role", ["assistant", None]), ("reasoning_content", TEXTS),
                        ("reasoning", TEXTS), ("tool_calls", calls)):  # fmt: skip
        _maybe(rng, delta, key, values, 0.7 if key == "content" else 0.15)
    choice: dict[str, Any] = {}
    _maybe(rng, choice, "index", [0, 0, 0, 1, 3, None, True, "0"], 0.9)
    _maybe(rng, choice, "delta", [delta, delta, delta, None, "x"], 0.8)
    _maybe(rng, choice, "text", TEXTS, 0.2)
    _maybe(rng, choice, "message", [{"content": "m"}, None], 0.05)
    for key in ("logprobs", "finish_reason", "stop_reason", "token_ids"):
        _maybe(rng, choice, key, [None, None, "stop", "length", 1, [1, 2]], 0.5)
    _maybe(rng, choice, "other", ODD, 0.05)
    usage: dict[str, Any] = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        _maybe(rng, usage, key, COUNTS, 0.8)
    _maybe(rng, usage, "completion_tokens_details", [None, {}], 0.3)
    _maybe(rng, usage, "prompt_tokens_details", [None, {"cached_tokens": 3}, {"cached_tokens": -1}], 0.1)
    obj: dict[str, Any] = {}
    _maybe(rng, obj, "id", ["chatcmpl-1", None, 5], 0.9)
    _maybe(rng, obj, "object", ["chat.completion.chunk", "text_completion", "error", None], 0.9)
    _maybe(rng, obj, "created", [1, None], 0.8)
    _maybe(rng, obj, "model", ["m", None, 1], 0.8)
    n = rng.choice([1, 1, 1, 1, 0, 2])
    _maybe(rng, obj, "choices", [[choice] * n, [choice] * n, None, "x", [1]], 0.95)
    _maybe(rng, obj, "usage", [usage, usage, None, "x"], 0.5)
    for key, values in (("service_tier", [None]), ("prompt_token_ids", [None, [1]]), ("prompt_text", [None]),
                        ("system_fingerprint", ["fp_ollama", "vllm-0.32"]), ("kv_transfer_params", [None]),
                        ("metrics", [{"speculative_decoding": {"num_draft_tokens": 3}}, {}]), ("error", ["e"]),
                        ("timings", [{"draft_n": 3}]), ("meta_info", [{}]), ("extra", ODD),
                        ("sglext", [{"spec_verify_ct": 2, "completion_tokens": 5}]), ("provider", ["gw"]),
                        ("content", ["x"]), ("stop", [True])):  # fmt: skip
        _maybe(rng, obj, key, values, 0.1)
    return obj


def test_the_quick_reading_is_the_whole_reading_on_random_shapes() -> None:
    rng = random.Random(20261203)
    taken = 0
    for _ in range(30000):
        obj = _random_chunk(rng)
        whole = _whole_chunk(obj)
        assert interpret_json(obj) == whole, obj
        if type(obj) is dict and (plain := _plain_chunk(obj)) is not None:
            taken += 1
            assert plain == whole, obj
    assert taken > 400  # the quick reading was exercised, not skipped for every shape


def test_the_quick_reading_takes_the_captures_delta_chunks() -> None:
    seen = plain = 0
    for path in sorted(DATA.glob("*.sse")):
        for ev in SSEDecoder().feed(path.read_bytes()):
            if ev.data.strip() == "[DONE]":
                continue
            obj = orjson.loads(ev.data)
            seen += 1
            quick = _plain_chunk(obj)
            if quick is not None:
                plain += 1
                assert quick == _whole_chunk(obj)
            elif "metrics" not in obj:  # the last chunk with the engine's own figures takes the whole reading
                assert obj["choices"] == [] or obj["choices"][0].get("finish_reason") is not None, (path, obj)
    assert plain > 0.9 * seen
