"""The relay: every method and path forwarded, bodies byte-identical, streams relayed read by read.

aiohttp serves the clients; requests go to the engine through the relay's own HTTP/1.1 client
(:mod:`specproxy.proxy.upstream`), whose connection callback writes each read of a reply to the client
(:func:`client_sink`).
Bodies are relayed undecoded, so Content-Encoding and Content-Length stay true to the bytes sent; no total timeout
(long generations), connect and idle-read timeouts instead; no connection cap by default. The server runs with
handler cancellation on, so a client that disconnects cancels its handler at once, which closes the upstream
connection: vLLM then aborts the request and frees the GPU, also during prefill before the first byte. A request
whose pooled connection fails before any byte of an answer (the upstream closed it as it was reused) is sent once
more on a new connection (:meth:`specproxy.proxy.upstream.Pool.request`).

Byte for byte also for the request target (RFC 9112 3.2): ``request.raw_path`` is forwarded as sent (``_relay``
puts it on the request line after the upstream's path), and recorded without its query string. The front door
(:mod:`specproxy.serving`): a body over ``--max-body`` is refused before it is read, a body that stops coming gets
408, a head that never completes is closed. :meth:`ProxyHandle.close` stops in two steps; streams it cuts are
recorded with outcome ``shutdown``. Error texts, in records and in the proxy's own error responses, go through
:func:`specproxy.core.errors.one_line`.

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
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from specproxy.core.errors import one_line
from specproxy.core.headers import CLIENT_KEEPALIVE_S, REQUEST_ID_HEADER, WORKLOAD_HEADER
from specproxy.core.request_body import Body
from specproxy.proxy.bookkeeper import Bookkeeper
from specproxy.proxy.config import ProxyConfig, basic_authorization
from specproxy.proxy.http1 import Head, list_elements
from specproxy.proxy.link import EventLink, Relayed, header_names
from specproxy.proxy.upstream import Exchange, Pool, Sink, UpstreamError, request_head
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
_REQ_DROP_RAW = frozenset(h.encode() for h in _REQ_DROP)  # for the fields as the client sent them

CONFIG = web.AppKey("config", ProxyConfig)
RECORDER = web.AppKey("recorder", Recorder)  # only with the bookkeeper on this loop (library use, tests)
BOOKKEEPER = web.AppKey("bookkeeper", Bookkeeper)
LINK = web.AppKey("link", EventLink)
SESSION = web.AppKey("session", aiohttp.ClientSession)
POOL = web.AppKey("pool", Pool)  # the relay's own connections to the upstream
IN_FLIGHT = web.AppKey("in_flight", InFlight)


@dataclass(frozen=True, slots=True)
class Upstream:
    """The upstream's base URL, taken apart once: requests go to ``host:port``, with ``authority`` as their Host,
    ``prefix`` + the target as sent as their target (no requoting, no dot segments removed)."""

    scheme: str
    host: str
    port: int
    authority: str  # the Host field: the host, and the port unless it is the scheme's
    prefix: str  # the base URL's path as written, without a trailing slash ("" for none)
    hosts: tuple[str, ...]  # its host, as error texts must not show it
    authorization: str | None = field(repr=False)  # --upstream-credentials-file or the URL's, for requests without

    @property
    def authorization_field(self) -> bytes | None:
        """:attr:`authorization` as the bytes of a field value (as a client's field would have been sent)."""
        a = self.authorization
        return None if a is None else a.encode("utf-8", "surrogateescape")

    @classmethod
    def parse(cls, base: str, authorization: str | None = None) -> Upstream:
        url = URL(base)
        host = url.raw_host or ""
        auth = authorization
        if auth is None and url.user is not None:
            auth = basic_authorization(url.user or "", url.password or "")
        return cls(
            url.scheme, host, url.port or 80, url.host_port_subcomponent or host, urlsplit(base).path.rstrip("/"),
            (host, f"[{host}]"), auth,
        )  # fmt: skip


UPSTREAM = web.AppKey("upstream", Upstream)


def _error_body(message: str, code: int, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def _connection_tokens(headers: Any) -> set[str]:
    # Fields named in Connection are hop-by-hop too (RFC 9110 7.6.1).
    return set(list_elements(headers.getall("Connection", [])))


def _forward_request_fields(request: web.Request, authorization: bytes | None) -> list[tuple[bytes, bytes]]:
    """The client's fields for the upstream, as the bytes it sent (aiohttp's ``raw_headers``: no decoding and
    encoding back), without the hop-by-hop ones; ``authorization`` (the upstream's credentials) for a request that
    brings none."""
    tokens = _connection_tokens(request.headers) if "Connection" in request.headers else None
    drop = _REQ_DROP_RAW | {t.encode("utf-8", "surrogateescape") for t in tokens} if tokens else _REQ_DROP_RAW
    out = [(k, v) for k, v in request.raw_headers if k.lower() not in drop]
    if authorization is not None and not any(k.lower() == b"authorization" for k, _ in out):
        out.append((b"Authorization", authorization))
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
    if own is not None:  # also in absolute form (RFC 9112 3.2.2): GET http://host/specproxy/status
        return await own(request, path)
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
        body = _arrived_body(request, cfg.max_body_bytes)
        if body is None:
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


def _arrived_body(request: web.Request, limit: int) -> Body | None:
    """The body when all of it came with the head (a small request: the usual case), taken as :func:`read_body`
    would take it but without arming its idle timer, which was a tenth of the handler's time under a burst of new
    streams; None when some of it is still to come, or it is over ``limit`` (:func:`read_body` then answers)."""
    content = request.content
    if not request.body_exists:
        return None if declared_too_large(request, limit) else Body()
    if not content.is_eof() or content.total_bytes > limit or declared_too_large(request, limit):
        return None
    return Body([content.read_nowait()])


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


async def _relay(
    request: web.Request, cfg: ProxyConfig, target: str, body: Body, relayed: Relayed
) -> tuple[web.StreamResponse, str, str | None]:
    up = request.app[UPSTREAM]
    fields = _forward_request_fields(request, up.authorization_field)
    head = request_head(request.method, up.prefix + target, up.authority, fields, body.size)

    def resending(why: str) -> None:
        relayed.retried = why

    try:
        ex = await request.app[POOL].request(request.method, head, body.pieces() if body.size else [], resending)
    except UpstreamError as e:
        reason = _safe(request, str(e))
        if relayed.retried:
            reason += " (sent twice: the first on a reused connection that failed before any answer)"
        if e.kind in ("connect_timeout", "head_timeout"):
            return _json_error(504, reason, "GatewayTimeout", relayed.request_id), "timeout", reason
        return _json_error(502, reason, "BadGateway", relayed.request_id), "upstream_error", reason
    try:
        return await _relay_body(request, ex, relayed)
    finally:
        ex.abort()  # cut one still streaming (client gone, relay failed): the engine aborts it; else nothing


async def _relay_body(
    request: web.Request, ex: Exchange, relayed: Relayed
) -> tuple[web.StreamResponse, str, str | None]:
    link = request.app[LINK]
    head = await ex.head()
    content_type = _first(head, "Content-Type")
    link.head(relayed, head.status, content_type, _first(head, "Content-Encoding"))
    resp = web.StreamResponse(status=head.status, reason=head.reason or None)
    connection = head.tokens("Connection")  # fields named in it are hop-by-hop too (RFC 9110 7.6.1)
    drop = _RESP_DROP.union(connection) if connection else _RESP_DROP
    for k, v in head.fields:
        if k.lower() not in drop:
            resp.headers.add(k, v)
    resp.headers[REQUEST_ID_HEADER] = relayed.request_id
    if content_type and content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
        resp.headers["X-Accel-Buffering"] = "no"
        if "Cache-Control" not in resp.headers:
            resp.headers["Cache-Control"] = "no-cache"
    length = _first(head, "Content-Length")
    if length is not None and not head.values("Transfer-Encoding") and length.isascii() and length.isdigit():
        resp.content_length = int(length)  # the exact bytes are relayed undecoded: still true (HEAD: as sent)
    await resp.prepare(request)
    outcome, error = "ok", None
    if head.status >= 400:
        outcome, error = "upstream_error", f"HTTP {head.status}"
    transport = request.transport
    if transport is None:
        return resp, "client_cancelled", "client disconnected"
    try:
        chunked = resp.headers.get("Transfer-Encoding") == "chunked"  # set by aiohttp's prepare, as it frames it
        await ex.relay(client_sink(transport, chunked, link, relayed), request.writer.drain)
    except ConnectionResetError:
        return resp, "client_cancelled", "client disconnected"
    if ex.outcome != "ok":  # the upstream broke mid-response or went quiet: the client must see the break
        _abort_client(request)
        return resp, ex.outcome, _safe(request, ex.error or ex.outcome)
    try:
        await resp.write_eof()
    except ConnectionResetError:
        return resp, "client_cancelled", "client disconnected"
    return resp, outcome, error


def _first(head: Head, name: str) -> str | None:
    values = head.values(name)
    return values[0] if values else None


def client_sink(transport: Any, chunked: bool, link: EventLink, relayed: Relayed) -> Sink:
    """What the upstream connection does with each read of a reply's body, in its own callback: the bytes to the
    client first (framed as the client's response is), then the event to the bookkeeping; True when the client's
    buffer is full."""
    high = transport.get_write_buffer_limits()[1]
    perf = time.perf_counter_ns
    chunk = link.chunk

    def sink(t: int, data: bytes) -> bool:
        if transport.is_closing():
            return False  # the client left: its handler is being cancelled, which cuts the upstream
        if not chunked:
            transport.write(data)
        elif len(data) < 16384:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        b = perf()
        try:
            chunk(relayed, t, data)  # appends an event, or sheds it: never waits
        except Exception:  # a bug of ours: the stream goes on, the record says its events are incomplete
            log.exception("appending a chunk event failed")
            relayed.shed = True
        # what recording adds to relaying this read (the write itself is what any proxy pays)
        ns = perf() - b
        relayed.ov_ns += ns
        relayed.ov_n += 1
        if ns > relayed.ov_max:
            relayed.ov_max = ns
        return bool(transport.get_write_buffer_size() > high)

    return sink


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


async def own_endpoint(request: web.Request, path: str) -> web.Response:
    """The bookkeeper's answer, which describes the whole proxy (every relay), whichever relay is asked."""
    status, content_type, body = await request.app[LINK].query(path)
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


# The proxy's own endpoints, answered for GET and HEAD on their exact raw path (in origin or absolute form, with
# any query); any other spelling of them (/v1/../specproxy/status, /specproxy/%73tatus) is a path like any other and
# goes to the upstream as sent.
_OWN = {"/specproxy/metrics": own_endpoint, "/specproxy/status": own_endpoint}


def build_app(cfg: ProxyConfig, channel: socket.socket | None = None) -> web.Application:
    """The relay. ``channel``: a connected Unix socket to a bookkeeper process; None: a bookkeeper on this loop,
    fed through the same events (library use, tests)."""
    quiet_bad_requests()  # a malformed request line is logged in one line, without its bytes (API keys in queries)
    app = web.Application(client_max_size=cfg.max_body_bytes, handler_args={"max_field_size": 65536})
    app[CONFIG] = cfg
    app[UPSTREAM] = Upstream.parse(cfg.upstream, cfg.upstream_authorization)
    app[IN_FLIGHT] = InFlight()
    app[LINK] = link = EventLink(
        soft_bytes=cfg.bookkeeping_buffer_bytes,
        hard_bytes=2 * cfg.bookkeeping_buffer_bytes,
        capture_max_bytes=cfg.recorder.capture_max_bytes,
        header_names=header_names((r.header_name for r in cfg.rules if r.header_name), trace=cfg.otlp is not None),
    )

    async def resources(app: web.Application) -> Any:
        session = upstream_session(cfg)
        app[SESSION] = session
        up = app[UPSTREAM]
        app[POOL] = pool = Pool(
            up.scheme, up.host, up.port, connect_timeout_s=cfg.connect_timeout_s, idle_timeout_s=cfg.idle_timeout_s,
            limit=cfg.max_connections,
        )  # fmt: skip
        keeper: Bookkeeper | None = None
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
            await link.close()
            if keeper is not None:
                await keeper.close()
            await session.close()
            await pool.close()

    app.cleanup_ctx.append(resources)
    # One route for every method and path: the routing is handle's, on the raw target. [\s\S], not ".", because
    # the router matches the decoded path, where %0A is a line break.
    app.router.add_route("*", r"/{tail:[\s\S]*}", handle, expect_handler=_expect)
    return app


def upstream_session(cfg: ProxyConfig) -> aiohttp.ClientSession:
    """The bookkeeping's client session to the upstream (its /metrics, its model list): no connection cap, no total
    timeout, bytes as sent, idle connections closed before the engine closes them. Relayed requests go through the
    relay's own :class:`~specproxy.proxy.upstream.Pool`."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=CLIENT_KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s, sock_read=cfg.idle_timeout_s)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        headers=_bookkeeping_authorization(cfg),
    )


def _bookkeeping_authorization(cfg: ProxyConfig) -> dict[str, str] | None:
    """The upstream's credentials (``--upstream-credentials-file``, ``$SPECPROXY_UPSTREAM_CREDENTIALS``) for the
    bookkeeping's own requests, as a URL's user:password goes with them: only when every one of them is for the
    upstream's origin (a --metrics-url elsewhere gets none of them) and carries no credentials of its own."""
    if cfg.upstream_authorization is None:
        return None
    origin = URL(cfg.upstream).origin()
    rc = cfg.recorder
    for u in (rc.metrics_url, rc.tokenize_url, rc.probe_url):
        if u is not None and (URL(u).user is not None or URL(u).origin() != origin):
            return None
    return {"Authorization": cfg.upstream_authorization}


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
