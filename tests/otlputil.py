"""An OTLP/HTTP trace receiver for the tests: a real aiohttp server on port 0 that decodes each export with
opentelemetry-proto's generated classes, as a collector would; it can also refuse, or hang."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def json_to_message(body: bytes, msg: ExportTraceServiceRequest) -> None:
    """OTLP/JSON into the message: its ids are hex where protobuf's own JSON mapping has base64 (the spec's one
    difference, which collectors undo the same way)."""
    doc = orjson.loads(body)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    json_format.ParseDict(doc, msg)


def value_of(v: AnyValue) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(x) for x in v.array_value.values)
    return getattr(v, kind)


def attributes(span: Span) -> dict[str, object]:
    return {kv.key: value_of(kv.value) for kv in span.attributes}


class Receiver:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode  # ok | hang | refuse
        self.spans: list[Span] = []
        self.resources: list[dict[str, object]] = []
        self.posts: list[dict[str, str]] = []  # each export's request headers
        self.arrived = asyncio.Condition()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.posts.append(dict(request.headers))
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "refuse":
            return web.Response(status=503)
        msg = ExportTraceServiceRequest()
        if request.content_type == "application/json":
            json_to_message(body, msg)
        else:
            msg.ParseFromString(body)
        async with self.arrived:
            for rs in msg.resource_spans:
                self.resources.append({kv.key: value_of(kv.value) for kv in rs.resource.attributes})
                for ss in rs.scope_spans:
                    self.spans.extend(ss.spans)
            self.arrived.notify_all()
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type=request.content_type)

    async def wait_spans(self, n: int, within_s: float = 20.0) -> list[Span]:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.spans) >= n), within_s)
        return self.spans


@asynccontextmanager
async def receiver(mode: str = "ok") -> AsyncIterator[Receiver]:
    r = Receiver(mode)
    app = web.Application()
    app.router.add_post("/v1/traces", r.handle)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    r.url = f"http://127.0.0.1:{port}"
    try:
        yield r
    finally:
        await runner.cleanup()
