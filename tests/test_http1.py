"""The relay's HTTP/1.1 response reader, on bytes: heads, framing, chunked bodies cut at every byte."""

from __future__ import annotations

import pytest

from specproxy.proxy.http1 import (
    CHUNKED,
    CLOSE,
    LENGTH,
    NONE,
    Chunked,
    InvalidResponse,
    framing,
    head_end,
    keeps_alive,
    parse_head,
)
from specproxy.proxy.upstream import request_head


def test_head_end_finds_crlf_and_bare_lf_ends() -> None:
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody") == len(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n")
    assert head_end(b"HTTP/1.1 200 OK\nA: b\n\nbody") == len(b"HTTP/1.1 200 OK\nA: b\n\n")
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n") == -1


def test_a_head_is_read_as_sent() -> None:
    h = parse_head(b"HTTP/1.1 201 Created Now\r\nContent-Type: text/event-stream\r\nX-A:  v w \r\nx-a: 2\r\n\r\n")
    assert (h.version, h.status, h.reason) == ((1, 1), 201, "Created Now")
    assert h.fields == [("Content-Type", "text/event-stream"), ("X-A", "v w"), ("x-a", "2")]
    assert h.values("x-A") == ["v w", "2"]
    assert parse_head(b"HTTP/1.1 200\r\n\r\n").reason == ""
    assert parse_head(b"HTTP/1.1 200 OK\r\nX: a\tb\r\n\r\n").values("x") == ["a\tb"]
    # bytes that are not UTF-8 survive as aiohttp keeps them (surrogates), so they go back out unchanged
    v = parse_head(b"HTTP/1.1 200 OK\r\nX: \xff\xfe\r\n\r\n").values("x")[0]
    assert v.encode("utf-8", "surrogateescape") == b"\xff\xfe"


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX : y\r\n\r\n",  # whitespace before the colon
        b"HTTP/1.1 200 OK\r\nX: y\r\n z\r\n\r\n",  # obs-fold
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\x01b\r\n\r\n",  # aiohttp's server would not write it: a 500, not a 502
        b"HTTP/1.1 200 OK\r\nX: a\x7fb\r\n\r\n",
        b"HTTP/1.1 200 O\x01K\r\n\r\n",
        b"HTTP/1.1 099 Early\r\n\r\n",  # no such class: not to be skipped as a 1xx
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n(x): y\r\n\r\n",
    ],
)
def test_heads_that_could_be_read_two_ways_are_refused(head: bytes) -> None:
    with pytest.raises(InvalidResponse):
        parse_head(head)


def _framing(head: bytes, method: str = "POST") -> tuple[str, int]:
    return framing(parse_head(head), method)


def test_framing_follows_rfc_9112_6_3() -> None:
    assert _framing(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n") == (LENGTH, 12)
    assert _framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n") == (CHUNKED, 0)
    assert _framing(b"HTTP/1.1 200 OK\r\n\r\n") == (CLOSE, 0)
    assert _framing(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", "HEAD") == (NONE, 0)
    assert _framing(b"HTTP/1.1 204 No Content\r\n\r\n") == (NONE, 0)
    assert _framing(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n") == (NONE, 0)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa3\r\n\r\n",  # an Arabic-Indic digit three
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    ],
)
def test_bodies_that_could_be_read_two_ways_are_refused(head: bytes) -> None:
    with pytest.raises(InvalidResponse):
        _framing(head)


def test_keep_alive_by_version_and_connection() -> None:
    assert keeps_alive(parse_head(b"HTTP/1.1 200 OK\r\n\r\n"))
    assert not keeps_alive(parse_head(b"HTTP/1.1 200 OK\r\nConnection: Close\r\n\r\n"))
    assert not keeps_alive(parse_head(b"HTTP/1.0 200 OK\r\n\r\n"))
    assert keeps_alive(parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n"))


BODY = b"5;name=value\r\nhello\r\n1a \r\n" + b"x" * 26 + b"\r\n0\r\nTrailer-A: 1\r\n\r\nNEXT"


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(BODY)])
def test_chunked_bodies_are_taken_apart_wherever_the_reads_cut_them(step: int) -> None:
    dec = Chunked()
    got, after = b"", None
    for i in range(0, len(BODY), step):
        piece, after = dec.feed(BODY[i : i + step])
        got += piece
        if after is not None:
            break
    assert got == b"hello" + b"x" * 26
    assert dec.done and after is not None
    # what follows the end in the read that ended it is handed back
    assert b"NEXT".startswith(after) and (after == b"NEXT" or step < len(BODY))


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nboom\r\n",
        b"-1\r\n",
        b"0x5\r\nhello\r\n",
        b"5\r\nhelloX\r\n",  # data longer than its size
        b"1" * 5000,  # a size line that never ends
        b"10000000000000000\r\n",  # 17 hex digits
    ],
)
def test_broken_chunked_framing_is_an_error_not_a_wait(body: bytes) -> None:
    with pytest.raises(InvalidResponse):
        Chunked().feed(body)


def test_an_empty_chunked_body_and_bare_lf() -> None:
    assert Chunked().feed(b"0\r\n\r\n") == (b"", b"")
    assert Chunked().feed(b"3\nabc\n0\n\n") == (b"abc", b"")


def test_request_heads_keep_the_clients_fields_and_bytes() -> None:
    head = request_head("POST", "/v1/x?a=%2F", "h:1", [(b"X-A", b"1"), (b"X-A", b"2"), (b"X-B", b"\xff")], 7)
    fields = b"X-A: 1\r\nX-A: 2\r\nX-B: \xff\r\n"
    assert head == b"POST /v1/x?a=%2F HTTP/1.1\r\nHost: h:1\r\n" + fields + b"Content-Length: 7\r\n\r\n"
    assert b"Content-Length" not in request_head("GET", "/", "h", [], 0)
    assert b"Content-Length: 0\r\n" in request_head("POST", "/", "h", [], 0)


def test_whole_chunks_in_one_read_and_a_read_that_cuts_one() -> None:
    dec = Chunked()
    assert dec.feed(b"3\r\nabc\r\n4\r\ndefg\r\n") == (b"abcdefg", None)  # whole chunks: the usual read
    assert dec.feed(b"3\r\nab") == (b"ab", None)  # one cut by the read
    assert dec.feed(b"c\r\na\r\n0123456789\r\n") == (b"c0123456789", None)
    assert dec.feed(b"0\r\n\r\n") == (b"", b"")
    with pytest.raises(InvalidResponse):
        Chunked().feed(b"3\r\nabc\r\n3\r\nabcX\r\n")  # the second is longer than its size
