"""Records as other people's clients produce them: guidellm closes the connection the moment it reads ``[DONE]``,
aiperf asks for the final usage only and polls ``GET``/``HEAD /metrics``, both poll health endpoints. The relay was
always right for them; these tests hold the records to what happened (shared/docs/field.md)."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.proxyutil import running_proxy
from tests.simutil import running_sim

CHAT = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "def fizzbuzz(n):"}],
    "max_tokens": 24,
    "stream": True,
}


def _request(body: dict[str, object], path: str = "/v1/chat/completions") -> bytes:
    raw = orjson.dumps(body)
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        "X-Specproxy-Workload: code_agent\r\n\r\n"
    ).encode() + raw


async def _guidellm_like(url: str, body: dict[str, object], *, reset: bool) -> bytes:
    """Send one streamed request, read until ``data: [DONE]`` and close at once, as guidellm does; with ``reset``,
    by a TCP reset (SO_LINGER 0), so that any later write of the proxy's fails at once."""
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    got = b""
    try:
        writer.write(_request(body))
        await writer.drain()
        while b"data: [DONE]" not in got:
            part = await asyncio.wait_for(reader.read(65536), 30)
            assert part, got
            got += part
    finally:
        sock = writer.get_extra_info("socket")
        if reset and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
    return got


async def _held_open_upstream(released: asyncio.Event) -> TestServer:
    """An engine whose stream ends (``[DONE]``) and whose connection then stays open until the proxy closes it: the
    client has the whole answer before the proxy has seen the body's end."""
    events = [
        {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hello"}}]},
        {"id": "c1", "choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "stop"}]},
        {"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    ]

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(b"data: " + orjson.dumps(e) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        try:
            await asyncio.Event().wait()  # until the proxy lets go of the connection, which cancels this handler
        finally:
            released.set()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1", port=0, handler_cancellation=True)
    await server.start_server()
    return server


async def test_a_client_that_closes_after_done_is_ok_not_cancelled(tmp_path: Path) -> None:
    released = asyncio.Event()
    up = await _held_open_upstream(released)
    try:
        async with running_proxy(str(up.make_url("")).rstrip("/"), tmp_path, metrics=False) as px:
            got = await _guidellm_like(px.url, CHAT, reset=False)
            await asyncio.wait_for(released.wait(), 30)
            await px.flush()
            (rec,) = px.records()
    finally:
        await up.close()
    assert b"Hello" in got and b"data: [DONE]" in got
    assert rec["outcome"] == "ok" and rec["error"] is None, rec
    assert "client_closed_at_end" in rec["flags"]
    assert rec["completion_tokens"] == 2 and rec["finish_reason"] == "stop"


async def test_a_client_that_leaves_before_the_end_is_still_cancelled(tmp_path: Path) -> None:
    """The rule does not hide a real cancellation: a client that closes before ``[DONE]`` is ``client_cancelled``."""
    async with running_sim(speed=2.0) as sim, running_proxy(sim.url, tmp_path, metrics=False) as px:
        host, port = px.url.rsplit("/", 1)[-1].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_request({**CHAT, "max_tokens": 400}))
        await writer.drain()
        got = b""
        while got.count(b"data: ") < 3:
            got += await asyncio.wait_for(reader.read(65536), 30)
        writer.close()
        for _ in range(3000):  # the record is written once the proxy has seen the client go
            await asyncio.sleep(0.01)
            if px.records():
                break
        (rec,) = px.records()
    assert b"[DONE]" not in got
    assert rec["outcome"] == "client_cancelled" and "client_closed_at_end" not in rec["flags"], rec


async def test_guidellm_like_clients_on_the_simulator_are_all_ok(tmp_path: Path) -> None:
    """Many streams, each closed by a reset the moment ``[DONE]`` arrives, some at once: every one is ``ok``."""
    async with running_sim() as sim, running_proxy(sim.url, tmp_path, metrics=False) as px:

        async def one(i: int) -> bytes:
            return await _guidellm_like(px.url, {**CHAT, "max_tokens": 8 + i % 5}, reset=True)

        got = await asyncio.gather(*(one(i) for i in range(40)))
        await px.flush()
        recs = px.records()
    assert all(b"data: [DONE]" in g for g in got)
    assert len(recs) == 40
    assert [r for r in recs if r["outcome"] != "ok"] == []


async def test_final_usage_only_is_exact_and_the_split_is_scaled(tmp_path: Path) -> None:
    """aiperf and the openai SDK ask for ``include_usage`` alone: the total is the server's, exact; the per-chunk
    split is the tokenizer's estimate, scaled to add up to it, and the record says which is which."""
    body = {**CHAT, "max_tokens": 64, "stream_options": {"include_usage": True}}
    async with (
        running_sim() as sim,
        running_proxy(sim.url, tmp_path, metrics=False) as px,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(3):
            async with s.post(px.url + "/v1/chat/completions", json=body) as resp:
                text = await resp.text()
        await px.flush()
        recs = px.records()
    usage = orjson.loads(next(line for line in text.splitlines() if '"usage"' in line)[6:])["usage"]
    for rec in recs:
        assert rec["token_source"] == "usage" and rec["chunk_token_source"] in ("tiktoken", "approx"), rec
        assert "no_usage" not in rec["flags"]
        assert sum(n for _, n in rec["chunks"]) == rec["completion_tokens"]
    assert recs[-1]["completion_tokens"] == usage["completion_tokens"]


async def test_no_usage_at_all_is_still_said(tmp_path: Path) -> None:
    async with (
        running_sim() as sim,
        running_proxy(sim.url, tmp_path, metrics=False) as px,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(px.url + "/v1/chat/completions", json=CHAT) as resp:
            await resp.read()
        await px.flush()
        (rec,) = px.records()
    assert rec["token_source"] == rec["chunk_token_source"] and rec["token_source"] in ("tiktoken", "approx")
    assert "no_usage" in rec["flags"]


async def test_polls_and_probes_are_relayed_but_not_recorded(tmp_path: Path) -> None:
    """What aiperf (GET and HEAD /metrics), guidellm (/health), model listings and the engine probes of a load
    generator send: relayed as ever, counted by kind, and never a workload, a record or a status rate."""
    async with (
        running_sim() as sim,
        running_proxy(sim.url, tmp_path, metrics=False) as px,
        aiohttp.ClientSession() as s,
    ):
        statuses = []
        for method, path in (
            ("GET", "/metrics"),
            ("HEAD", "/metrics"),
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("GET", "/version"),
            ("GET", "/api/version"),
            ("GET", "/props"),
            ("GET", "/get_server_info"),
        ):
            async with s.request(method, px.url + path) as resp:
                await resp.read()
                statuses.append(resp.status)
        async with s.post(px.url + "/v1/chat/completions", json=CHAT, headers={"X-Specproxy-Workload": "w1"}) as r:
            await r.read()
        async with s.post(px.url + "/tokenize", json={"model": "sim-model", "prompt": "hi"}) as r:
            await r.read()
        await px.flush()
        recs = px.records()
        status = px.recorder.status()
        metrics = px.recorder.metrics
    assert statuses[:4] == [200, 200, 200, 200]
    assert [(r["workload"], r["path"]) for r in recs] == [("w1", "/v1/chat/completions")]
    assert list(status["workloads"]) == ["w1"]
    passed = status["passthrough"]
    assert passed["metrics"] == {"ok": 2} and passed["health"] == {"ok": 1} and passed["models"] == {"ok": 1}
    assert sum(passed["probe"].values()) == 4  # four probes, whatever this engine answers them
    assert sum(passed["other"].values()) == 1  # /tokenize
    sample = metrics.registry.get_sample_value
    assert sample("specproxy_passthrough_requests_total", {"kind": "metrics", "outcome": "ok"}) == 2
