"""The proxy's span export end to end: the simulator behind the proxy, a real OTLP/HTTP receiver in the test
(tests/otlputil.py), streamed chat completions with and without a W3C traceparent. The span is the record's, a
child of the client's span; the engine gets the trace headers unchanged; a receiver that is down or hangs changes
nothing for the client nor the record file, and is counted."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from otlputil import attributes, receiver
from proxyutil import proxy_process, running_proxy
from simutil import chat_body, client, post_sse, running_sim

from specproxy.core.record import read_records
from specproxy.recorder.config import OtlpConfig

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


class Tap:
    """An upstream in front of the simulator that keeps each request's headers, as the engine received them."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.seen: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            self.seen.append(dict(request.headers))
        body = await request.read()
        async with (
            aiohttp.ClientSession() as s,
            s.request(
                request.method, self.target + request.path_qs, data=body, headers={"Content-Type": "application/json"}
            ) as up,
        ):
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            return resp


@asynccontextmanager
async def tapped(target: str) -> AsyncIterator[Tap]:
    tap = Tap(target)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", tap.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    tap.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    try:
        yield tap
    finally:
        await runner.cleanup()


def otlp(url: str, **over: object) -> OtlpConfig:
    return OtlpConfig(
        traces_url=url + "/v1/traces",
        headers=(("api-key", "s3cret-key"),),
        interval_s=0.05,
        server_address="127.0.0.1",
        server_port=1,
        **over,  # type: ignore[arg-type]
    )


def _by_rid(spans: list[Span]) -> dict[str, Span]:
    return {s.span_id.hex(): s for s in spans}


async def test_a_streamed_request_becomes_a_child_span_of_the_clients_traceparent(tmp_path: Path) -> None:
    async with running_sim() as sim, tapped(sim.url) as tap, receiver() as rx:
        cfg = otlp(rx.url)
        async with running_proxy(tap.url, tmp_path, otlp=cfg, rec_metrics_url=sim.url + "/metrics") as proxy:
            async with client() as session:
                headers = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
                status, sse = await post_sse(session, proxy.url + "/v1/chat/completions", chat_body(), headers=headers)
                assert status == 200 and sse.data[-1] == "[DONE]"
                status, _ = await post_sse(session, proxy.url + "/v1/chat/completions", chat_body(max_tokens=8))
                assert status == 200
                spans = await rx.wait_spans(2)
                async with session.get(proxy.url + "/specproxy/status") as r:
                    st = (await r.json())["otlp"]
                async with session.get(proxy.url + "/specproxy/metrics") as r:
                    metrics = await r.text()
            await proxy.flush()
            recs = proxy.records()
    # the engine got the client's trace headers as they were sent
    assert [h.get("traceparent") for h in tap.seen] == [TRACEPARENT, None]
    assert tap.seen[0].get("tracestate") == TRACESTATE
    assert len(recs) == 2
    rec, plain = recs
    assert rec["trace_parent"] == TRACEPARENT and plain["trace_parent"] is None
    spans_by = _by_rid(spans)
    span = spans_by[str(rec["request_id"])]  # the span's id is the record's request id
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert span.kind == Span.SPAN_KIND_CLIENT and span.status.code == Status.STATUS_CODE_UNSET
    assert span.name == f"chat {rec['model']}"
    started, e2e = rec["started_at"], rec["e2e_s"]
    assert isinstance(started, float) and isinstance(e2e, float)
    assert abs(span.start_time_unix_nano - started * 1e9) < 1e4
    assert abs((span.end_time_unix_nano - span.start_time_unix_nano) - e2e * 1e9) < 1e4
    a = attributes(span)
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == rec["model"] == "sim-model"
    assert a["gen_ai.usage.input_tokens"] == rec["prompt_tokens"] and isinstance(rec["prompt_tokens"], int)
    assert a["gen_ai.usage.output_tokens"] == rec["completion_tokens"] and rec["completion_tokens"]
    assert a["gen_ai.response.finish_reasons"] == (rec["finish_reason"],)
    assert a["gen_ai.response.id"] == rec["upstream_id"]
    assert a["gen_ai.request.max_tokens"] == 64 and a["gen_ai.request.temperature"] == 0.0
    assert a["specproxy.request_id"] == rec["request_id"] and a["specproxy.workload"] == rec["workload"]
    assert a["specproxy.outcome"] == "ok" and a["specproxy.ttft_s"] == rec["ttft_s"]
    assert a["server.address"] == "127.0.0.1"
    # a request without a traceparent: the root of a trace of its own
    root = spans_by[str(plain["request_id"])]
    assert root.parent_span_id == b"" and root.trace_id.hex() not in (TRACE_ID, "0" * 32)
    # the export's headers went with it; how it went is counted
    assert rx.posts[0]["api-key"] == "s3cret-key" and rx.posts[0]["Content-Type"] == "application/x-protobuf"
    assert rx.resources[0]["service.name"] == "specproxy"
    assert st["exported"] == 2 and st["dropped"] == st["failed"] == 0
    assert 'specproxy_otlp_spans_total{result="exported"} 2.0' in metrics
    assert "s3cret" not in metrics and "s3cret" not in orjson.dumps(st).decode()
    assert "s3cret" not in (tmp_path / "records.jsonl").read_text()


async def test_the_command_exports_json_with_headers_from_the_environment(tmp_path: Path) -> None:
    """``specproxy proxy --otlp-endpoint`` as users run it (a bookkeeping process and a relay), the API key in
    $OTEL_EXPORTER_OTLP_HEADERS: never on the command line, in its output or in a record."""
    record = tmp_path / "r.jsonl"
    async with running_sim() as sim, receiver() as rx:
        env = {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret-key", "OTEL_SERVICE_NAME": "edge-proxy"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            args = ("--otlp-endpoint", rx.url, "--otlp-protocol", "http/json", "--workers", "1")
            async with proxy_process(sim.url, record, *args) as (url, proc), client() as session:
                status, _ = await post_sse(
                    session, url + "/v1/chat/completions", chat_body(), headers={"traceparent": TRACEPARENT}
                )
                assert status == 200
                (span,) = await rx.wait_spans(1)
                cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # type: ignore[attr-defined]  # noqa: ASYNC240
                proc.terminate()  # type: ignore[attr-defined]
                _, err = await proc.communicate()  # type: ignore[attr-defined]
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert rx.posts[0]["Content-Type"] == "application/json" and rx.posts[0]["api-key"] == "s3cret-key"
    assert rx.resources[0]["service.name"] == "edge-proxy"
    (rec,) = read_records(record)
    assert span.span_id.hex() == rec["request_id"] and rec["trace_parent"] == TRACEPARENT
    for where in (cmdline, err, record.read_bytes()):
        assert b"s3cret" not in where


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


async def test_a_receiver_that_is_down_or_hangs_changes_nothing_for_the_client_and_the_records(
    tmp_path: Path,
) -> None:
    async with running_sim() as sim, receiver("hang") as hanging:
        for name, url in (("unreachable", f"http://127.0.0.1:{_closed_port()}"), ("hanging", hanging.url)):
            cfg = otlp(url, timeout_s=0.5, max_queue=3, batch_spans=2)
            where = tmp_path / name
            where.mkdir()
            async with running_proxy(sim.url, where, otlp=cfg) as proxy, client() as session:
                n = 8
                results = await asyncio.gather(
                    *(
                        post_sse(
                            session,
                            proxy.url + "/v1/chat/completions",
                            chat_body(),
                            headers={"traceparent": TRACEPARENT},
                        )
                        for _ in range(n)
                    )
                )
                assert all(status == 200 and sse.data[-1] == "[DONE]" for status, sse in results), name
                await proxy.flush()
                recs = proxy.records()
                assert len(recs) == n and all(r["outcome"] == "ok" and r["trace_parent"] == TRACEPARENT for r in recs)
                deadline = time.monotonic() + 20
                while True:  # every span ends counted: failed (sent, not taken) or dropped (the queue was full)
                    async with session.get(proxy.url + "/specproxy/status") as r:
                        st = (await r.json())["otlp"]
                    if st["failed"] > 0 and st["failed"] + st["dropped"] + st["queued"] == n:
                        break
                    assert time.monotonic() < deadline, st
                    await asyncio.sleep(0.05)
                assert st["exported"] == 0 and st["last_error"], name
                assert "s3cret" not in orjson.dumps(st).decode()
                stopping = time.monotonic()
            # the stop waits for the export no longer than its close timeout (a generous bound here)
            assert time.monotonic() - stopping < 10
            assert len(list(read_records(where / "records.jsonl"))) == n
    assert hanging.posts, "the hanging receiver was reached"
