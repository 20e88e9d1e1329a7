"""A flood of interim (1xx) replies before the answer: read in linear time, and refused past a cap with a 502."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from specproxy.proxy import http1
from tests.proxyutil import running_proxy
from tests.upstreams import start_raw_upstream

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_head_end_searches_from_start_and_only_a_head_s_length() -> None:
    buf = CONTINUE * 3 + ANSWER
    assert http1.head_end(buf, len(CONTINUE)) == 2 * len(CONTINUE)
    # no empty line within MAX_HEAD_BYTES of start: not found, even though one lies further on
    far = b"x" * (http1.MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
    assert http1.head_end(far) == -1


async def _through(reply: bytes, tmp_path: Path) -> tuple[int, bytes, dict[str, object]]:
    up = await start_raw_upstream(reply)
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            async with s.post(px.url + "/v1/chat/completions", data=b"{}") as r:
                status, body = r.status, await r.read()
            await px.flush()
            (rec,) = px.records()
            return status, body, rec
    finally:
        await up.close()


async def test_a_few_interim_replies_are_skipped(tmp_path: Path) -> None:
    status, body, _ = await _through(CONTINUE * http1.MAX_INTERIM + ANSWER, tmp_path)
    assert (status, body) == (200, b"ok")


async def test_a_megabyte_of_100_continue_is_a_502(tmp_path: Path) -> None:
    flood = CONTINUE * (1024 * 1024 // len(CONTINUE))
    status, body, rec = await _through(flood + ANSWER, tmp_path)
    assert status == 502
    assert b"interim" in body
    assert rec["outcome"] == "upstream_error"


def test_an_empty_transfer_encoding_beside_content_length_is_refused() -> None:
    for te in (b"", b",", b" , "):
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding:" + te + b"\r\nContent-Length: 2\r\n\r\n"
        head = http1.parse_head(raw)
        with pytest.raises(http1.InvalidResponse):
            http1.framing(head, "POST")
    with pytest.raises(http1.InvalidResponse):
        http1.framing(http1.parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding:\r\n\r\n"), "POST")


def test_a_head_with_bare_cr_line_ends_fails_at_once_and_only_http_1_x_is_read() -> None:
    with pytest.raises(http1.InvalidResponse, match="bare CR"):
        http1.head_end(b"HTTP/1.1 200 OK\rContent-Length: 2\r\r")
    assert http1.head_end(b"HTTP/1.1 200 OK\r") == -1  # its LF may come in the next read
    for version in (b"9.9", b"1.2", b"2.0"):
        with pytest.raises(http1.InvalidResponse):
            http1.parse_head(b"HTTP/" + version + b" 200 OK\r\n\r\n")
    assert http1.parse_head(b"HTTP/1.0 200 OK\r\n\r\n").version == (1, 0)


def test_garbage_trailers_and_control_characters_in_chunk_extensions_are_refused() -> None:
    for body in (b"2;a=\x00b\r\nok\r\n0\r\n\r\n", b"2;a=b\rc\r\nok\r\n0\r\n\r\n", b"2\r\nok\r\n0\r\n@@garbage\r\n\r\n"):
        with pytest.raises(http1.InvalidResponse):
            http1.Chunked().feed(body)
    assert http1.Chunked().feed(b"2;a=b\r\nok\r\n0\r\nX-T: t\r\n\r\n") == (b"ok", b"")
