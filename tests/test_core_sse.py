"""The SSE decoder against real vLLM captures, fed whole, byte by byte and split at every offset; and the
awkward-but-legal corners of the WHATWG rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from specproxy.core.sse import SSEDecoder, SSEEvent

DATA = Path(__file__).parent / "data"
CAPTURES = sorted(DATA.glob("*.sse"))


def decode(pieces: list[bytes]) -> list[SSEEvent]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        out.extend(d.feed(p))
    out.extend(d.flush())
    return out


def test_there_are_captures() -> None:
    assert len(CAPTURES) >= 6


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_capture_whole_bytewise_and_every_split(path: Path) -> None:
    raw = path.read_bytes()
    whole = decode([raw])
    # the file is "data: ...\n\n" blocks ending with [DONE]
    assert whole[-1].data == "[DONE]"
    assert all(e.terminated for e in whole)
    assert len(whole) == raw.count(b"\n\n")
    assert [e.data for e in whole] == [blk[len("data: ") :] for blk in raw.decode().split("\n\n") if blk]
    assert decode([raw[i : i + 1] for i in range(len(raw))]) == whole
    # split in two at every offset of the first few events
    head = raw.index(b"\n\n", raw.index(b"\n\n", raw.index(b"\n\n") + 2) + 2) + 2
    for cut in range(head + 1):
        assert decode([raw[:cut], raw[cut:]]) == whole, cut


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings_and_fields(eol: bytes) -> None:
    text = eol.join(
        [
            b": a comment",
            b"event: update",
            b"id: 7",
            b"retry: 1500",
            b"data:first",
            b"data: second",
            b"",
            b"data: third",
            b"",
            b"",
        ]
    )
    for pieces in ([text], [text[i : i + 1] for i in range(len(text))]):
        d = SSEDecoder()
        events = [e for p in pieces for e in d.feed(p)] + d.flush()
        assert events == [
            SSEEvent(data="first\nsecond", event="update", id="7", retry_ms=1500),
            SSEEvent(data="third", event="message", id="7", retry_ms=1500),
        ]
        assert d.comments == 1


def test_cr_then_lf_split_across_reads_is_one_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"\n\r") == [SSEEvent(data="a")]  # "\r\n" ended the data line, the lone "\r" the event
    assert d.feed(b"\ndata: b\n\n") == [SSEEvent(data="b")]  # this LF pairs with the previous CR: no extra line


def test_utf8_split_inside_a_character() -> None:
    raw = "data: こんにちは、世界\n\n".encode()
    for cut in range(len(raw)):
        assert decode([raw[:cut], raw[cut:]]) == [SSEEvent(data="こんにちは、世界")]


def test_bom_only_stripped_at_stream_start() -> None:
    raw = b"\xef\xbb\xbfdata: x\n\ndata: \xef\xbb\xbfy\n\n"
    assert [e.data for e in decode([raw[:2], raw[2:]])] == ["x", "\ufeffy"]


def test_huge_line_in_many_reads() -> None:
    payload = b"x" * 3_000_000
    raw = b"data: " + payload + b"\n\n"
    pieces = [raw[i : i + 65536] for i in range(0, len(raw), 65536)]
    (ev,) = decode(pieces)
    assert len(ev.data) == len(payload)


def test_field_without_colon_and_empty_data() -> None:
    assert decode([b"data\n\n"]) == [SSEEvent(data="")]
    assert decode([b"event: x\n\n"]) == []  # no data: nothing dispatched
    assert decode([b"unknown: y\ndata: z\n\n"]) == [SSEEvent(data="z")]
    assert decode([b"id: a\x00b\ndata: z\n\n"]) == [SSEEvent(data="z", id="")]


def test_truncated_stream_is_flagged_not_dispatched_as_clean() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: one\n\ndata: tw") == [SSEEvent(data="one")]
    assert d.has_partial
    assert d.flush() == [SSEEvent(data="tw", terminated=False)]


def _slow(pieces: list[bytes]) -> list[SSEEvent]:
    """The general line parser alone: fed byte by byte, no read is a whole event, so the one-event shortcut never
    applies."""
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        for i in range(len(p)):
            out.extend(d.feed(p[i : i + 1]))
    out.extend(d.flush())
    return out


@pytest.mark.parametrize(
    "pieces",
    [
        [b'data: {"a":1}\n\n', b"data: \n\n", b"data: x\n\n"],
        [b"event: delta\n", b"data: x\n\n", b"data: y\n\n"],  # a field carried from the read before
        [b"id: 7\n", b"retry: 30\n\n", b"data: x\n\n"],  # id and retry persist over events
        [b"data: a\r", b"\ndata: b\n\n", b"data: c\n\n"],  # a CR ending a read: its LF comes next
        [b"data: partial", b"\n\n", b"data: x\n\n"],  # a line carried over
        [b"data: one\n", b"data: two\n\n"],  # two data lines
        [b"data: x\n\ndata: y\n\n"],  # two events in one read
        [b"data:  two spaces\n\n", b"data:no space\n\n", b"data: caf\xc3\xa9 \xff\n\n"],
        [b"\xef\xbb\xbfdata: bom\n\n", b"data: x\n\n"],
        [b"data: x\r\n\r\n", b"data: y\n\n"],
    ],
)
def test_one_event_reads_decode_as_the_line_parser_does(pieces: list[bytes]) -> None:
    assert decode(pieces) == _slow(pieces)
    assert decode(pieces)  # each case dispatches something
