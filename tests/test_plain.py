"""What the fast lane takes and what it leaves to aiohttp (:func:`specproxy.proxy.plain.parse_request`), and the
answer heads it writes (:func:`specproxy.proxy.plain.answer_head`), framed as aiohttp frames them. Anything a strict
reader would refuse, or could read two ways, must be handed over whole, never read by the fast lane."""

from __future__ import annotations

import pytest

from specproxy.proxy.plain import FAST_BODY_MAX, MAX_HEAD, NEED_MORE, PlainRequest, answer_head, parse_request

BODY = b'{"model":"m","stream":true}'
PLAIN = (
    b"POST /v1/chat/completions?key=1 HTTP/1.1\r\nHost: proxy:8080\r\nContent-Type: application/json\r\n"
    b"X-Specproxy-Workload:  code \r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)


def _taken(data: bytes, max_body: int = 1 << 30) -> PlainRequest:
    parsed = parse_request(data, max_body)
    assert isinstance(parsed, PlainRequest), parsed
    return parsed


def test_a_plain_post_is_taken_with_its_fields_as_sent() -> None:
    req = _taken(PLAIN + b"POST /next")  # a pipelined request after it does not change this one
    assert req.method == "POST" and req.target == "/v1/chat/completions?key=1" and req.path == "/v1/chat/completions"
    assert req.fields == [
        (b"Host", b"proxy:8080"),
        (b"Content-Type", b"application/json"),
        (b"X-Specproxy-Workload", b"code"),  # the value without the whitespace around it, as llhttp gives it
        (b"Content-Length", b"%d" % len(BODY)),
    ]
    assert req.length == len(BODY) and req.size == len(PLAIN) and PLAIN[req.head_len :] == BODY
    assert req.get("x-specproxy-workload") == "code" and req.get("authorization") is None
    assert not req.close and req.connection == []


def test_a_get_without_a_body_is_taken() -> None:
    req = _taken(b"GET /specproxy/status?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert (req.method, req.path, req.length) == ("GET", "/specproxy/status", 0)
    assert _taken(b"GET / HTTP/1.1\r\n\r\n").method == "GET"


def test_connection_close_and_its_tokens() -> None:
    req = _taken(b"POST / HTTP/1.1\r\nConnection: X-Drop, close\r\nX-Drop: 1\r\n\r\n")
    assert req.close and req.connection == ["x-drop", "close"] and req.length == 0


@pytest.mark.parametrize("cut", [1, 10, 40, len(PLAIN) - len(BODY) - 3, len(PLAIN) - len(BODY) - 1])
def test_an_incomplete_head_waits_for_more(cut: int) -> None:
    assert parse_request(PLAIN[:cut], 1 << 30) == NEED_MORE  # also cut between a CR and its LF


@pytest.mark.parametrize(
    "data",
    [
        b"GET /v1/models HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",  # a GET with a body
        b"HEAD / HTTP/1.1\r\n\r\n",
        b"PUT / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        b"post / HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        b"POST http://x/v1/completions HTTP/1.1\r\n\r\n",  # absolute form
        b"POST * HTTP/1.1\r\n\r\n",
        b"POST /caf\xc3\xa9 HTTP/1.1\r\n\r\n",  # not ASCII
        b"POST /a b HTTP/1.1\r\n\r\n",
        b"POST  / HTTP/1.1\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        b"POST / HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n{}",
        b"POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length : 2\r\n\r\n{}",  # whitespace before the colon
        b"POST / HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",  # obs-fold
        b"POST / HTTP/1.1\r\nNo colon here\r\n\r\n",
        b"POST / HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",
        b"POST / HTTP/1.1\r\nX-A: a\x1bb\r\n\r\n",
        b"POST / HTTP/1.1\nHost: x\n\n",  # bare LF
        b"POST / HTTP/1.1\r\nHost: x\rX-Smuggled: 1\r\n\r\n",  # bare CR
        b"POST / HTTP/1.1\r\nHost: x\n\r\n",
        b"POST / HTTP/1.1\r\n: empty name\r\n\r\n",
    ],
)
def test_what_aiohttp_reads(data: bytes) -> None:
    assert parse_request(data, 1 << 30) is None


@pytest.mark.parametrize(
    "data",
    [
        PLAIN,
        b"POST / HTTP/1.1\r\nHost: x\nX: 1\r\n\r\n",
        b"POST / HTTP/1.1\r\nX: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
    ],
)
@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_a_head_read_in_pieces_is_read_as_whole(data: bytes, step: int) -> None:
    """As the fast lane feeds it: each call told how much an earlier one saw; the answer is the whole head's."""
    whole = parse_request(data, 1 << 30)
    seen, answer = 0, None
    for n in range(step, len(data) + step, step):
        answer = parse_request(data[:n], 1 << 30, seen)
        if answer != NEED_MORE:
            break
        seen = n
    assert type(answer) is type(whole)
    if isinstance(whole, PlainRequest):
        assert isinstance(answer, PlainRequest) and (answer.fields, answer.size) == (whole.fields, whole.size)


def test_a_bare_lf_is_handed_over_before_the_head_ends() -> None:
    assert parse_request(b"POST / HTTP/1.1\nHost: x\n", 1 << 30) is None  # it would never end in CRLF CRLF


def test_sizes_beyond_the_fast_lane() -> None:
    big = b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
    assert isinstance(parse_request(big % FAST_BODY_MAX, 1 << 30), PlainRequest)
    assert parse_request(big % (FAST_BODY_MAX + 1), 1 << 30) is None  # read in pieces by aiohttp
    assert parse_request(big % 100, 99) is None  # over --max-body: aiohttp's 413
    long_field = b"POST / HTTP/1.1\r\nX-Long: " + b"a" * MAX_HEAD + b"\r\n\r\n"
    assert parse_request(long_field, 1 << 30) is None
    assert parse_request(long_field[: MAX_HEAD + 10], 1 << 30) is None  # no end in sight within the limit
    many = b"POST / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n"
    assert parse_request(many, 1 << 30) is None


def _fields(head: bytes) -> list[tuple[str, str]]:
    lines = head.decode().split("\r\n")
    assert lines[-2:] == ["", ""]
    return [tuple(line.split(": ", 1)) for line in lines[1:-2]]  # type: ignore[misc]


def test_a_streamed_answer_is_chunked_with_what_aiohttp_adds() -> None:
    head = answer_head(200, "", [("Content-Type", "text/event-stream"), ("X-A", "1")], None, close=False, chunked=True)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    names = [k for k, _ in _fields(head)]
    assert names == ["Content-Type", "X-A", "Transfer-Encoding", "Date", "Server"]
    assert dict(_fields(head))["Transfer-Encoding"] == "chunked"


def test_fields_given_are_kept_and_not_added_twice() -> None:
    given = [("date", "Tue, 01 Dec 2026 00:00:00 GMT"), ("server", "vllm"), ("content-type", "application/json")]
    head = answer_head(404, "Gone Fishing", given, 17, close=True)
    assert head.startswith(b"HTTP/1.1 404 Gone Fishing\r\n")
    assert _fields(head) == [*given, ("Content-Length", "17"), ("Connection", "close")]


def test_answers_without_a_body() -> None:
    no_content = _fields(answer_head(204, "", [], None, close=False))
    assert [k for k, _ in no_content] == ["Date", "Server"]  # no framing, no Content-Type
    not_modified = _fields(answer_head(304, "", [], 10, close=False))
    assert [k for k, _ in not_modified] == ["Content-Length", "Date", "Server"]  # 304 keeps its length (as aiohttp)
    empty = _fields(answer_head(200, "", [], 0, close=False))
    assert [k for k, _ in empty] == ["Content-Length", "Date", "Server"]  # no body: no default Content-Type
    octets = _fields(answer_head(200, "", [], 3, close=False))
    assert ("Content-Type", "application/octet-stream") in octets
