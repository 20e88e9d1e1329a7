"""The simulator's routes for the other dialects (:mod:`specproxy.sim.dialect_apis`), the engine it poses as
(``--dialect``: its ``/metrics`` names, its ``Server`` header, the paths a client probes to tell engines apart),
and ``/metrics`` in SGLang's and llama.cpp's names, computed from the same counts as vLLM's.

A client that goes away cancels its handler, whose ``finally`` aborts the request in the engine, as in
:mod:`specproxy.sim.server`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from specproxy.sim.dialect_apis import PATHS, llamacpp_timings, make_api
from specproxy.sim.dialects import Api, Ctx, translate
from specproxy.sim.records import RequestTruth, StepOutput
from specproxy.sim.runtime import OutputQueue, SimRuntime
from specproxy.sim.wire import ApiError, StreamFormatter, parse_request

RuntimeOf = Callable[[web.Request], SimRuntime]


def add_dialect_routes(app: web.Application, runtime_of: RuntimeOf, dialect: str) -> None:
    for path, api in PATHS.items():
        app.router.add_post(path, _handler(runtime_of, api))
    probe = PROBE_ANSWERS.get(dialect)
    if probe is not None:
        path, body = probe
        app.router.add_get(path, _probe(body))
    if dialect == "llamacpp":
        app.on_response_prepare.append(_llamacpp_server_header)


async def _llamacpp_server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "llama.cpp"  # tools/server: set_default_headers({{"Server", "llama.cpp"}})


# What each engine answers at the path a client probes (the shapes the engines return, abridged).
PROBE_ANSWERS: dict[str, tuple[str, dict[str, object]]] = {
    "ollama": ("/api/version", {"version": "0.12.0"}),
    "llamacpp": ("/props", {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1, "build_info": "sim"}),
    "sglang": ("/get_server_info", {"model_path": "sim-model", "tp_size": 1, "version": "0.5.0"}),
    "vllm": ("/version", {"version": "0.32.0"}),
}


def _probe(body: dict[str, object]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    return handle


def _handler(runtime_of: RuntimeOf, name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        rt = runtime_of(request)
        api = make_api(name)
        try:
            kind, body, stream = translate(name, await request.read(), rt.cfg.served_model_name)
            parsed = parse_request(kind, body, rt.cfg, request.headers.get("X-Sim-Profile"))
        except ApiError as e:
            return web.Response(body=e.body(), status=e.status, content_type="application/json")
        req, queue = rt.create(parsed, api.id_prefix + secrets.token_hex(8), stream=stream)
        ctx = Ctx(req.id, rt.cfg.served_model_name, parsed.prompt_tokens, int(time.time()))
        k = rt.cfg.k
        try:
            rt.submit(req)
            if not stream:
                texts: list[str] = []
                while (out := await queue.get()) is not None:
                    texts.extend(out.texts)
                    if out.finish_reason is not None:
                        body = api.whole(ctx, req.truth, out.finish_reason, out.completion_tokens, "".join(texts), k)
                        return web.Response(body=body, content_type="application/json")
                return web.Response(status=503)
            return await _stream(request, api, ctx, queue, req.truth, k)
        finally:
            rt.finish(req, "abort")

    return handle


async def _stream(
    request: web.Request, api: Api, ctx: Ctx, queue: OutputQueue, truth: RequestTruth, k: int
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": api.content_type})
    try:
        await resp.prepare(request)
        head = api.head(ctx)
        if head:
            await resp.write(head)
        texts: list[str] = []
        while (out := await queue.get()) is not None:
            texts.extend(out.texts)
            ids = list(out.token_ids)
            if api.per_token:  # llama.cpp and Ollama send each token on its own, accepted drafts too
                base = out.completion_tokens - len(ids)
                for i, (text, tid) in enumerate(zip(out.texts, ids, strict=False)):
                    await resp.write(api.step(ctx, text, [tid], base + i + 1, None))
            elif ids:
                await resp.write(api.step(ctx, "".join(out.texts), ids, out.completion_tokens, out.finish_reason))
            if out.finish_reason is not None:
                await resp.write(api.tail(ctx, truth, out.finish_reason, out.completion_tokens, "".join(texts), k))
                await resp.write_eof()
                break
    except ConnectionResetError:
        pass
    return resp


PER_TOKEN_DIALECTS = ("ollama", "llamacpp")  # engines that stream one event per token


def openai_deltas(
    dialect: str, fmt: StreamFormatter, truth: RequestTruth, texts: list[str], ids: list[int], out: StepOutput
) -> list[bytes]:
    """The OpenAI stream's delta events for one step's output as ``dialect`` sends them: vLLM one event per step;
    llama.cpp and Ollama one per token (accepted drafts too), llama.cpp with ``timings`` on the final chunk."""
    events: list[bytes] = []
    if dialect in PER_TOKEN_DIALECTS:
        base = out.completion_tokens - len(ids)
        for i in range(len(ids) - 1):
            events.append(fmt.delta_event(texts[i], ids[i : i + 1], None, base + i + 1))
        texts, ids = texts[len(ids) - 1 :], ids[-1:]
    extra = None
    if out.finish_reason is not None and dialect == "llamacpp":
        ctx = Ctx(fmt.response_id, fmt.model, fmt.prompt_tokens, fmt.created)
        extra = {"timings": llamacpp_timings(ctx, truth, out.completion_tokens)}
    events.append(fmt.delta_event("".join(texts), ids, out.finish_reason, out.completion_tokens, extra))
    return events


def render_as(dialect: str, registry: CollectorRegistry, k: int) -> bytes:
    """``/metrics`` as SGLang or llama.cpp name it, from the vLLM-named counts in ``registry``.

    SGLang (python/sglang/srt/metrics/collector.py): counters ``sglang:prompt_tokens_total``,
    ``sglang:generation_tokens_total``, ``sglang:spec_verify_calls_total``; gauges ``sglang:num_running_reqs``,
    ``sglang:num_queue_reqs``, ``sglang:spec_accept_length``, ``sglang:spec_accept_rate`` (here over everything
    so far; the engine recomputes them every ``--decode-log-interval`` steps). Ollama serves none (404). llama.cpp:
    ``llamacpp:prompt_tokens_total``, ``llamacpp:tokens_predicted_total``, ``llamacpp:requests_processing``,
    ``llamacpp:requests_deferred`` and the ``llamacpp:spec_decode_*`` counters, without a model label."""
    sums: dict[str, float] = {}
    per_pos: dict[str, float] = {}
    for fam in registry.collect():
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            if "position" in s.labels:
                per_pos[s.labels["position"]] = per_pos.get(s.labels["position"], 0.0) + s.value
    drafts = sums.get("vllm:spec_decode_num_drafts_total", 0.0)
    draft_tokens = sums.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    accepted = sums.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    lines: list[str] = []

    def family(name: str, kind: str, value: float, labels: str = "") -> None:
        lines.append(f"# HELP {name} {name}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {value!r}")

    running = sums.get("vllm:num_requests_running", 0.0)
    waiting = sums.get("vllm:num_requests_waiting", 0.0)
    prompt = sums.get("vllm:prompt_tokens_total", 0.0)
    generated = sums.get("vllm:generation_tokens_total", 0.0)
    if dialect == "sglang":
        lab = '{model_name="sim-model"}'
        family("sglang:prompt_tokens_total", "counter", prompt, lab)
        family("sglang:generation_tokens_total", "counter", generated, lab)
        family("sglang:num_running_reqs", "gauge", running, lab)
        family("sglang:num_queue_reqs", "gauge", waiting, lab)
        if k > 0:
            family("sglang:spec_verify_calls_total", "counter", drafts, lab)
            family("sglang:spec_accept_length", "gauge", 1 + accepted / drafts if drafts else 1.0, lab)
            family("sglang:spec_accept_rate", "gauge", accepted / draft_tokens if draft_tokens else 0.0, lab)
            family("sglang:spec_num_draft_tokens", "gauge", float(k + 1), lab)
    elif dialect == "llamacpp":
        family("llamacpp:prompt_tokens_total", "counter", prompt)
        family("llamacpp:tokens_predicted_total", "counter", generated)
        family("llamacpp:requests_processing", "gauge", running)
        family("llamacpp:requests_deferred", "gauge", waiting)
        if k > 0:
            family("llamacpp:spec_decode_num_drafts_total", "counter", drafts)
            family("llamacpp:spec_decode_num_draft_tokens_total", "counter", draft_tokens)
            family("llamacpp:spec_decode_num_accepted_tokens_total", "counter", accepted)
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines.append(f"# TYPE {name} counter")
            for pos in sorted(per_pos, key=int):
                lines.append(f'{name}{{position="{pos}"}} {per_pos[pos]!r}')
    return ("\n".join(lines) + "\n").encode()
