"""The span classifier (core/spans.py): each kind of text found, and the same counts however the text is split."""

from __future__ import annotations

import random

import pytest

from specproxy.core.spans import MAX_SCAN, SPAN_TYPES, SpanClassifier

MIXED = (
    "Here is how to do it, step by step.\n\n"
    "```python\n"
    "def f(x):\n"
    "    return {x: [1, 2]}\n"
    "```\n\n"
    "Call `f(3)` to get a dict; it costs $5 or $10.\n\n"
    '{"name": "get_weather", "args": {"city": "Paris", "note": "a } in a string"}}\n\n'
    "The area is $\\pi r^2$ and also\n\n"
    "$$\\int_0^1 x\\,dx = \\frac{1}{2}$$\n\n"
    "\\[ a^2 + b^2 = c^2 \\]\n\n"
    "こんにちは！今日はいい天気ですね。\n\n"
    "## Notes\n\n"
    "- one\n"
    "    - nested, not code\n\n"
    "    indented_code = True\n\n"
    "Done.\n"
)


def _counts(pieces: list[str]) -> list[int]:
    c = SpanClassifier()
    total = [0] * len(SPAN_TYPES)
    for p in pieces:
        for i, n in enumerate(c.counts(p)):
            total[i] += n
    return total


def _random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, len(text) // 3)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_counts_do_not_depend_on_how_the_text_is_split() -> None:
    whole = _counts([MIXED])
    assert _counts(list(MIXED)) == whole
    rng = random.Random(7)
    for _ in range(200):
        assert _counts(_random_split(MIXED, rng)) == whole
    assert all(whole[i] > 0 for i in range(len(SPAN_TYPES))), whole


def test_feed_agrees_with_its_counts_on_the_fast_path_too() -> None:
    """feed's fast path (a delta that cannot change the state) says what the character counts say."""
    rng = random.Random(3)
    for _ in range(50):
        pieces = _random_split(MIXED, rng)
        a, b = SpanClassifier(), SpanClassifier()
        for p in pieces:
            counts = b.counts(p)
            best = max((1, 2, 3, 4, 0), key=counts.__getitem__)
            assert SPAN_TYPES[a.feed(p)] == SPAN_TYPES[best if counts[best] else 5], (p, counts)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("The cache keeps the newest items.", "prose"),
        ("今日はいい天気ですね。", "cjk"),
        ("최근에 새로운 카페가 생겼어요.", "cjk"),
        ("    ", "whitespace"),
        ("## ---", "whitespace"),
        ("It costs $5 today.", "prose"),
    ],
)
def test_one_line_alone(line: str, kind: str) -> None:
    c = SpanClassifier()
    c.feed("Intro.\n")
    assert SPAN_TYPES[c.feed(line)] == kind


def test_token_by_token_each_region_is_found() -> None:
    parts = {
        "prose": ["Here", " is", " the", " answer", ".", "\n\n"],
        "code": ["```", "python", "\n", "x", " =", " 1", "\n", "```"],
        "json": ["\n\n", '{"', "a", '":', " [", "1", "]}"],
        "math": ["\n\n", "$$", "x", "^2", "$$"],
        "cjk": ["\n\n", "こんに", "ちは", "。"],
    }
    c = SpanClassifier()
    seen: dict[str, list[str]] = {}
    for kind, pieces in parts.items():
        seen[kind] = [SPAN_TYPES[c.feed(p)] for p in pieces]
    assert seen["prose"] == ["prose"] * 5 + ["whitespace"]
    assert seen["code"] == ["code"] * 8
    assert seen["json"] == ["whitespace"] + ["json"] * 6
    assert seen["math"] == ["whitespace"] + ["math"] * 4
    assert seen["cjk"] == ["whitespace"] + ["cjk"] * 3


def test_an_empty_delta_keeps_the_type_and_tool_calls_are_json() -> None:
    c = SpanClassifier()
    assert SPAN_TYPES[c.feed("```")] == "code"
    assert SPAN_TYPES[c.feed("")] == "code"
    assert SPAN_TYPES[c.feed('{"city": "Paris"}', tool=True)] == "json"
    assert SPAN_TYPES[c.feed("\nx = 1")] == "code"  # the tool call did not touch the text's state


def test_the_state_stays_bounded() -> None:
    c = SpanClassifier()
    c.feed("{" + "[" * 10_000)
    assert c._depth <= 64
    assert SPAN_TYPES[c.feed("]" * 10)] == "json"


def test_a_delta_past_max_scan_is_classified_by_its_beginning() -> None:
    # 1.2 MB in one event (no engine sends it, a broken one might): a fence opens, code, and a fence that closes it
    # past MAX_SCAN characters, which the walk does not reach
    huge = "```\n" + "x = 1\n" * 200_000 + "```\nThat was the code.\n"
    assert len(huge) > 100 * MAX_SCAN
    c = SpanClassifier()
    assert SPAN_TYPES[c.feed(huge)] == "code"
    assert SPAN_TYPES[c.feed("Then more words")] == "code"  # still inside the fence, as far as the walk went
    whole = SpanClassifier()
    for i in range(0, len(huge), MAX_SCAN):  # the same text in deltas the walk takes whole
        whole.feed(huge[i : i + MAX_SCAN])
    assert SPAN_TYPES[whole.feed("Then more words")] == "prose"
