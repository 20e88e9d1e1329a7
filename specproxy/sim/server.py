"""The simulator's HTTP face: an aiohttp app speaking vLLM 0.32's OpenAI API, /metrics and /sim/* truth.

Endpoints: /health, /v1/models, /v1/chat/completions, /v1/completions, /metrics, and for tests
GET /sim/requests, GET /sim/requests/{id}, GET /sim/truth, POST /sim/faults, POST /sim/reset-counters; the other
dialects' paths (/api/chat, /api/generate, /v1/messages, /v1/responses, /completion, /generate) are in
:mod:`specproxy.sim.dialect_routes`. With ``dialect`` llamacpp or ollama, OpenAI streams send one event per token.

A client that goes away (before headers, while queued, mid-stream) cancels its handler (aiohttp's
handler_cancellation), and the handler's `finally` aborts the request in the engine at once, as vLLM does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from specproxy.core.tokens import approx_token_count
from specproxy.serving import base_url, start_app
from specproxy.sim.config import METRICS_FAULTS, SimConfig
from specproxy.sim.dialect_routes import add_dialect_routes, openai_deltas, render_as
from specproxy.sim.engine import SimRequest
from specproxy.sim.faults import Faults, garbled, parse_faults
from specproxy.sim.metrics import CONTENT_TYPE
from specproxy.sim.runtime import OutputQueue, SimRuntime
from specproxy.sim.wire import (
    DONE,
    KEEPALIVE,
    ApiError,
    ParsedRequest,
    StreamFormatter,
    error_body,
    error_event,
    full_body,
    parse_request,
    request_metrics,
)

log = logging.getLogger(__name__)

RUNTIME = web.AppKey("runtime", SimRuntime)
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"


class _StreamStopped(Exception):
    """The stream ended early on purpose (a fault) or because the client left."""


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.Response(body=error_body(status, message, param), status=status, content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[RUNTIME].cfg
    name = cfg.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": name,
        "parent": None,
        "max_model_len": cfg.max_model_len,
        "permission": [
            {
                "id": f"modelperm-{secrets.token_hex(16)}",
                "object": "model_permission",
                "created": int(time.time()),
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return _json({"object": "list", "data": [card]})


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    header = request.headers.get("X-Sim-Fault")
    try:
        faults = parse_faults(header) if header is not None else rt.request_faults
        parsed = parse_request(kind, await request.read(), rt.cfg, request.headers.get("X-Sim-Profile"))
    except ApiError as e:
        return web.Response(body=e.body(), status=e.status, content_type="application/json")
    except ValueError as e:
        return _error(400, f"bad X-Sim-Fault header: {e}")
    if faults.status is not None:
        await asyncio.sleep(faults.stall_s)
        return _error(faults.status, f"Simulated failure (HTTP {faults.status})")
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    req, queue = rt.create(parsed, prefix + secrets.token_hex(8), stream=parsed.stream)
    try:
        if faults.stall_s:
            await asyncio.sleep(faults.stall_s)  # before the request reaches the engine and before any header
        rt.submit(req)
        fmt = StreamFormatter(
            kind=kind,
            response_id=req.id,
            created=int(time.time()),
            model=rt.cfg.served_model_name,
            prompt_tokens=parsed.prompt_tokens,
            continuous_usage=parsed.continuous_usage,
            return_token_ids=parsed.return_token_ids,
            cached_tokens=req.truth.cached_tokens if rt.cfg.prompt_tokens_details else None,
            # Ollama's OpenAI endpoint names itself this way on every chunk
            system_fingerprint="fp_ollama" if rt.cfg.dialect == "ollama" else rt.cfg.system_fingerprint,
        )
        if parsed.stream:
            return await _stream(request, rt, req, queue, parsed, fmt, faults)
        return await _whole(request, rt, req, queue, fmt, faults)
    finally:
        # Client gone (handler cancelled), a fault, or a normal end: a no-op unless still in the engine.
        rt.finish(req, "abort")


def _metrics_obj(rt: SimRuntime, req: SimRequest) -> dict[str, Any] | None:
    detail = rt.cfg.per_request_spec_metrics
    return request_metrics(req.truth, detail, rt.cfg.k) if detail else None


async def _whole(
    request: web.Request, rt: SimRuntime, req: SimRequest, queue: OutputQueue, fmt: StreamFormatter, faults: Faults
) -> web.StreamResponse:
    texts: list[str] = []
    ids: list[int] = []
    while True:
        out = await queue.get()
        if out is None:
            return _error(503, "The server is shutting down.")
        texts.extend(garbled(out.texts, out.accepted_counted, faults.garble, f"{req.id}/{out.completion_tokens}"))
        ids.extend(out.token_ids)
        if out.finish_reason is not None:
            break
    if faults.reset_after is not None and request.transport is not None:
        request.transport.abort()  # the client sees the connection drop instead of a body
        return web.Response(status=200)
    if faults.error_event_after is not None:
        return _error(500, "Simulated failure during generation")
    rt.remember_text("".join(texts), len(ids))
    body = full_body(fmt, "".join(texts), ids, out.finish_reason, _metrics_obj(rt, req))
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request,
    rt: SimRuntime,
    req: SimRequest,
    queue: OutputQueue,
    parsed: ParsedRequest,
    fmt: StreamFormatter,
    faults: Faults,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
    events = 0

    async def send(data: bytes) -> None:
        nonlocal events
        if faults.reset_after is not None and events >= faults.reset_after:
            if request.transport is not None:
                request.transport.abort()  # the client sees a reset: no terminating chunk, no [DONE]
            raise _StreamStopped
        if faults.error_event_after is not None and events >= faults.error_event_after:
            rt.finish(req, "error")
            await resp.write(error_event(500, "Simulated failure during generation") + DONE)
            await resp.write_eof()
            raise _StreamStopped
        await resp.write(data)
        events += 1

    keepalive_s = rt.cfg.keepalive_s
    interval = rt.cfg.stream_interval
    lag_s = rt.cfg.output_lag_ms / 1000 / rt.cfg.speed
    try:
        await resp.prepare(request)
        started = False
        texts: list[str] = []
        ids: list[int] = []
        whole: list[str] = []
        since_sent = 0
        while True:
            if keepalive_s is None:
                out = await queue.get()
            else:
                try:
                    async with asyncio.timeout(keepalive_s):
                        out = await queue.get()
                except TimeoutError:
                    await resp.write(KEEPALIVE)
                    continue
            if out is None:
                raise _StreamStopped  # server shutting down
            sent = garbled(out.texts, out.accepted_counted, faults.garble, f"{req.id}/{out.completion_tokens}")
            texts.extend(sent)
            whole.extend(sent)
            ids.extend(out.token_ids)
            since_sent += 1
            # vLLM's stream_interval: the first output and the last always go out at once.
            # A writer that was away (lag) finds several steps waiting: they go out as one chunk, as vLLM's do.
            if started and out.finish_reason is None and (since_sent < interval or (lag_s and not queue.empty())):
                continue
            if not started and fmt.kind == "chat":
                await send(fmt.role_event())
            started = True
            for event in openai_deltas(rt.cfg.dialect, fmt, req.truth, texts, ids, out):  # llama.cpp: per token
                await send(event)
            texts, ids, since_sent = [], [], 0
            if out.finish_reason is not None:
                break
            if lag_s:
                await asyncio.sleep(lag_s)
        rt.remember_text("".join(whole), out.completion_tokens)
        if parsed.include_usage:
            await send(fmt.usage_event(out.completion_tokens, _metrics_obj(rt, req)))
        await resp.write(DONE)
        await resp.write_eof()
    except (_StreamStopped, ConnectionResetError):
        pass  # the finally in _generate aborts the engine request if it is still running
    return resp


async def _metrics(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    if rt.metrics_fault == "fail":
        return web.Response(status=500, text="Simulated /metrics failure")
    if rt.metrics_fault == "hang":
        await rt.closing.wait()  # until the client gives up (handler cancelled) or the server stops
        return web.Response(status=503)
    body = rt.metrics.render() if rt.cfg.dialect == "vllm" else render_as(rt.cfg.dialect, rt.metrics.registry, rt.cfg.k)
    if rt.cfg.metrics_render_ms:  # the loop is held, as a render on the engine's API server holds its loop
        time.sleep(rt.cfg.metrics_render_ms / 1000)  # noqa: ASYNC251 (blocking is the point)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize``: ``{"prompt"}`` or ``{"messages"}`` -> ``{"count", "max_model_len", "tokens"}``. A text
    this simulator generated counts the tokens it was generated as; any other text, the approximate count."""
    rt = request.app[RUNTIME]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        return _error(400, f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        count = rt.generated.get(prompt)
        if count is None:
            count = approx_token_count(prompt) if prompt else 0
    elif "messages" in body:
        try:
            count = parse_request("chat", orjson.dumps({"messages": body["messages"]}), rt.cfg, None).prompt_tokens
        except ApiError as e:
            return web.Response(body=e.body(), status=e.status, content_type="application/json")
    else:
        return _error(400, "Field required: prompt (a string) or messages")
    model = body.get("model")
    if model is not None and model != rt.cfg.served_model_name:
        return _error(404, f"The model `{model}` does not exist.")
    if count > rt.cfg.max_model_len:
        limit = rt.cfg.max_model_len
        return _error(400, f"This model's maximum context length is {limit} tokens; the text has {count}.")
    tokens = list(range(count))
    return _json({"count": count, "max_model_len": rt.cfg.max_model_len, "tokens": tokens, "token_strs": None})


async def _sim_faults(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        return _error(400, "body must be JSON")
    if not isinstance(body, dict):
        return _error(400, 'body must be a JSON object like {"metrics": "fail"}')
    metrics = body.get("metrics", rt.metrics_fault)
    if metrics not in METRICS_FAULTS:
        return _error(400, f"metrics must be one of {', '.join(METRICS_FAULTS)}")
    spec = body.get("request", rt.request_faults_spec)
    if not isinstance(spec, str):
        return _error(400, 'request must be a fault string like "status=503"')
    try:
        faults = parse_faults(spec)
    except ValueError as e:
        return _error(400, str(e))
    rt.metrics_fault, rt.request_faults_spec, rt.request_faults = metrics, spec, faults
    return _json({"metrics": metrics, "request": spec})


async def _sim_reset(request: web.Request) -> web.Response:
    request.app[RUNTIME].reset_counters()
    return _json({"reset": True})


async def _sim_requests(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return _json({"requests": [t.summary() for t in rt.truth.values()]})


async def _sim_request(request: web.Request) -> web.Response:
    truth = request.app[RUNTIME].truth.get(request.match_info["rid"])
    if truth is None:
        return _error(404, f"no request {request.match_info['rid']!r} (unknown or dropped from the truth store)")
    return _json(truth.as_json())


async def _sim_truth(request: web.Request) -> web.Response:
    return _json(request.app[RUNTIME].totals_json())


def build_app(rt: SimRuntime) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[RUNTIME] = rt
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/sim/faults", _sim_faults)
    app.router.add_post("/sim/reset-counters", _sim_reset)
    app.router.add_get("/sim/requests", _sim_requests)
    app.router.add_get("/sim/requests/{rid}", _sim_request)
    app.router.add_get("/sim/truth", _sim_truth)
    add_dialect_routes(app, lambda request: request.app[RUNTIME], rt.cfg.dialect)
    return app


@dataclass(slots=True)
class SimHandle:
    """A running simulator: `url` to talk to it, `state` for ground truth, `close()` to stop it."""

    url: str
    app: web.Application
    state: SimRuntime
    _runner: web.AppRunner

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def close(self) -> None:
        await self.state.stop()
        await self._runner.cleanup()


async def start_sim(cfg: SimConfig) -> SimHandle:
    """Start a simulator on cfg.host:cfg.port (0 = a free port) in the running event loop."""

    cfg.validate()
    rt = SimRuntime(cfg)
    app = build_app(rt)
    runner = await start_app(app, cfg.host, cfg.port, shutdown_timeout=1.0, handler_cancellation=True)
    rt.start()
    return SimHandle(url=base_url(runner), app=app, state=rt, _runner=runner)


async def serve(
    cfg: SimConfig,
    *,
    ready: asyncio.Event | None = None,
    on_listening: Callable[[SimHandle], None] | None = None,
) -> None:
    """Serve until cancelled. Once listening: logs the URL at INFO, calls `on_listening`, sets `ready`."""
    handle = await start_sim(cfg)
    try:
        log.info("specproxy sim listening on %s (model %s)", handle.url, cfg.served_model_name)
        if on_listening is not None:
            on_listening(handle)
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await handle.close()
