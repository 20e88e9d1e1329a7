"""The bookkeeping events' wire format: frames survive any split of the byte stream, and a broken stream is refused."""

from __future__ import annotations

import random

import pytest

from specproxy.proxy.events import (
    BEGIN,
    CHUNK,
    FINISH,
    FrameError,
    FrameReader,
    begin_payload,
    frame,
    split_begin,
)


def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut() -> None:
    body = b'{"model": "m", "messages": []}'
    sent = [
        (BEGIN, 1, 10, begin_payload({"rid": "a", "size": len(body)}, body)),
        *((CHUNK, 1, 11 + i, bytes([i]) * (i * 37 % 500)) for i in range(50)),  # empty payloads among them
        (FINISH, 1, 99, b'["ok",null,0,0,0,false]'),
    ]
    stream = b"".join(frame(*f) for f in sent)
    rng = random.Random(3)
    for _ in range(20):
        reader = FrameReader()
        got = []
        pos = 0
        while pos < len(stream):
            step = rng.choice([1, 2, 7, 16, 17, 18, 300, 5000])
            got += reader.feed(stream[pos : pos + step])
            pos += step
        assert got == sent
        assert reader.pending == 0
    doc, b = split_begin(sent[0][3])
    assert doc == {"rid": "a", "size": len(body)} and b == body


def test_a_stream_that_is_not_frames_is_refused() -> None:
    with pytest.raises(FrameError):
        FrameReader().feed(b"\x00" * 64)
