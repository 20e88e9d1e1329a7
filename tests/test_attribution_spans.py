"""A request's acceptance per span type and output position (attribution/spans.py), measured and shared, and the
record's ``spans`` read back (core/record.py), older records included."""

from __future__ import annotations

import random

import orjson

from specproxy.attribution.spans import position_bucket, span_block
from specproxy.core.record import Estimates, SpecBlock, parse_line
from specproxy.core.spans import SPAN_TYPES
from specproxy.core.timeline import ResponseTimeline

CODE, PROSE = SPAN_TYPES.index("code"), SPAN_TYPES.index("prose")


def _spec(accepted: float, drafts: float, draft_tokens: float | None) -> SpecBlock:
    return SpecBlock(
        source="counters",
        accepted=accepted,
        drafts=drafts,
        draft_tokens=draft_tokens,
        k=3,
        acceptance_rate=None,
        mean_acceptance_length=None,
        per_position=[],
        tokens_per_step={},
        estimates=Estimates(server=None, chunks=None, counters=None),
    )


def test_position_buckets() -> None:
    assert [position_bucket(i) for i in (0, 31, 32, 127, 128, 511, 512, 2047, 2048, 10**6)] == [
        0,
        0,
        32,
        32,
        128,
        128,
        512,
        512,
        2048,
        2048,
    ]


def test_steps_are_measured_where_they_land() -> None:
    # prefill 1 token, then code steps of 4, 4, 1 tokens and prose steps of 1, 2; the step at index 30 spans 30-33
    chunks = [(0.1, 1), (0.2, 4), (0.3, 4), (0.4, 1), (0.5, 1), (0.6, 2)]
    chunks += [(0.7, 4)] * 5 + [(0.8, 2)]
    codes = bytes([PROSE, CODE, CODE, CODE, PROSE, PROSE] + [CODE] * 5 + [PROSE])
    block = span_block(chunks, codes, chunks_are_steps=True, spec=_spec(0, 11, 33))
    assert block is not None and block["basis"] == "steps"
    code, prose = block["types"]["code"], block["types"]["prose"]
    assert (code["steps"], code["tokens"], code["accepted"], code["draft_tokens"]) == (8, 29, 21, 24)
    assert (prose["steps"], prose["tokens"], prose["accepted"], prose["draft_tokens"]) == (3, 5, 2, 9)
    # indexes of each step's first token: 1, 5, 9, 10, 11, 13, 17, 21, 25, 29 in bucket 0; 33 in bucket 32
    assert block["positions"]["0"]["steps"] == 10 and block["positions"]["32"]["tokens"] == 2
    assert list(block["positions"]) == ["0", "32"]


def test_without_steps_the_request_figure_is_shared_by_tokens() -> None:
    chunks = [(0.1, 1), (0.2, 6), (0.3, 2)]
    block = span_block(chunks, bytes([PROSE, CODE, PROSE]), chunks_are_steps=False, spec=_spec(4, 4, 12))
    assert block is not None and block["basis"] == "shared"
    assert block["types"]["code"] == {"steps": 3, "tokens": 6, "accepted": 3, "draft_tokens": 9}
    assert block["types"]["prose"] == {"steps": 1, "tokens": 2, "accepted": 1, "draft_tokens": 3}
    assert span_block(chunks, b"", chunks_are_steps=False, spec=None) is None  # nothing to share
    assert span_block([(0.1, 1)], b"\0", chunks_are_steps=True, spec=None) is None  # no decode step


def test_the_timeline_keeps_a_span_code_per_chunk() -> None:
    tl = ResponseTimeline(0, stream=True)
    for text in ("Sure:\n", "```", "py\n", "x = 1", "\n```"):
        ev = {"choices": [{"index": 0, "delta": {"content": text}}], "usage": None}
        tl.feed(1, b"data: " + orjson.dumps(ev) + b"\n\n")
    tool = {"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"arguments": '{"a": 1}'}}]}}]}
    tl.feed(2, b"data: " + orjson.dumps(tool) + b"\n\n")
    res = tl.result(3)
    assert len(res.span_codes) == len(res.chunks) == 6
    assert [SPAN_TYPES[c] for c in res.span_codes] == ["prose", "code", "code", "code", "code", "json"]


def test_older_records_read_without_spans_and_odd_values_read_as_missing() -> None:
    rec = parse_line(orjson.dumps({"schema_version": 7, "request_id": "a"}))
    assert rec is not None and rec["spans"] is None
    raw = {
        "schema_version": 8,
        "request_id": "b",
        "spans": {
            "basis": "steps",
            "types": {"code": {"steps": 2, "tokens": 5, "accepted": 3, "draft_tokens": None}, "x": "junk"},
            "positions": [],
        },
    }
    rec = parse_line(orjson.dumps(raw))
    assert rec is not None and rec["spans"] is not None
    assert rec["spans"]["types"] == {"code": {"steps": 2, "tokens": 5, "accepted": 3, "draft_tokens": None}}
    assert rec["spans"]["positions"] == {}


def test_where_only_some_steps_draft_the_draft_tokens_add_up_to_the_requests() -> None:
    # ngram: a prefill token, then code steps of 3, 1, 1, 1 tokens and prose steps of 1, 4, 1, 1 tokens. The request
    # drafted on 4 of its 8 steps (k = 3: 12 draft tokens): the two multi-token steps surely, 2 more among its 6
    # one-token steps (a third of each)
    chunks = [(0.0, 1)] + [(0.01 * i, n) for i, n in enumerate([3, 1, 1, 1, 1, 4, 1, 1], start=1)]
    codes = bytes([PROSE, CODE, CODE, CODE, CODE, PROSE, PROSE, PROSE, PROSE])
    block = span_block(chunks, codes, chunks_are_steps=True, spec=_spec(accepted=5, drafts=4, draft_tokens=12))
    assert block is not None and block["basis"] == "steps"
    code, prose = block["types"]["code"], block["types"]["prose"]
    assert (code["steps"], code["accepted"], prose["steps"], prose["accepted"]) == (4, 2, 4, 3)
    assert code["draft_tokens"] == prose["draft_tokens"] == 6  # 3 x (1 + 3 x 1/3) each
    assert code["draft_tokens"] + prose["draft_tokens"] == 12  # all of the request's, no more
    # every step drafting (MTP): k per step
    every = span_block(chunks, codes, chunks_are_steps=True, spec=_spec(accepted=5, drafts=8, draft_tokens=24))
    assert every is not None and every["types"]["code"]["draft_tokens"] == every["types"]["prose"]["draft_tokens"] == 12


def _by_chunk(chunks: list[tuple[float, int]], codes: bytes) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Steps, tokens and steps of more than one token per span type and per position bucket, chunk by chunk."""
    types: dict[str, list[int]] = {}
    positions: dict[str, list[int]] = {}
    index = None
    for i, (_, n) in enumerate(chunks):
        if n <= 0:
            continue
        if index is None:
            index = n
            continue
        code = codes[i] if i < len(codes) else 0
        for table, key in ((types, SPAN_TYPES[code]), (positions, str(position_bucket(index)))):
            cell = table.setdefault(key, [0, 0, 0])
            cell[0] += 1
            cell[1] += n
            cell[2] += n > 1
        index += n
    return types, positions


def test_the_block_counts_what_each_chunk_brought_where_it_landed() -> None:
    """Random streams of every length (past the last position bucket), with chunks of no tokens and codes missing
    at the end: each span type and bucket holds what a chunk-by-chunk count gives, in the order the types came."""
    rng = random.Random(11)
    for _ in range(300):
        chunks = [(i * 0.01, rng.choice([0, 1, 1, 1, 2, 4, 7])) for i in range(rng.randint(0, 700))]
        codes = bytes(rng.randrange(len(SPAN_TYPES)) for _ in range(max(0, len(chunks) - rng.randint(0, 3))))
        types, positions = _by_chunk(chunks, codes)
        block = span_block(
            chunks, codes, chunks_are_steps=True, spec=_spec(accepted=0, drafts=10**6, draft_tokens=None)
        )
        if not types:
            assert block is None
            continue
        assert block is not None
        assert list(block["types"]) == list(types)
        assert list(block["positions"]) == sorted(positions, key=int)
        for got, want in ((block["types"], types), (block["positions"], positions)):
            for key, (steps, tokens, _) in want.items():
                assert (got[key]["steps"], got[key]["tokens"], got[key]["accepted"]) == (steps, tokens, tokens - steps)
