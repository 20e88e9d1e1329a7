"""The relay's own client against upstreams that answer in every way HTTP/1.1 allows, and in some it does not.

Each upstream is a raw TCP server (tests/upstreams.py): its bytes go out exactly as written, in the reads given. The
client is aiohttp's, through the proxy. What the client gets must be what the upstream meant (or a one-line 502 when
the bytes can be read two ways), and the record must say how it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from specproxy.proxy.resolve import Resolver
from specproxy.proxy.server import LINK, POOL
from specproxy.proxy.upstream import EARLY_MAX, Connection, Exchange, Pool, UpstreamError, request_head
from tests.proxyutil import running_proxy
from tests.upstreams import content_length, serving, start_raw_upstream

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
SSE = b"Content-Type: text/event-stream\r\n"
N, HEX = b"%d" % len(EVENT), b"%x" % len(EVENT)
CHUNKED = b"HTTP/1.1 200 OK\r\n" + SSE + b"Transfer-Encoding: chunked\r\n\r\n"
ONE_CHUNK = HEX + b"\r\n" + EVENT + b"\r\n"


async def _through(reply: bytes | list[bytes], tmp_path: Path, *, close_after: bool = False, method: str = "POST"):
    """The reply relayed to one request, and its record (None for a request that is not inference: not recorded)."""
    up = await start_raw_upstream(reply, close_after=close_after)
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            async with s.request(method, px.url + "/v1/chat/completions", data=b"{}") as r:
                try:
                    body: bytes | Exception = await r.read()
                except aiohttp.ClientPayloadError as e:
                    body = e
                status, headers = r.status, r.headers
            await px.flush()
            recs = px.records()
            if method != "POST":
                assert recs == [], recs
                return status, headers, body, None
            (rec,) = recs
            return status, headers, body, rec
    finally:
        await up.close()


@pytest.mark.parametrize(
    "reply",
    [
        # chunk extensions, sizes with trailing whitespace, upper-case hex and trailers
        [CHUNKED + HEX.upper() + b";ext=1\r\n" + EVENT + b"\r\n",
         b"0 \r\nX-Trailer: t\r\n\r\n"],
        # a 103 before the answer
        [b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
         b"HTTP/1.1 200 OK\r\n" + SSE + b"Content-Length: " + N + b"\r\n\r\n" + EVENT],
        # bare LF line ends in the head, and the head in one-byte reads
        [bytes([b]) for b in b"HTTP/1.1 200 OK\n" + SSE[:-2] + b"\nContent-Length: " + N + b"\n\n"] + [EVENT],
    ],
    ids=["chunk-extensions-trailers", "103-then-200", "lf-head-byte-by-byte"],
)  # fmt: skip
async def test_valid_framings_are_relayed_whole(tmp_path: Path, reply: list[bytes]) -> None:
    status, headers, body, rec = await _through(reply, tmp_path)
    assert (status, body) == (200, EVENT), (status, body)
    assert headers["Content-Type"] == "text/event-stream" and "X-Trailer" not in headers
    assert rec["outcome"] == "ok" and rec["status"] == 200, rec


async def test_a_body_read_to_the_close_ends_cleanly(tmp_path: Path) -> None:
    reply = [b"HTTP/1.0 200 OK\r\n" + SSE + b"\r\n" + EVENT, b"data: [DONE]\n\n"]
    status, _, body, rec = await _through(reply, tmp_path, close_after=True)
    assert (status, body, rec["outcome"]) == (200, EVENT + b"data: [DONE]\n\n", "ok"), (status, body, rec)


async def test_no_body_for_head_and_204(tmp_path: Path) -> None:
    status, headers, body, rec = await _through(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", tmp_path, method="HEAD"
    )
    # a HEAD generates nothing: relayed, not recorded
    assert (status, body, headers["Content-Length"], rec) == (200, b"", "100", None)
    (tmp_path / "204").mkdir()
    status, _, body, rec = await _through(b"HTTP/1.1 204 No Content\r\n\r\n", tmp_path / "204")
    assert (status, body, rec["outcome"]) == (204, b"", "ok")


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok", "Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", "more than one Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\nok", "invalid Content-Length"),
        (b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\nContent-Length: 2\r\n\r\nok", "obs-fold"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "status line"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "101"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "head over 64 KiB"),
    ],
    ids=["cl-and-te", "two-cl", "bad-cl", "obs-fold", "not-http", "101", "huge-head"],
)
async def test_answers_that_could_be_read_two_ways_get_a_one_line_502(tmp_path: Path, reply: bytes, says: str) -> None:
    status, _, body, rec = await _through(reply, tmp_path, close_after=True)
    assert status == 502 and isinstance(body, bytes) and says.encode() in body, (status, body)
    assert rec["outcome"] == "upstream_error" and "invalid response" in rec["error"], rec
    assert "\n" not in rec["error"] and len(rec["error"]) < 300


@pytest.mark.parametrize(
    "reply",
    [
        [b"HTTP/1.1 200 OK\r\n" + SSE + b"Content-Length: 500\r\n\r\n" + EVENT],  # closed 441 bytes short
        [CHUNKED + ONE_CHUNK],  # no last chunk
        [CHUNKED + HEX + b"\r\n" + EVENT + b"XX\r\n"],  # data longer than its size
    ],
    ids=["length-short", "chunked-unfinished", "chunk-overrun"],
)
async def test_a_body_cut_short_is_a_break_the_client_sees(tmp_path: Path, reply: list[bytes]) -> None:
    t0 = time.monotonic()
    status, _, body, rec = await _through(reply, tmp_path, close_after=True)
    assert status == 200 and isinstance(body, Exception), body  # not a clean end: the client knows it is cut
    assert rec["outcome"] == "upstream_reset" and "broke mid-response" in rec["error"], rec
    assert time.monotonic() - t0 < 5


async def test_connections_are_reused_and_bytes_past_an_answer_are_not_trusted(tmp_path: Path) -> None:
    """A kept-alive connection carries the next request; one that sent more than its answer is closed, and the
    client gets exactly the answer's bytes."""
    chunked = CHUNKED + ONE_CHUNK + b"0\r\n\r\n"
    for reply, opened in ((chunked, 1), (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", 3)):
        up = await start_raw_upstream(reply)
        try:
            async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
                for _ in range(3):
                    async with s.post(px.url + "/v1/chat/completions", data=b"{}") as r:
                        assert await r.read() == (EVENT if reply is chunked else b"ok")
                assert px.server.app[POOL].opened == opened
        finally:
            await up.close()


async def test_a_slow_client_stops_the_upstream_instead_of_filling_memory(tmp_path: Path) -> None:
    """Flow control: while the client reads nothing, the relay stops reading the upstream, which then cannot write
    much more than the sockets' buffers hold; once the client reads, everything arrives. The pause is the client's:
    it does not count against the upstream's idle-read timeout (0.5 s here, the client idles 1 s)."""
    total = 64 * 1024 * 1024
    written = 0
    piece = b"x" * 65536

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(content_length(head))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        try:
            while written < total:
                writer.write(piece)
                written += len(piece)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async with (
        serving(serve) as url,
        running_proxy(url, tmp_path, metrics=False, idle_timeout_s=0.5) as px,
        aiohttp.ClientSession() as s,
        s.post(px.url + "/v1/completions", data=b"{}") as r,
    ):
        await asyncio.sleep(1.0)  # the client reads nothing for a second
        stalled_at = written
        got = 0
        async for chunk in r.content.iter_any():
            got += len(chunk)
        await px.flush()
        (rec,) = px.records()
    assert got == total and rec["outcome"] == "ok", (got, rec)
    # socket buffers on both sides of the proxy plus the proxy's own high-water mark: a few MB, not 64
    assert stalled_at < 24 * 1024 * 1024, stalled_at


@pytest.fixture
def tls_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl's command line; skipped without it)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_an_https_upstream_is_relayed_and_its_certificate_checked(
    tmp_path: Path, tls_cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tls_cert
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(3):
            await resp.write(EVENT)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        for trusted in (False, True):
            if trusted:
                monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read when the relay makes its TLS context
            (tmp_path / str(trusted)).mkdir()
            async with (
                running_proxy(f"https://127.0.0.1:{port}", tmp_path / str(trusted), metrics=False) as px,
                aiohttp.ClientSession() as s,
                s.post(px.url + "/v1/chat/completions", data=b"{}") as r,
            ):
                body = await r.read()
                status = r.status
            if trusted:
                assert (status, body) == (200, EVENT * 3), (status, body)
            else:
                assert status == 502 and b"certificate" in body.lower(), (status, body)
    finally:
        await runner.cleanup()


async def test_an_answer_before_the_request_body_is_read_is_relayed_at_once(tmp_path: Path) -> None:
    """An engine may answer (a 413, an error) without reading a large body. The reply is read while the body is
    still being written, so the client gets it at once, and the connection, with the rest of the body, is dropped
    (a half-sent request cannot be followed by another)."""
    half = b"x" * (2 * 1024 * 1024)
    closed = asyncio.Event()
    client_has_half = asyncio.Event()
    order: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only: no byte of the body is read before the client has
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: %d\r\n\r\n" % (2 * len(half)) + half)
        await writer.drain()
        with contextlib.suppress(TimeoutError):  # the answer goes on once the client has its first half
            await asyncio.wait_for(client_has_half.wait(), 10)
        writer.write(half)
        await writer.drain()
        order.append("upstream reads the body")
        try:
            while await reader.read(65536):  # until the relay drops the connection
                pass
        except ConnectionError:
            pass
        closed.set()
        writer.close()

    async with (
        serving(serve) as url,
        running_proxy(url, tmp_path, metrics=False) as px,
        aiohttp.ClientSession() as s,
    ):
        t0 = time.monotonic()
        async with s.post(px.url + "/v1/chat/completions", data=io.BytesIO(b" " * (48 * 1024 * 1024))) as r:
            assert r.status == 413 and await r.content.readexactly(len(half)) == half
            order.append("client has half the answer")
            client_has_half.set()
            assert await r.read() == half
        await asyncio.wait_for(closed.wait(), 5)
        await px.flush()
        (rec,) = px.records()
    assert order == ["client has half the answer", "upstream reads the body"], order
    assert time.monotonic() - t0 < 10 and rec["outcome"] == "upstream_error", rec


async def test_a_failure_of_the_bookkeeping_never_breaks_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = [CHUNKED + ONE_CHUNK, ONE_CHUNK, ONE_CHUNK + b"0\r\n\r\n"]
    up = await start_raw_upstream(reply)
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:

            def broken(*args: object) -> None:
                raise KeyError("a bug in the bookkeeping")

            monkeypatch.setattr(px.server.app[LINK], "chunk", broken)
            async with s.post(px.url + "/v1/chat/completions", data=b"{}") as r:
                assert r.status == 200 and await r.read() == EVENT * 3
            await px.flush()
            (rec,) = px.records()
    finally:
        await up.close()
    assert rec["outcome"] == "ok" and "bookkeeping_shed" in rec["flags"], rec


async def test_a_body_read_to_the_close_that_ends_in_a_reset_is_cut_not_complete(tmp_path: Path) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(content_length(head))
        writer.write(b"HTTP/1.0 200 OK\r\n" + SSE + b"\r\n" + EVENT)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset, not a close

    async with (
        serving(serve) as url,
        running_proxy(url, tmp_path, metrics=False) as px,
        aiohttp.ClientSession() as s,
        s.post(px.url + "/v1/chat/completions", data=b"{}") as r,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
        await px.flush()
        (rec,) = px.records()
    assert rec["outcome"] == "upstream_reset" and "reset" in rec["error"], rec


class _Transport:
    """Just enough of a transport for one connection driven by hand: whether it reads, and what was written."""

    def __init__(self) -> None:
        self.reading = True
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        pass

    abort = close


async def test_a_connection_paused_before_the_relay_began_goes_back_to_the_pool_reading() -> None:
    """What is read before the relay begins pauses reading past EARLY_MAX. When the read that passes it also ends
    the body, the connection goes back to the pool: it must read again, or the next request on it is sent and its
    answer never read (a 504 after the idle timeout)."""
    pool = Pool("http", "127.0.0.1", 9, connect_timeout_s=1.0, idle_timeout_s=600.0)
    conn = Connection(pool)
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    ex = Exchange(conn, "POST", False, None)
    conn.send(ex, request_head("POST", "/v1/x", "h", [], 0), [], 600.0)
    body = b"x" * (EARLY_MAX + 1000)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert ex.ended and ex.outcome == "ok"
    assert pool._take() is conn and transport.reading


async def test_a_burst_to_a_named_upstream_looks_its_name_up_once(tmp_path: Path) -> None:
    """An engine behind a name (``http://vllm:8000``): a burst of new connections shares one lookup."""
    up = await start_raw_upstream(CHUNKED + ONE_CHUNK + b"0\r\n\r\n")
    port = int(up.url.rsplit(":", 1)[1])
    try:
        async with running_proxy(f"http://localhost:{port}", tmp_path, metrics=False) as px:
            async with aiohttp.ClientSession() as s:

                async def post() -> bytes:
                    async with s.post(px.url + "/v1/chat/completions", data=b"{}") as r:
                        return await r.read()

                got = await asyncio.gather(*(post() for _ in range(16)))
            pool = px.server.app[POOL]
            assert got == [EVENT] * 16 and pool.opened == 16, (got, pool.opened)
            assert pool.resolver.lookups == 1
    finally:
        await up.close()


async def test_an_address_literal_is_never_looked_up_and_a_name_is_again_after_its_ttl() -> None:
    literal = Resolver("::1", 8000)
    assert literal.lookups == 0
    assert await literal.addresses() == [
        (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", 8000, 0, 0))
    ]
    name = Resolver("localhost", 8000, ttl_s=0.0)
    first = await name.addresses()
    assert first and all(info[4][1] == 8000 for info in first)
    await name.addresses()
    assert name.lookups == 2  # a TTL of 0: every call looks up again


async def test_an_address_that_refuses_is_passed_over_for_the_next() -> None:
    """A name with several addresses (``localhost`` as ::1 and 127.0.0.1, where the engine listens on one only)."""
    up = await start_raw_upstream(CHUNKED + ONE_CHUNK + b"0\r\n\r\n")
    port = int(up.url.rsplit(":", 1)[1])
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
    try:
        pool = Pool("http", "engine.internal", port, connect_timeout_s=5.0, idle_timeout_s=5.0)
        tcp = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        pool.resolver._cached = [(*tcp, closed.getsockname()), (*tcp, ("127.0.0.1", port))]
        pool.resolver._at = float("inf")  # as if looked up just now
        head = request_head("POST", "/v1/x", "engine.internal", [], 2)
        ex = await pool.request("POST", head, [b"{}"], lambda why: None)
        assert (await ex.head()).status == 200 and pool.opened == 1
        ex.abort()
        await pool.close()
    finally:
        closed.close()
        await up.close()


def test_one_address_is_connected_to_by_its_text_unless_it_carries_a_scope() -> None:
    from specproxy.proxy.upstream import _numeric

    tcp = (socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
    assert _numeric((socket.AF_INET, *tcp, ("10.0.0.2", 8000))) == (socket.AF_INET, "10.0.0.2", 8000)
    assert _numeric((socket.AF_INET6, *tcp, ("::1", 8000, 0, 0))) == (socket.AF_INET6, "::1", 8000)
    assert _numeric((socket.AF_INET6, *tcp, ("fe80::1", 8000, 0, 2))) is None  # a link-local address's interface
    assert _numeric((socket.AF_UNIX, *tcp, "/run/engine.sock")) is None


async def test_a_name_with_one_address_that_refuses_says_so_in_one_line() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
    try:
        pool = Pool("http", "engine.internal", 1, connect_timeout_s=5.0, idle_timeout_s=5.0)
        tcp = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
        pool.resolver._cached = [(*tcp, closed.getsockname())]
        pool.resolver._at = float("inf")  # as if looked up just now
        head = request_head("POST", "/v1/x", "engine.internal", [], 2)
        with pytest.raises(UpstreamError) as e:
            await pool.request("POST", head, [b"{}"], lambda why: None)
        assert (e.value.kind, str(e.value)) == ("connect", "upstream unreachable: Connection refused")
        await pool.close()
    finally:
        closed.close()
