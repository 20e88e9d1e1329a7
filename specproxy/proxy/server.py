"""The relay's aiohttp front door, and the relay process: its app, its resources, its start and its stop.

aiohttp serves the clients the fast lane (:mod:`specproxy.proxy.frontdoor`) hands it: every request but the plainly
formed POST or GET, which the fast lane relays (or, for the proxy's own endpoints, answers) itself. Either way a
request goes through :func:`specproxy.proxy.relay.relay_request` (target, fields, upstream, stream, outcome); here is
what aiohttp's side of it needs (:class:`_AiohttpFront`) and what only aiohttp's side does: chunked bodies, bodies
over 1 MiB, ``Expect: 100-continue``, HEAD, absolute-form targets, malformed requests. A body over
``--max-body`` is refused before it is read, a body that stops coming gets 408, a head that never completes is
closed (:mod:`specproxy.serving`).

Bodies are relayed undecoded, so Content-Encoding and Content-Length stay true to the bytes sent; no total timeout
(long generations), connect and idle-read timeouts instead; no connection cap by default. The server runs with
handler cancellation on, so a client that disconnects cancels its handler at once, which closes the upstream
connection: vLLM then aborts the request and frees the GPU, also during prefill before the first byte.
:meth:`ProxyHandle.close` stops in two steps; streams it cuts are recorded with outcome ``shutdown``.

The bookkeeping runs in another process (``--workers``) or on this loop (:func:`start_proxy` without a channel).
The own endpoints are the bookkeeper's answers.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from specproxy.core.errors import one_line
from specproxy.core.headers import CLIENT_KEEPALIVE_S, REQUEST_ID_HEADER
from specproxy.core.request_body import Body
from specproxy.core.urls import origin_form, target_path
from specproxy.proxy.bookkeeper import Bookkeeper
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.frontdoor import FastLane
from specproxy.proxy.http1 import list_elements
from specproxy.proxy.link import EventLink, header_names
from specproxy.proxy.relay import CLOSED_BODY, OWN_PATHS, Relay, Upstream, error_body, forward_fields, relay_request
from specproxy.proxy.upstream import Pool
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
    read_body,
    start_app,
    stop_in_two_steps,
)

log = logging.getLogger("specproxy.proxy")

CONFIG = web.AppKey("config", ProxyConfig)
RECORDER = web.AppKey("recorder", Recorder)  # only with the bookkeeper on this loop (library use, tests)
BOOKKEEPER = web.AppKey("bookkeeper", Bookkeeper)
LINK = web.AppKey("link", EventLink)
SESSION = web.AppKey("session", aiohttp.ClientSession)
POOL = web.AppKey("pool", Pool)  # the relay's own connections to the upstream
IN_FLIGHT = web.AppKey("in_flight", InFlight)
UPSTREAM = web.AppKey("upstream", Upstream)
RELAY = web.AppKey("relay", Relay)


class _AiohttpFront:
    """A request as aiohttp's server took it, as :func:`specproxy.proxy.relay.relay_request` needs it; ``response``:
    what the handler returns to aiohttp."""

    __slots__ = ("_request", "_resp", "chunked", "method", "response")

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.method = request.method
        self.response: web.StreamResponse | None = None
        self._resp: web.StreamResponse | None = None
        self.chunked = False

    def get(self, name: str) -> str | None:
        return self._request.headers.get(name)

    def forward_fields(self, authorization: bytes | None) -> list[tuple[bytes, bytes]]:
        headers = self._request.headers
        tokens = list_elements(headers.getall("Connection", [])) if "Connection" in headers else []
        return forward_fields(self._request.raw_headers, tokens, authorization)

    def answer(self, status: int, body: bytes, rid: str | None) -> None:
        self.response = _json_answer(status, body, rid)

    async def start(self, status: int, reason: str, fields: list[tuple[str, str]], length: int | None) -> Any:
        self.response = resp = web.StreamResponse(status=status, reason=reason or None)
        resp.headers.extend(fields)
        if length is not None:
            resp.content_length = length
        await resp.prepare(self._request)
        self._resp = resp
        self.chunked = resp.headers.get("Transfer-Encoding") == "chunked"  # set by aiohttp's prepare, as it frames it
        return self._request.transport

    async def drain(self) -> None:
        await self._request.writer.drain()

    async def end(self) -> None:
        assert self._resp is not None
        await self._resp.write_eof()

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.abort()


async def handle(request: web.Request) -> web.StreamResponse:
    target = origin_form(request.raw_path)
    if target is None:
        return _json_error(400, "the request target must be a path", "BadRequest")
    path = target_path(target)
    if path in OWN_PATHS and request.method in ("GET", "HEAD"):  # also in absolute form (RFC 9112 3.2.2)
        return await own_endpoint(request, path)
    in_flight = request.app[IN_FLIGHT]
    task = in_flight.enter()
    try:
        return await _proxy(request, target, path)
    finally:
        in_flight.leave(task)


async def _proxy(request: web.Request, target: str, path: str) -> web.StreamResponse:
    r = request.app[RELAY]
    if r.closed:
        return _json_answer(503, CLOSED_BODY, None)
    cfg = r.cfg
    try:
        body = _arrived_body(request, cfg.max_body_bytes)
        if body is None:
            body = await read_body(request, limit=cfg.max_body_bytes, idle_s=cfg.client_body_timeout_s)
    except Refused as refused:  # turned away before forwarding (413, 408): no upstream request, no record
        r.link.refused(refused.status)
        answer = _refusal(request, refused)
        return await close_after(request, answer) if refused.close_now else answer
    front = _AiohttpFront(request)
    await relay_request(front, r, target, path, body)
    assert front.response is not None
    return front.response


def _arrived_body(request: web.Request, limit: int) -> Body | None:
    """The body when all of it came with the head (a small request: the usual case), taken as :func:`read_body`
    would take it but without arming its idle timer, a large share of the handler's time under a burst of new
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


def _json_answer(status: int, body: bytes, rid: str | None) -> web.Response:
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        headers={REQUEST_ID_HEADER: rid} if rid is not None else None,
    )


def _json_error(status: int, message: str, kind: str, rid: str | None = None) -> web.Response:
    return _json_answer(status, error_body(message, status, kind), rid)


async def own_endpoint(request: web.Request, path: str) -> web.Response:
    """The bookkeeper's answer, which describes the whole proxy (every relay), whichever relay is asked."""
    status, content_type, body = await request.app[LINK].query(path)
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


def build_app(cfg: ProxyConfig, channel: socket.socket | None = None) -> web.Application:
    """The relay. ``channel``: a connected Unix socket to a bookkeeper process; None: a bookkeeper on this loop,
    fed through the same events (library use, tests)."""
    quiet_bad_requests()  # a malformed request line is logged in one line, without its bytes (API keys in queries)
    app = web.Application(client_max_size=cfg.max_body_bytes, handler_args={"max_field_size": 65536})
    app[CONFIG] = cfg
    app[UPSTREAM] = Upstream.parse(cfg.upstream, cfg.upstream_authorization)
    app[IN_FLIGHT] = in_flight = InFlight()
    app[LINK] = link = EventLink(
        soft_bytes=cfg.bookkeeping_buffer_bytes,
        hard_bytes=2 * cfg.bookkeeping_buffer_bytes,
        capture_max_bytes=cfg.recorder.capture_max_bytes,
        header_names=header_names((r.header_name for r in cfg.rules if r.header_name), trace=cfg.otlp is not None),
    )
    app[RELAY] = relay = Relay(cfg, app[UPSTREAM], link, in_flight)

    async def resources(app: web.Application) -> Any:
        session = upstream_session(cfg)
        app[SESSION] = session
        up = app[UPSTREAM]
        app[POOL] = pool = Pool(
            up.scheme,
            up.host,
            up.port,
            connect_timeout_s=cfg.connect_timeout_s,
            idle_timeout_s=cfg.idle_timeout_s,
            limit=cfg.max_connections,
        )
        relay.pool = pool
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
    app = build_app(cfg, channel)
    runner = await start_app(
        app,
        cfg.host,
        cfg.port,
        shutdown_timeout=1.0,  # aiohttp's own wait, for stragglers only: ProxyHandle.close has drained and cut
        handler_cancellation=True,
        reuse_address=True,  # a restarted proxy takes its port back at once, despite connections in TIME_WAIT
        client_header_timeout=cfg.client_header_timeout_s,
        reuse_port=reuse_port or None,
        door=FastLane(app[RELAY]) if cfg.fast_lane else None,
    )
    return ProxyHandle(base_url(runner), runner)
