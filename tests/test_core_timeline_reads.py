"""A response's timeline reads the same whatever the reads it came in: one event a read (where whole ``data:`` events
take the plain lane), several a read, or cut anywhere (where the SSE decoder takes them), on the captures and on
random streams of every shape, odd framing included."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import orjson

from specproxy.core.timeline import ResponseTimeline, TimelineResult
from specproxy.core.tokens import ApproxTokenizer
from tests.test_core_plain_chunk import _random_chunk

DATA = Path(__file__).parent / "data"
T0 = 1_000_000_000
T = T0 + 5_000_000  # every read at one time: the figures do not depend on where the reads were cut

# framing the plain lane leaves to the decoder, and data it leaves to the whole reading
ODD_EVENTS = [
    b": keep-alive\n\n",
    b"data: [DONE]\n\n",
    b"data:  [DONE] \n\n",
    b"data: not json\n\n",
    b"data: \n\n",
    b'data:{"choices":[{"index":0,"delta":{"content":"no space"}}]}\n\n',
    b'event: error\ndata: {"error":{"message":"boom"}}\n\n',
    b'data: {"choices":[{"index":0,\n\ndata: "delta":{}}]}\n\n',
    b'data: {"choices":\ndata: [{"index":0,"delta":{"content":"two lines"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"crlf"}}]}\r\n\r\n',
    b'id: 7\ndata: {"choices":[{"index":0,"delta":{"content":"with id"}}]}\n\n',
    b"data: \xff\xfe\n\n",
    b"data: [1, 2]\n\n",
    b"\n",
]


def _read(reads: list[bytes], keep_text: bool) -> TimelineResult:
    tl = ResponseTimeline(T0, stream=True, tokenizer=ApproxTokenizer(), keep_text=keep_text)
    for data in reads:
        tl.feed(T, data)
    result = tl.result(T + 1)
    # how the bytes were read, which is what differs
    return dataclasses.replace(result, reads=0, multi_event_reads=0, buffer_sized_reads=0, flags=[
        f for f in result.flags if f != "multi_event_reads"
    ])  # fmt: skip


def _events(stream: bytes) -> list[bytes]:
    parts = stream.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _ways(events: list[bytes], rng: random.Random) -> dict[str, list[bytes]]:
    whole = b"".join(events)
    groups: list[bytes] = []
    i = 0
    while i < len(events):
        n = rng.randint(1, 5)
        groups.append(b"".join(events[i : i + n]))
        i += n
    cuts = sorted(rng.sample(range(1, len(whole)), min(len(whole) - 1, len(whole) // 7)))
    pieces = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    return {"one a read": events, "several a read": groups, "cut anywhere": pieces, "byte by byte": [
        whole[i : i + 1] for i in range(len(whole))
    ]}  # fmt: skip


def _same_every_way(events: list[bytes], rng: random.Random, keep_text: bool = True) -> TimelineResult:
    ways = _ways(events, rng)
    want = _read(ways.pop("byte by byte"), keep_text)
    for name, reads in ways.items():
        assert _read(reads, keep_text) == want, name
    return want


def test_the_captures_read_the_same_in_any_reads() -> None:
    rng = random.Random(7)
    for path in sorted(DATA.glob("*.sse")):
        result = _same_every_way(_events(path.read_bytes()), rng)
        assert result.completion_tokens and result.chunks, path  # the lane read tokens, not nothing


def test_random_streams_with_odd_framing_read_the_same_in_any_reads() -> None:
    rng = random.Random(20261207)
    for _ in range(150):
        events = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n']
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.15:
                events.append(rng.choice(ODD_EVENTS))
            else:
                events.append(b"data: " + orjson.dumps(_random_chunk(rng)) + b"\n\n")
        _same_every_way(events, rng, keep_text=rng.random() < 0.5)


def test_a_stream_that_starts_with_a_byte_order_mark_reads_the_same_in_any_reads() -> None:
    rng = random.Random(3)
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}],"usage":{"completion_tokens":%d}}\n\n'
    events = [b"\xef\xbb\xbf" + chunk % 1] + [chunk % n for n in range(2, 30)]
    result = _same_every_way(events, rng)
    assert result.completion_tokens == 29


def test_the_decoder_is_left_between_events_by_whole_reads() -> None:
    """Reads the plain lane took leave the decoder as it was: a cut event after them is still read whole."""
    tl = ResponseTimeline(T0, stream=True, tokenizer=ApproxTokenizer(), keep_text=True)
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
    tl.feed(T, chunk % b"a")
    tl.feed(T, chunk % b"b" + chunk % b"c")
    last = chunk % b"d"
    tl.feed(T, last[:9])
    tl.feed(T, last[9:])
    result = tl.result(T + 1)
    assert result.response_text == "abcd"
    assert len(result.chunks) == 4
