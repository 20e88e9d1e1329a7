"""The relay: every method and path forwarded, bodies byte-identical, streams relayed read by read.

aiohttp details that matter here (engine-facts.md, "Proxying pitfalls"): the client session does not decompress
(``auto_decompress=False``) so Content-Encoding and Content-Length stay true to the bytes sent; no total timeout
(long generations), connect and idle-read timeouts instead; no connection cap by default; upstream bodies read with
``iter_any()`` (lines of any length). The server runs with handler cancellation on, so a client that disconnects
cancels its handler at once, which closes the upstream connection: vLLM then aborts the request and frees the GPU,
also during prefill before the first byte. A request whose pooled connection fails before any byte of an answer (the
upstream closed it as it was reused) is sent once more on a new connection, POST included (:func:`_send`).

Byte for byte also for the request target (RFC 9112 3.2): ``request.raw_path`` is forwarded as sent (see
:meth:`Upstream.url`), and recorded without its query string. The front door (:mod:`specproxy.serving`): a body
over ``--max-body`` is refused before it is read, a body that stops coming gets 408, a head that never completes
is closed. :meth:`ProxyHandle.close` stops in two steps; streams it cuts are recorded with outcome ``shutdown``.
Error texts, in records and in the proxy's own error responses, go through :func:`specproxy.core.errors.one_line`.

The relay reads nothing of what it relays: per request it hands events to the bookkeeping
(:class:`specproxy.proxy.link.EventLink`: the request, the response head, each read with the time it arrived, the
outcome), which a bookkeeper interprets in another process (``--workers``) or on this loop (:func:`start_proxy`
without a channel). The own endpoints are the bookkeeper's answers.

One module: a relayed request's way through the proxy (target, body, upstream, stream, outcome) is one sequence of
decisions about a single outcome and reads best top to bottom; what other servers share (listening, the limits of
the front door, stopping) is in :mod:`specproxy.serving`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from specproxy.core.errors import one_line
from specproxy.core.headers import CLIENT_KEEPALIVE_S, REQUEST_ID_HEADER, WORKLOAD_HEADER
from specproxy.core.request_body import Body
from specproxy.proxy.bookkeeper import Bookkeeper
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.link import EventLink, Relayed
from specproxy.proxy.stalled import StalledReads
from specproxy.recorder.recorder import Recorder
from specproxy.server_log import quiet_bad_requests
from specproxy.serving import (
    Cut,
    InFlight,
    Refused,
    Stopped,
    base_url,
    close_after,
    declared_too_large,
    origin_form,
    read_body,
    start_app,
    stop_in_two_steps,
    target_path,
)

log = logging.getLogger("specproxy.proxy")

# RFC 9110 7.6.1 hop-by-hop fields, plus the ones a proxy must recompute.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
# the body has been read already: an Expect: 100-continue is answered here, not passed on
_REQ_DROP = HOP_BY_HOP | {"host", "content-length", "expect", WORKLOAD_HEADER.lower()}
_RESP_DROP = HOP_BY_HOP | {"content-length"}

CONFIG = web.AppKey("config", ProxyConfig)
RECORDER = web.AppKey("recorder", Recorder)  # only with the bookkeeper on this loop (library use, tests)
BOOKKEEPER = web.AppKey("bookkeeper", Bookkeeper)
LINK = web.AppKey("link", EventLink)
SESSION = web.AppKey("session", aiohttp.ClientSession)
FRESH_SESSION = web.AppKey("fresh_session", aiohttp.ClientSession)  # a new connection per request: resends (_send)
IN_FLIGHT = web.AppKey("in_flight", InFlight)
STALLED = web.AppKey("stalled", StalledReads)


@dataclass(frozen=True, slots=True)
class Upstream:
    """The upstream's base URL, taken apart once: requests go to ``scheme://authority`` + ``prefix`` + the target."""

    scheme: str
    authority: str
    prefix: str  # the base URL's path as written, without a trailing slash ("" for none)
    hosts: tuple[str, ...]  # its host, as error texts must not show it

    @classmethod
    def parse(cls, base: str) -> Upstream:
        url = URL(base)
        host = url.raw_host or ""
        return cls(url.scheme, url.raw_authority, urlsplit(base).path.rstrip("/"), (host, f"[{host}]"))

    def url(self, target: str) -> URL:
        # The whole target goes into the path with encoded=True: yarl then keeps it as it is (no requoting, no dot
        # segment removal, an empty query's "?" kept), and aiohttp's client writes it on the request line as is.
        return URL.build(scheme=self.scheme, authority=self.authority, path=self.prefix + target, encoded=True)


UPSTREAM = web.AppKey("upstream", Upstream)


def _error_body(message: str, code: int, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def _connection_tokens(headers: Any) -> set[str]:
    # Fields named in Connection are hop-by-hop too (RFC 9110 7.6.1).
    out: set[str] = set()
    for value in headers.getall("Connection", []):
        out.update(t.strip().lower() for t in value.split(",") if t.strip())
    return out


def _forward_request_headers(request: web.Request) -> CIMultiDict[str]:
    drop = _REQ_DROP | _connection_tokens(request.headers)
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in request.headers.items():
        if k.lower() not in drop:
            out.add(k, v)
    return out


def _safe(request: web.Request, text: str) -> str:
    """An error text fit for a record and for the client: one line, no raw bytes, no query string, no upstream host."""
    return one_line(text, hosts=request.app[UPSTREAM].hosts)


async def handle(request: web.Request) -> web.StreamResponse:
    target = origin_form(request.raw_path)
    if target is None:
        return _json_error(400, "the request target must be a path", "BadRequest")
    path = target_path(target)
    own = _OWN.get(path) if request.method in ("GET", "HEAD") else None
    if own is not None:
        return await own(request)
    in_flight = request.app[IN_FLIGHT]
    task = in_flight.enter()
    try:
        return await _proxy(request, target, path)
    finally:
        in_flight.leave(task)


async def _proxy(request: web.Request, target: str, path: str) -> web.StreamResponse:
    cfg = request.app[CONFIG]
    link = request.app[LINK]
    if cfg.fail_closed and not link.healthy:
        return web.Response(
            status=503,
            body=_error_body("specproxy cannot write records (--fail-closed)", 503, "ServiceUnavailable"),
            content_type="application/json",
        )
    try:
        body = await read_body(request, limit=cfg.max_body_bytes, idle_s=cfg.client_body_timeout_s)
    except Refused as refused:  # turned away before forwarding (413, 408): no upstream request, no record
        link.refused(refused.status)
        answer = _refusal(request, refused)
        return await close_after(request, answer) if refused.close_now else answer
    # the body and the request's facts go to the bookkeeping as they are: parsing, rules and the rest happen there
    relayed = link.begin(request.method, path, request.headers, request.headers.get(WORKLOAD_HEADER), body)
    outcome: str = "proxy_error"
    error: str | None = "unfinished"
    try:
        resp, outcome, error = await _relay(request, cfg, target, body, relayed)
        return resp
    except asyncio.CancelledError:
        cut_by = request.app[IN_FLIGHT].cut_reason
        if cut_by is not None:  # the proxy is stopping and cut this stream, not the client
            outcome, error = "shutdown", f"cut by shutdown: {cut_by}"
        else:
            outcome, error = "client_cancelled", "client disconnected"
        raise
    except Exception as e:  # never let our own failure pass silently: record it, answer 502 if we still can
        log.exception("relay failed")
        outcome, error = "proxy_error", _safe(request, f"{type(e).__name__}: {e}")
        raise
    finally:
        link.finish(relayed, outcome, error)


def _refusal(request: web.Request, refused: Refused) -> web.Response:
    kinds = {408: "RequestTimeout", 413: "RequestEntityTooLarge"}
    resp = _json_error(refused.status, refused.reason, kinds.get(refused.status, "BadRequest"))
    resp.force_close()  # the body was not read to its end: the connection cannot carry another request
    return resp


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` (RFC 9110 10.1.1): a declared body over the limit gets the final 413 instead of the
    100, so the client does not send it; any other request is answered as aiohttp's default handler does."""
    refused = declared_too_large(request, request.app[CONFIG].max_body_bytes)
    if refused is not None:
        request.app[LINK].refused(refused.status)
        return _refusal(request, refused)
    if request.version == aiohttp.HttpVersion11:
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {one_line(expect, 60)}")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the response's size
    return None


def _connect_failure(e: aiohttp.ClientConnectorError) -> str:
    err = e.os_error
    if type(err).__module__ == "builtins" and err.errno:  # ConnectionRefusedError & co, not ssl's or socket's errors
        return os.strerror(err.errno)  # "Connection refused", without the address asyncio's message adds
    return err.strerror or str(err) or type(err).__name__


def _is_connect_timeout(e: TimeoutError) -> bool:
    # aiohttp >= 3.10 raises ConnectionTimeoutError while connecting and SocketTimeoutError on sock_read; 3.9 raises
    # ServerTimeoutError for both, with these words
    cls = getattr(aiohttp, "ConnectionTimeoutError", None)
    if isinstance(cls, type):
        return isinstance(e, cls)
    return str(e).startswith("Connection timeout")


async def _relay(
    request: web.Request, cfg: ProxyConfig, target: str, body: Body, relayed: Relayed
) -> tuple[web.StreamResponse, str, str | None]:
    rid = relayed.request_id
    headers = _forward_request_headers(request)
    try:
        upstream = await _send(request, request.app[UPSTREAM].url(target), headers, body, relayed)
    except aiohttp.ClientConnectorError as e:
        status, reason = 502, _safe(request, f"upstream unreachable: {_connect_failure(e)}")
    except TimeoutError as e:
        if _is_connect_timeout(e):
            status, reason = 504, f"upstream connect timeout: not connected within {cfg.connect_timeout_s:g} s"
        else:
            status, reason = 504, f"upstream idle-read timeout: no response headers within {cfg.idle_timeout_s:g} s"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        status, reason = 502, _safe(request, f"upstream connection failed: {e}")
    except aiohttp.ClientResponseError as e:  # not HTTP: the message quotes the bytes, the error names the URL
        status, reason = 502, _safe(request, f"upstream sent an invalid response: {e.message}")
    except aiohttp.ClientError as e:
        status, reason = 502, _safe(request, f"upstream error: {type(e).__name__}: {e}")
    else:
        return await _relay_response(request, cfg, upstream, relayed)
    if relayed.retried:
        reason += " (sent twice: the first on a reused connection that failed before any answer)"
    if status == 504:
        return _json_error(504, reason, "GatewayTimeout", rid), "timeout", reason
    return _json_error(502, reason, "BadGateway", rid), "upstream_error", reason


async def _relay_response(
    request: web.Request, cfg: ProxyConfig, upstream: aiohttp.ClientResponse, relayed: Relayed
) -> tuple[web.StreamResponse, str, str | None]:
    """The upstream's answer relayed; its connection back to the pool when read to the end, else closed."""
    finished = False
    try:
        result = await _relay_body(request, cfg, upstream, relayed)
        finished = result[1] == "ok" or result[1] == "upstream_error"
        return result
    finally:
        if finished and upstream.content.at_eof():
            upstream.release()  # read to the end: the connection goes back to the pool (no new handshake)
        else:
            upstream.close()  # cut one still streaming (client gone, upstream broke): the engine aborts it


LARGE_BODY = 1024 * 1024


class _Pooled:
    """Per upstream request (aiohttp's ``trace_request_ctx``): whether it went out on a connection from the pool."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _on_reuse(session: Any, ctx: Any, params: Any) -> None:
    if isinstance(ctx.trace_request_ctx, _Pooled):
        ctx.trace_request_ctx.reused = True


# A pooled connection closed under a request fails at once (the upstream's close crossed our send). A failure later
# than this after sending is an upstream that read the request and died on it: that one is not sent again.
RESEND_WITHIN_S = 1.0


async def _send(
    request: web.Request, url: URL, headers: Mapping[str, str], body: Body, relayed: Relayed
) -> aiohttp.ClientResponse:
    """The request upstream. When it went out on a pooled connection that failed before any byte of an answer, within
    :data:`RESEND_WITHIN_S` (the upstream, or a balancer, closed the kept-alive connection as it was reused), it is
    sent once more on a new connection. Browsers and curl do the same for any method (Chromium:
    ``HttpNetworkTransaction::ShouldResendRequest``); aiohttp does it for idempotent methods only, and already has
    for those. A POST to an inference engine generates and changes nothing; the other answer is a 502 for a request
    the engine never saw. A second failure is answered as it is."""

    def data() -> Any:
        # Large bodies go in the pieces they came in, with their length: joining tens of megabytes, or writing them in
        # one call, would stall the loop (aiohttp warns of bytes over 1 MiB for the same reason).
        return _pieces(body.pieces()) if body.size > LARGE_BODY else body.whole() if body.size else None

    if body.size > LARGE_BODY:
        headers = {**headers, "Content-Length": str(body.size)}
    pooled = _Pooled()
    sent = time.monotonic()
    try:
        return await request.app[SESSION].request(
            request.method, url, headers=headers, data=data(), allow_redirects=False, trace_request_ctx=pooled
        )
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        resend = pooled.reused and request.method not in aiohttp.client.IDEMPOTENT_METHODS
        if not resend or isinstance(e, aiohttp.ClientConnectorError) or time.monotonic() - sent > RESEND_WITHIN_S:
            raise
        relayed.retried = f"{type(e).__name__} on a reused connection"
    return await request.app[FRESH_SESSION].request(
        request.method, url, headers=headers, data=data(), allow_redirects=False
    )


async def _pieces(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for p in pieces:
        yield p


async def _relay_body(
    request: web.Request, cfg: ProxyConfig, upstream: aiohttp.ClientResponse, relayed: Relayed
) -> tuple[web.StreamResponse, str, str | None]:
    link = request.app[LINK]
    content_type = upstream.headers.get("Content-Type")
    link.head(relayed, upstream.status, content_type, upstream.headers.get("Content-Encoding"))
    resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    drop = _RESP_DROP | _connection_tokens(upstream.headers)
    for k, v in upstream.headers.items():
        if k.lower() not in drop:
            resp.headers.add(k, v)
    resp.headers[REQUEST_ID_HEADER] = relayed.request_id
    if content_type and content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
        resp.headers["X-Accel-Buffering"] = "no"
        if "Cache-Control" not in resp.headers:
            resp.headers["Cache-Control"] = "no-cache"
    length = upstream.headers.get("Content-Length")
    if length is not None and "Transfer-Encoding" not in upstream.headers and length.isdigit():
        resp.content_length = int(length)  # the exact bytes are relayed undecoded: the length stays true
    await resp.prepare(request)
    outcome, error = "ok", None
    if upstream.status >= 400:
        outcome, error = "upstream_error", f"HTTP {upstream.status}"
    perf = time.perf_counter_ns
    chunk = link.chunk
    stalled = request.app[STALLED]
    stalled.watch(upstream)  # aiohttp may never wake this read when the body's framing breaks
    try:
        async for data in upstream.content.iter_any():
            t = perf()
            await resp.write(data)  # the bytes go out first; the bookkeeping follows
            b = perf()
            chunk(relayed, t, data)  # appends an event, or sheds it: never raises, never waits
            # what recording adds to relaying this read (the write itself is what any proxy pays, and may wait for
            # a slow client)
            ns = perf() - b
            relayed.ov_ns += ns
            relayed.ov_n += 1
            if ns > relayed.ov_max:
                relayed.ov_max = ns
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        # The upstream broke mid-response: end the client's stream without a clean finish, so it sees the break.
        _abort_client(request)
        return resp, "upstream_reset", _safe(request, f"upstream connection broke mid-response: {e}")
    except TimeoutError:
        _abort_client(request)
        return resp, "timeout", f"upstream idle-read timeout: no byte within {cfg.idle_timeout_s:g} s mid-response"
    except ConnectionResetError:
        return resp, "client_cancelled", "client disconnected"
    finally:
        stalled.forget(upstream)
    try:
        await resp.write_eof()
    except ConnectionResetError:
        return resp, "client_cancelled", "client disconnected"
    return resp, outcome, error


def _abort_client(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _json_error(status: int, message: str, kind: str, rid: str | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=_error_body(message, status, kind),
        content_type="application/json",
        headers={REQUEST_ID_HEADER: rid} if rid is not None else None,
    )


async def own_endpoint(request: web.Request) -> web.Response:
    """The bookkeeper's answer, which describes the whole proxy (every relay), whichever relay is asked."""
    status, content_type, body = await request.app[LINK].query(target_path(request.raw_path))
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


# The proxy's own endpoints, answered for GET and HEAD on their exact raw path; any other spelling of them
# (/v1/../specproxy/status, /specproxy/%73tatus) is a path like any other and goes to the upstream as sent.
_OWN = {"/specproxy/metrics": own_endpoint, "/specproxy/status": own_endpoint}


def build_app(cfg: ProxyConfig, channel: socket.socket | None = None) -> web.Application:
    """The relay. ``channel``: a connected Unix socket to a bookkeeper process; None: a bookkeeper on this loop,
    fed through the same events (library use, tests)."""
    quiet_bad_requests()  # a malformed request line is logged in one line, without its bytes (API keys in queries)
    app = web.Application(client_max_size=cfg.max_body_bytes, handler_args={"max_field_size": 65536})
    app[CONFIG] = cfg
    app[UPSTREAM] = Upstream.parse(cfg.upstream)
    app[IN_FLIGHT] = InFlight()
    app[STALLED] = stalled = StalledReads()
    app[LINK] = link = EventLink(
        soft_bytes=cfg.bookkeeping_buffer_bytes,
        hard_bytes=2 * cfg.bookkeeping_buffer_bytes,
        capture_max_bytes=cfg.recorder.capture_max_bytes,
        header_names=tuple(sorted({r.header_name.lower() for r in cfg.rules if r.header_name})),
    )

    async def resources(app: web.Application) -> Any:
        session = upstream_session(cfg)
        app[SESSION] = session
        app[FRESH_SESSION] = fresh = upstream_session(cfg, fresh=True)
        keeper: Bookkeeper | None = None
        sweeper = asyncio.create_task(stalled.run())
        try:
            if channel is None:
                keeper = Bookkeeper.create(cfg, session)
                app[BOOKKEEPER], app[RECORDER] = keeper, keeper.recorder
                await keeper.start()
                conn = keeper.connect(link.received)
                link.attach_local(conn.received)
            else:
                await link.attach_socket(channel)
            yield
        finally:
            sweeper.cancel()
            await asyncio.wait([sweeper])  # ends at its next await: it holds nothing to clean up
            await link.close()
            if keeper is not None:
                await keeper.close()
            await session.close()
            await fresh.close()

    app.cleanup_ctx.append(resources)
    # One route for every method and path: the routing is handle's, on the raw target. [\s\S], not ".", because
    # the router matches the decoded path, where %0A is a line break.
    app.router.add_route("*", r"/{tail:[\s\S]*}", handle, expect_handler=_expect)
    return app


def upstream_session(cfg: ProxyConfig, *, fresh: bool = False) -> aiohttp.ClientSession:
    """The client session to the upstream (and its /metrics): no connection cap, no total timeout, bytes as sent.
    ``fresh``: every request on a new connection, closed after it."""
    connector = aiohttp.TCPConnector(
        limit=cfg.max_connections, limit_per_host=0, keepalive_timeout=None if fresh else CLIENT_KEEPALIVE_S,
        force_close=fresh,
    )  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s, sock_read=cfg.idle_timeout_s)
    pooled = aiohttp.TraceConfig()
    pooled.on_connection_reuseconn.append(_on_reuse)  # which requests went out on a pooled connection (_relay)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[pooled],
    )


@dataclass(slots=True)
class ProxyHandle:
    """A proxy listening in this event loop: ``url``, its ``recorder``, and ``close()`` (drains, cuts what is left,
    writes every record)."""

    url: str
    runner: web.AppRunner

    @property
    def recorder(self) -> Recorder:
        """The recorder, when the bookkeeper runs on this loop (``start_proxy`` without a channel)."""
        return self.runner.app[RECORDER]

    @property
    def link(self) -> EventLink:
        return self.runner.app[LINK]

    @property
    def in_flight(self) -> int:
        return len(self.runner.app[IN_FLIGHT])

    async def close(self, cut: Cut | None = None) -> Stopped:
        """Stop listening; let in-flight requests finish for up to ``drain_timeout_s`` (or until ``cut`` is asked
        for); cut the rest (recorded with outcome ``shutdown``); then write every record."""
        app = self.runner.app
        return await stop_in_two_steps(self.runner, app[IN_FLIGHT], app[CONFIG].drain_timeout_s, cut)


async def start_proxy(
    cfg: ProxyConfig, channel: socket.socket | None = None, *, reuse_port: bool = False
) -> ProxyHandle:
    """A relay listening on ``cfg.host:cfg.port``, its bookkeeper on this loop, or behind ``channel`` (a Unix socket
    to a bookkeeper process); ``reuse_port``: one of several relay processes on the port."""
    runner = await start_app(
        build_app(cfg, channel),
        cfg.host,
        cfg.port,
        shutdown_timeout=1.0,  # aiohttp's own wait, for stragglers only: ProxyHandle.close has drained and cut
        handler_cancellation=True,
        reuse_address=True,  # a restarted proxy takes its port back at once, despite connections in TIME_WAIT
        client_header_timeout=cfg.client_header_timeout_s,
        reuse_port=reuse_port or None,
    )
    return ProxyHandle(base_url(runner), runner)
