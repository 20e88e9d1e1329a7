"""The relay: every method and path forwarded, bodies byte-identical, streams relayed read by read.

aiohttp details that matter here (engine-facts.md, "Proxying pitfalls"): the client session does not decompress
(``auto_decompress=False``) so Content-Encoding and Content-Length stay true to the bytes sent; no total timeout
(long generations), connect and idle-read timeouts instead; no connection cap by default; upstream bodies read with
``iter_any()`` (lines of any length). The server runs with handler cancellation on, so a client that disconnects
cancels its handler at once, which closes the upstream connection: vLLM then aborts the request and frees the GPU,
also during prefill before the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specproxy.core.headers import REQUEST_ID_HEADER, WORKLOAD_HEADER
from specproxy.core.workload_rules import WorkloadResolver, last_user_message
from specproxy.proxy.config import ProxyConfig
from specproxy.recorder.recorder import Recorder
from specproxy.recorder.trace import RequestMeta, Trace
from specproxy.serving import base_url, bound_ports, start_app, stop_signals

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
RECORDER = web.AppKey("recorder", Recorder)
SESSION = web.AppKey("session", aiohttp.ClientSession)
RESOLVER = web.AppKey("resolver", WorkloadResolver)


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


async def handle(request: web.Request) -> web.StreamResponse:
    cfg = request.app[CONFIG]
    recorder = request.app[RECORDER]
    if cfg.fail_closed and not recorder.sink.healthy:
        return web.Response(
            status=503,
            body=_error_body("specproxy cannot write records (--fail-closed)", 503, "ServiceUnavailable"),
            content_type="application/json",
        )
    body = await request.read()  # bounded by client_max_size: larger bodies get 413 from aiohttp
    parsed: Any = None
    if body and body[:1] in (b"{", b"[", b" ", b"\n", b"\r", b"\t"):
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(body)
    model = parsed.get("model") if isinstance(parsed, dict) and isinstance(parsed.get("model"), str) else None
    stream_req = bool(parsed.get("stream")) if isinstance(parsed, dict) else False
    resolver = request.app[RESOLVER]
    headers_lower = {k.lower(): v for k, v in request.headers.items()}
    message = last_user_message(parsed if isinstance(parsed, dict) else None) if resolver.needs_message else None
    workload = resolver.resolve(request.headers.get(WORKLOAD_HEADER), request.path, model, headers_lower, message)
    meta = RequestMeta(
        method=request.method,
        path=request.path,
        workload=workload,
        model=model,
        body=parsed if parsed is not None else (body.decode("utf-8", "replace") if body else None),
        stream_requested=stream_req,
    )
    trace = recorder.begin(meta)
    outcome: str = "proxy_error"
    error: str | None = "unfinished"
    try:
        resp, outcome, error = await _relay(request, cfg, body, trace)
        return resp
    except asyncio.CancelledError:
        outcome, error = "client_cancelled", "client disconnected"
        raise
    except Exception as e:  # never let our own failure pass silently: record it, answer 502 if we still can
        log.exception("relay failed")
        outcome, error = "proxy_error", f"{type(e).__name__}: {e}"
        raise
    finally:
        recorder.finish(trace, outcome, error)


async def _relay(
    request: web.Request, cfg: ProxyConfig, body: bytes, trace: Trace
) -> tuple[web.StreamResponse, str, str | None]:
    session = request.app[SESSION]
    url = cfg.upstream.rstrip("/") + request.rel_url.raw_path_qs
    rid = trace.meta.request_id
    try:
        upstream = await session.request(
            request.method,
            url,
            headers=_forward_request_headers(request),
            # large bodies as a file object: aiohttp warns that raw bytes over 1 MiB may block the loop
            data=(io.BytesIO(body) if len(body) > 1024 * 1024 else body) if body else None,
            allow_redirects=False,
        )
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        reason = f"upstream unreachable: {e}"
        return _json_error(502, reason, "BadGateway", rid), "upstream_error", reason
    except TimeoutError:
        reason = f"upstream did not answer within {cfg.connect_timeout_s:g} s"
        return _json_error(504, reason, "GatewayTimeout", rid), "timeout", reason
    except aiohttp.ClientError as e:
        reason = f"upstream error: {e}"
        return _json_error(502, reason, "BadGateway", rid), "upstream_error", reason
    finished = False
    try:
        result = await _relay_body(request, upstream, trace)
        finished = result[1] == "ok" or result[1] == "upstream_error"
        return result
    finally:
        if finished and upstream.content.at_eof():
            upstream.release()  # read to the end: the connection goes back to the pool (no new handshake)
        else:
            upstream.close()  # cut one still streaming (client gone, upstream broke): the engine aborts it


async def _relay_body(
    request: web.Request, upstream: aiohttp.ClientResponse, trace: Trace
) -> tuple[web.StreamResponse, str, str | None]:
    content_type = upstream.headers.get("Content-Type")
    trace.response_started(upstream.status, content_type, upstream.headers.get("Content-Encoding"))
    resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    drop = _RESP_DROP | _connection_tokens(upstream.headers)
    for k, v in upstream.headers.items():
        if k.lower() not in drop:
            resp.headers.add(k, v)
    resp.headers[REQUEST_ID_HEADER] = trace.meta.request_id
    is_sse = trace.timeline is not None and trace.timeline.stream
    if is_sse:
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
    try:
        async for data in upstream.content.iter_any():
            t = perf()
            await resp.write(data)  # the bytes go out first; the bookkeeping follows
            b = perf()
            try:
                trace.feed(t, data)
            except Exception:  # bookkeeping must never break the client's stream
                log.exception("recording a chunk failed")
            # what recording adds to relaying this read (the write itself is what any proxy pays, and may wait for
            # a slow client)
            trace.add_overhead(perf() - b)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        # The upstream broke mid-response: end the client's stream without a clean finish, so it sees the break.
        _abort_client(request)
        return resp, "upstream_reset", f"upstream connection broke mid-response: {e}"
    except TimeoutError:
        _abort_client(request)
        return resp, "timeout", "upstream idle-read timeout"
    except ConnectionResetError:
        return resp, "client_cancelled", "client disconnected"
    try:
        await resp.write_eof()
    except ConnectionResetError:
        return resp, "client_cancelled", "client disconnected"
    return resp, outcome, error


def _abort_client(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _json_error(status: int, message: str, kind: str, rid: str) -> web.Response:
    return web.Response(
        status=status,
        body=_error_body(message, status, kind),
        content_type="application/json",
        headers={REQUEST_ID_HEADER: rid},
    )


async def own_metrics(request: web.Request) -> web.Response:
    registry = request.app[RECORDER].metrics.registry
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def own_status(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(request.app[RECORDER].status()), content_type="application/json")


def build_app(cfg: ProxyConfig) -> web.Application:
    app = web.Application(client_max_size=cfg.max_body_bytes, handler_args={"max_field_size": 65536})
    app[CONFIG] = cfg
    app[RESOLVER] = WorkloadResolver(cfg.rules)

    async def resources(app: web.Application) -> Any:
        connector = aiohttp.TCPConnector(limit=cfg.max_connections, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s, sock_read=cfg.idle_timeout_s)
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
        )
        recorder = Recorder(cfg.recorder, session)
        app[SESSION] = session
        app[RECORDER] = recorder
        await recorder.start()
        yield
        await recorder.close()
        await session.close()

    app.cleanup_ctx.append(resources)
    app.router.add_get("/specproxy/metrics", own_metrics)
    app.router.add_get("/specproxy/status", own_status)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@dataclass(slots=True)
class ProxyHandle:
    """A proxy listening in this event loop: ``url``, its ``recorder``, and ``close()`` (drains, writes records)."""

    url: str
    runner: web.AppRunner

    @property
    def recorder(self) -> Recorder:
        return self.runner.app[RECORDER]

    async def close(self) -> None:
        await self.runner.cleanup()  # stops listening, drains in-flight handlers, then writes every record


async def start_proxy(cfg: ProxyConfig) -> ProxyHandle:
    runner = await start_app(
        build_app(cfg),
        cfg.host,
        cfg.port,
        shutdown_timeout=cfg.drain_timeout_s,
        handler_cancellation=True,
        reuse_address=True,  # a restarted proxy takes its port back at once, despite connections in TIME_WAIT
    )
    return ProxyHandle(base_url(runner), runner)


async def serve(cfg: ProxyConfig, *, ready: asyncio.Event | None = None, bound: list[int] | None = None) -> None:
    """Serve until SIGTERM / SIGINT (or cancellation); then stop accepting, let in-flight requests finish up to
    ``drain_timeout_s``, and write every record."""
    handle = await start_proxy(cfg)
    if bound is not None:
        bound.extend(bound_ports(handle.runner))
    stop = asyncio.Event()
    try:
        with stop_signals(lambda _signum: stop.set()):
            if ready is not None:
                ready.set()
            await stop.wait()
    finally:
        await handle.close()
