"""Absolute-form request targets (RFC 9112 3.2.2: a server must accept them): the proxy's own endpoints answer for
``GET http://host/specproxy/status`` as for ``GET /specproxy/status``, and a relayed request in absolute form goes
upstream in origin form, its path and query as sent."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.proxyutil import raw_exchange, started_proxy
from tests.upstreams import start_raw_upstream


def _request(target: bytes, method: bytes = b"GET") -> bytes:
    return method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _split(reply: bytes) -> tuple[bytes, bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


async def test_own_endpoints_answer_in_absolute_form(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    try:
        async with started_proxy(up.url, tmp_path) as px:
            for target in (
                b"http://proxy.test/specproxy/status",
                b"HTTP://proxy.test:8080/specproxy/status?pretty=1",  # the scheme in any case, a port, a query
                b"https://[::1]/specproxy/status",
            ):
                head, body = _split(await raw_exchange(px.url, _request(target)))
                assert head.startswith(b"HTTP/1.1 200"), (target, head)
                assert "in_flight" in orjson.loads(body), target
            head, body = _split(await raw_exchange(px.url, _request(b"http://proxy.test/specproxy/metrics")))
            assert head.startswith(b"HTTP/1.1 200") and b"specproxy_relays" in body, head
            head, body = _split(await raw_exchange(px.url, _request(b"http://proxy.test/specproxy/status", b"HEAD")))
            assert head.startswith(b"HTTP/1.1 200") and body == b"", head
        assert up.lines == []  # answered by the proxy, none of them relayed
    finally:
        await up.close()


async def test_relayed_absolute_form_goes_upstream_in_origin_form(tmp_path: Path) -> None:
    up = await start_raw_upstream()
    relayed = [
        (b"http://proxy.test/v1/models", b"/v1/models"),
        (b"http://user@proxy.test:9/v1/models?api=1", b"/v1/models?api=1"),  # userinfo and port go with the host
        (b"http://proxy.test/v1/../specproxy/status", b"/v1/../specproxy/status"),  # not an own endpoint's spelling
        (b"http://proxy.test/specproxy/status/x", b"/specproxy/status/x"),
    ]
    try:
        async with started_proxy(up.url + "/base", tmp_path) as px:
            for target, _ in relayed:
                got = await raw_exchange(px.url, _request(target))
                assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok"), (target, got)
            # the authority form names no resource (RFC 9112 3.2.3): refused, never relayed
            got = await raw_exchange(px.url, _request(b"proxy.test:443", b"CONNECT"))
            assert not got.startswith(b"HTTP/1.1 2"), got
        assert up.lines == [b"GET /base" + sent + b" HTTP/1.1" for _, sent in relayed]
    finally:
        await up.close()


async def test_request_fields_go_upstream_as_the_client_wrote_them(tmp_path: Path) -> None:
    """Names in the client's case and order, values as their bytes (not UTF-8 included); hop-by-hop fields, those
    named in Connection and the workload header dropped; Host and the body's length the proxy's own."""
    up = await start_raw_upstream()
    sent = (
        b"POST /v1/x HTTP/1.1\r\nhost: proxy.test\r\ncontent-type: application/json\r\nX-odd-CASE: a \xff b\r\n"
        b"Connection: close, X-Hop\r\nX-Hop: 1\r\nx-specproxy-workload: w\r\nTE: trailers\r\n"
        b"accept: */*\r\naccept: text/plain\r\nContent-Length: 2\r\n\r\n{}"
    )
    try:
        async with started_proxy(up.url, tmp_path) as px:
            got = await raw_exchange(px.url, sent)
            assert got.startswith(b"HTTP/1.1 200"), got
        (head,) = up.heads
        host = up.url.removeprefix("http://").encode()
        assert head == (
            b"POST /v1/x HTTP/1.1\r\nHost: " + host + b"\r\ncontent-type: application/json\r\n"
            b"X-odd-CASE: a \xff b\r\naccept: */*\r\naccept: text/plain\r\nContent-Length: 2\r\n\r\n"
        ), head
    finally:
        await up.close()
