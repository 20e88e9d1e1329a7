"""The front door: what the proxy takes from a client before it relays anything. Slow clients are closed (the request
head's and the body's timeouts) while other streams flow; a declared body over --max-body gets 413 at once; the
request target reaches the upstream byte for byte and the record keeps it; error texts are one printable line
without raw bytes, query strings or the upstream's address, in records and in the bodies sent to clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path

import aiohttp
import orjson
import pytest

from specproxy.core.errors import one_line, shown_url
from specproxy.core.record import read_records
from tests.proxyutil import raw_exchange, running_proxy, started_proxy
from tests.upstreams import Script, capture_pieces, start_raw_upstream, start_upstream

SHORT = 0.3  # the client timeouts these tests configure
# The slow-client test's head and body timeouts: the clients that must be served send their heads at once, but on a
# busy host "at once" can take a good part of 0.3 s; the stream alongside lasts several times this.
CLIENT_TIMEOUT_S = 1.0


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _read_until_closed(reader: asyncio.StreamReader, within_s: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed it. A server that closes a
    connection whose last bytes it has not read resets it (TCP sends RST for unread data): for a client still
    sending, as one trickling its head is, that is how the close arrives when the host is slow to read; it is a close
    all the same, and what came before it is kept."""
    data = b""
    async with asyncio.timeout(within_s):
        with contextlib.suppress(ConnectionResetError):
            while piece := await reader.read(65536):
                data += piece
    return data, asyncio.get_running_loop().time()


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


async def test_slow_clients_are_closed_while_a_stream_flows(tmp_path: Path) -> None:
    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")[:30]
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=0.15))  # a stream of 4.5 s or more
    timeouts = {"client_header_timeout_s": CLIENT_TIMEOUT_S, "client_body_timeout_s": CLIENT_TIMEOUT_S}
    writers: list[asyncio.StreamWriter] = []  # closed however the test ends: a socket left to the GC warns later

    async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await _connect(url)
        writers.append(writer)
        return reader, writer

    try:
        async with (
            started_proxy(up.url, tmp_path, **timeouts) as px,
            aiohttp.ClientSession() as s,
        ):
            loop = asyncio.get_running_loop()

            async def stream() -> tuple[bytes, float]:
                async with s.post(px.url + "/v1/chat/completions", data=b'{"stream": true}') as r:
                    body = await r.read()
                return body, loop.time()

            streaming = asyncio.create_task(stream())
            silent, _ = await connect(px.url)  # connects and sends nothing
            trickle_r, trickle_w = await connect(px.url)  # a head, one byte at a time: sending moves no deadline

            async def trickle() -> None:
                for byte in b"GET /v1/models HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                    trickle_w.write(bytes([byte]))
                    await asyncio.sleep(0.02)
                    if trickle_w.is_closing() or trickle_r.at_eof():
                        return

            trickling = asyncio.create_task(trickle())
            body_r, body_w = await connect(px.url)  # announces 100 bytes of body, sends 10
            body_w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"{" * 10)
            kept_r, kept_w = await connect(px.url)  # kept alive after a response, then half of the next head
            kept_w.write(b"GET /specproxy/status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _read_response(kept_r)).startswith(b"HTTP/1.1 200")
            kept_w.write(b"GET /specproxy/status HTTP/1.1\r\nHo")
            idle_r, idle_w = await connect(px.url)  # kept alive after a response and quiet: not a slow head
            idle_w.write(b"GET /specproxy/status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _read_response(idle_r)).startswith(b"HTTP/1.1 200")

            closed = await asyncio.gather(*(_read_until_closed(r) for r in (silent, trickle_r, body_r, kept_r)))
            assert not streaming.done()
            body, stream_end = await streaming
            await trickling
            assert body == b"".join(pieces)  # the stream alongside was relayed whole
            assert [data for data, _ in closed[:2]] == [b"", b""]  # no request: closed without an answer
            assert closed[2][0].startswith(b"HTTP/1.1 408") and b"Connection: close" in closed[2][0]
            assert closed[3][0] == b""
            assert all(when < stream_end for _, when in closed)  # closed while the stream still flowed
            assert not idle_r.at_eof()
            idle_w.write(b"GET /specproxy/status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await _read_response(idle_r)).startswith(b"HTTP/1.1 200")
        assert [r["outcome"] for r in read_records(tmp_path / "records.jsonl")] == ["ok"]  # refused ones: no record
    finally:
        for w in writers:
            w.close()
        await up.server.close()


async def test_declared_body_over_max_body_gets_413_at_once(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    try:
        async with started_proxy(up.url, tmp_path, max_body_bytes=1024 * 1024) as px:
            for expect in (b"", b"Expect: 100-continue\r\n"):
                reader, writer = await _connect(px.url)
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + expect + b"Content-Length: 999999999999\r\n\r\n"
                )
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)  # no body sent: no waiting for one
                writer.close()
                assert head.startswith(b"HTTP/1.1 413"), head  # and no "100 Continue" before it
                assert b"Connection: close" in head
            ok = await raw_exchange(
                px.url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
            )
            assert ok.startswith(b"HTTP/1.1 200")
            status = px.recorder.status()
        assert up.lines == [b"POST /v1/completions HTTP/1.1"]  # the refused ones never reached the upstream
        assert status["refused"] == {"413": 2}  # unrecorded, but counted
        assert px.recorder.metrics.registry.get_sample_value("specproxy_requests_refused_total", {"status": "413"}) == 2
    finally:
        await up.close()


ODD_TARGETS = [
    b"/v1/models/%7e",  # not ~
    b"/./v1/x/../models",  # dot segments kept
    b"/v1/models?",  # an empty query kept
    b"/v1/%",  # a lone % stays a lone %
    b"/v1/models?q=%&r=%7E",
    b"/specproxy/../v1/models",  # forwarded as sent, recorded as sent
    b"/v1/../specproxy/status",  # not the proxy's own endpoint: that is /specproxy/status exactly
    b"/specproxy/%73tatus",
    b"/v1//models",
    b"/v1/a%2Fb",
    b"/v1/a%0Ab",
    b"/v1/models#frag",
]


async def test_odd_request_targets_reach_the_upstream_byte_for_byte(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    try:
        async with started_proxy(up.url + "/base/", tmp_path) as px:
            for target in ODD_TARGETS:
                got = await raw_exchange(
                    px.url,
                    b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok"), (target, got)
            # absolute form (RFC 9112 3.2.2): the scheme and authority go, the rest is kept as sent
            await raw_exchange(
                px.url,
                b"POST http://example.test/v1/%7e?x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n",
            )
            own = await raw_exchange(px.url, b"GET /specproxy/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert b'"in_flight"' in own  # the own endpoint, at its exact path, is answered here
        assert up.lines == [b"POST /base" + t + b" HTTP/1.1" for t in ODD_TARGETS] + [b"POST /base/v1/%7e?x HTTP/1.1"]
        recs = list(read_records(tmp_path / "records.jsonl"))
        expected = [t.split(b"?")[0].split(b"#")[0].decode() for t in ODD_TARGETS] + ["/v1/%7e"]
        assert sorted(r["path"] for r in recs) == sorted(expected)  # what was forwarded, without the query
    finally:
        await up.close()


def _check_error_text(text: str, *, secret: str, upstream: str) -> None:
    host, port = upstream.rsplit("/", 1)[-1].rsplit(":", 1)
    assert text and len(text) <= 200 and text.isprintable(), text
    assert secret not in text and "api_key" not in text and "?" not in text, text
    assert host not in text and port not in text, text
    assert "\\x" not in text and "b'" not in text, text  # no raw bytes, not even escaped


async def test_error_texts_are_one_line_without_query_bytes_or_upstream(tmp_path: Path) -> None:
    secret = "sk-front-door-secret"
    garbage = await start_raw_upstream(b"NOT HTTP \x00\x01\xff\r\nsecond line\r\n\r\n")
    broken = await start_upstream(
        lambda req, body: Script(capture_pieces("chat-stream-ngram-k3-code.sse"), reset_after=3)
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nobody listens there
    sock.close()
    try:
        for upstream, status in ((garbage.url, 502), (down, 502), (broken.url, 200)):
            async with running_proxy(upstream, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
                async with s.post(f"{px.url}/v1/chat/completions?api_key={secret}", data=b"{}") as r:
                    assert r.status == status
                    if status == 502:
                        _check_error_text((await r.json())["error"]["message"], secret=secret, upstream=upstream)
                    else:
                        with pytest.raises(aiohttp.ClientPayloadError):  # the break reaches the client
                            await r.content.read()
                await px.flush()
                rec = px.records()[-1]
                assert rec["outcome"] in ("upstream_error", "upstream_reset")
                _check_error_text(str(rec["error"]), secret=secret, upstream=upstream)
        assert secret.encode() not in (tmp_path / "records.jsonl").read_bytes()
    finally:
        await garbage.close()
        await broken.server.close()


async def test_idle_timeout_before_the_response_headers_is_reported_as_such(tmp_path: Path) -> None:
    up = await start_upstream(lambda req, body: Script([b"late"], stall_s=3.0))
    try:
        async with (
            running_proxy(up.url, tmp_path, metrics=False, idle_timeout_s=SHORT, connect_timeout_s=10.0) as px,
            aiohttp.ClientSession() as s,
            s.post(px.url + "/v1/chat/completions", data=b"{}") as r,
        ):
            assert r.status == 504
            message = orjson.loads(await r.read())["error"]["message"]
            await px.flush()
            (rec,) = px.records()
        assert rec["outcome"] == "timeout"
        for text in (message, rec["error"]):
            assert "idle" in str(text) and "connect" not in str(text) and f"{SHORT:g} s" in str(text), text
    finally:
        await up.server.close()


def test_one_line() -> None:
    multi = (
        "400, message=\"Bad status line:\n\n  b'GAR\\x00BAGE'\n    ^\", url='http://10.1.2.3:8000/v1/x?api_key=sk-1'"
    )
    assert one_line(multi, hosts=["10.1.2.3"]) == "400, message=\"Bad status line: <bytes>\", url='upstream/v1/x'"
    assert one_line("Cannot connect to host 10.1.2.3:8000 ssl:default", hosts=["10.1.2.3"]) == (
        "Cannot connect to host upstream ssl:default"
    )
    assert one_line("see https://u:p@docs.example/x?utm=1#a and /v1/models?key=2 ok?") == (
        "see https://docs.example/x and /v1/models ok?"
    )
    assert one_line("a\x00b\r\nc\u2028d\te") == "a b c d e"
    cut = one_line("x" * 1000, 50)
    assert len(cut) == 50 and cut.endswith("\u2026")
    assert one_line("日本語のエラー") == "日本語のエラー"


async def test_a_malformed_request_line_is_logged_in_one_line_without_its_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp logs a request line it cannot parse with a traceback that quotes it, query string and all: an API key
    in the query would reach the log. The proxy logs one line, without the bytes, and still answers 400."""
    up = await start_upstream(lambda req, body: Script([b"ok"], headers={"Content-Type": "text/plain"}))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            with caplog.at_level(logging.DEBUG, logger="aiohttp.server"):
                for line in (
                    b"GET /v1/models?api_key=SECRET1 HTTP/1.1 junk\r\nHost: x\r\n\r\n",  # junk after the version
                    b"GET /v1/models?api_key=SECRET2 HTTP/9.9\r\nHost: x\r\n\r\n",  # a version it does not speak
                    b"G\x01T /v1/models?api_key=SECRET3 HTTP/1.1\r\nHost: x\r\n\r\n",  # not a method
                    b"GET /v1/models?api_key=SECRET4 HTTP/1.1\r\nBad Header\r\n\r\n",  # a header without a colon
                ):
                    answer = await raw_exchange(px.url, line)
                    assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n", 1)[0], answer[:80]
    finally:
        await up.server.close()
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(server) >= 3, [r.getMessage() for r in server]
    for r in server:
        text = r.getMessage()
        assert "SECRET" not in text and "api_key" not in text and r.exc_info is None and not r.exc_text, text
        assert text.startswith("unparsable request from ") and "(request bytes not logged)" in text, text
        assert r.levelno <= logging.WARNING
    assert "SECRET" not in caplog.text


def test_an_upstreams_credentials_are_never_shown() -> None:
    """Banners and scrape warnings name the upstream: never with the ``user:password@`` it may carry."""
    assert shown_url("https://user:s3cret@vllm:8000/v1") == "https://vllm:8000/v1"
    assert shown_url("http://a:b@c@[::1]:8000") == "http://[::1]:8000"
    assert shown_url("http://vllm:8000") == "http://vllm:8000" and shown_url("vllm") == "vllm"
