"""Bounded work on request bodies: small ones parsed and captured, large ones relayed untouched and only scanned."""

from __future__ import annotations

import io
from pathlib import Path

import aiohttp
import orjson

from specproxy.core.request_body import SCAN_BYTES, Body, inspect_body
from tests.proxyutil import running_proxy
from tests.upstreams import Script, capture_pieces, start_upstream


def test_a_small_json_body_is_parsed() -> None:
    f = inspect_body(b'{"model": "qwen", "stream": true, "messages": []}', limit=1024)
    assert (f.model, f.stream, f.over_limit, f.parsed["messages"]) == ("qwen", True, False, [])
    assert f.text(b"{}") is None


def test_a_body_that_is_not_json_is_text() -> None:
    body = b"api_key=x&model=m"
    f = inspect_body(body, limit=1024)
    assert f.parsed is None and f.model is None and not f.stream and f.text(body) == body.decode()


def test_a_large_body_is_scanned_not_parsed() -> None:
    body = b'{"model": "qw\\"en", "stream": true, "x": [' + b"0," * 500_000 + b"0]}"
    f = inspect_body(body, limit=64 * 1024)
    assert f.over_limit and f.parsed is None and f.size == len(body)
    assert (f.model, f.stream) == ('qw"en', True)
    assert f.text(body) is None  # never captured
    late = b'{"x": "' + b"y" * SCAN_BYTES + b'", "model": "late"}'
    assert inspect_body(late, limit=1024).model is None  # only the head is looked at


async def test_a_large_body_is_relayed_byte_for_byte_and_recorded_without_it(tmp_path: Path) -> None:
    body = b'{"model": "m", "stream": true, "x": [' + b"0," * 2_000_000 + b"0]}"  # 4 MB of tiny elements
    up = await start_upstream(lambda _r, _b: Script(capture_pieces("chat-stream-ngram-k3-code.sse")))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False, rec_capture_max_bytes=64 * 1024) as px:
            async with (
                aiohttp.ClientSession() as s,
                s.post(px.url + "/v1/chat/completions", data=io.BytesIO(body)) as r,
            ):
                assert r.status == 200
                await r.read()
            await px.flush()
            (rec,) = px.records()
    finally:
        await up.server.close()
    assert up.seen[0]["body"] == body  # relayed untouched
    assert "body_too_large" in rec["flags"] and rec["model"] == "m" and rec["stream"] is True
    assert rec["request"] == f"[not captured: body_too_large, {len(body)} bytes over the 65536-byte limit]"
    assert rec["completion_tokens"] and rec["outcome"] == "ok"  # the response is recorded as ever
    assert len(orjson.dumps(rec)) < 64 * 1024


def test_capture_walks_a_bounded_number_of_containers() -> None:
    from specproxy.core.redact import MAX_CONTAINERS, TOO_MANY, capture_body

    many = {"model": "m", "x": [[] for _ in range(MAX_CONTAINERS + 1)]}
    assert capture_body(many) == TOO_MANY
    fine = {"model": "m", "api_key": "k", "x": [[i] for i in range(MAX_CONTAINERS // 2)], "n": list(range(100_000))}
    got = capture_body(fine)
    assert got["api_key"] == "[redacted]" and got["x"] == fine["x"] and got["n"] == fine["n"]


def test_body_keeps_its_pieces_and_joins_only_what_is_asked() -> None:
    pieces = [b"abc", b"", b"defg", b"h"]
    body = Body(pieces)
    assert len(body) == body.size == 8 and body.pieces() == [b"abc", b"defg", b"h"]  # empty reads are not kept
    assert body.whole() == b"abcdefgh"
    assert [body.head(n) for n in (0, 2, 3, 5, 8, 100)] == [b"", b"ab", b"abc", b"abcde", b"abcdefgh", b"abcdefgh"]
    one = Body([b"only"])
    assert one.whole() is one.pieces()[0]  # one piece: no copy
    assert Body().whole() == b"" and Body().head(10) == b""
