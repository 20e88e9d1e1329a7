"""Attribution on real vLLM captures replayed by a real upstream: each source agrees with the counter deltas that
vLLM itself exported around that one request (tests/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.proxyutil import running_proxy
from tests.upstreams import DATA, Script, capture_pieces, start_upstream


def _metrics(name: str) -> str:
    return (DATA / name).read_text()


async def _one(tmp_path: Path, capture: str, before: str, after: str, **kw: object) -> dict[str, object]:
    pieces = capture_pieces(capture)
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=0.002), [_metrics(before), _metrics(after)])
    try:
        async with running_proxy(up.url, tmp_path, **kw) as px, aiohttp.ClientSession() as s:
            await _wait_baseline(px)
            async with s.post(px.url + "/v1/chat/completions", data=b'{"stream":true}') as r:
                await r.read()
            await px.flush()
            (rec,) = px.records()
            return rec
    finally:
        await up.server.close()


async def _wait_baseline(px: object) -> None:
    import asyncio

    for _ in range(200):
        if px.recorder.scraper.state.ok:  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no baseline scrape")


async def test_ngram_code_counters_and_chunks(tmp_path: Path) -> None:
    rec = await _one(
        tmp_path, "chat-stream-ngram-k3-code.sse", "metrics-ngram-before-code.txt", "metrics-ngram-after-code.txt"
    )
    spec = rec["spec"]
    assert isinstance(spec, dict)
    est = spec["estimates"]
    assert est["counters"]["accepted"] == 21 and est["counters"]["drafts"] == 16
    assert est["counters"]["draft_tokens"] == 48 and est["counters"]["per_position"] == [9, 8, 4]
    assert est["counters"]["exact"] is True
    assert est["chunks"]["accepted"] == 21  # the chunk-derived figure equals vLLM's counter
    # ngram drafted on 16 of 79 decode steps: chunk-derived drafts overcount, so the counters are chosen
    assert "partial_drafting" in rec["flags"]
    assert spec["source"] == "counters"
    assert spec["acceptance_rate"] == pytest.approx(21 / 48)
    assert spec["k"] == 3
    assert rec["completion_tokens"] == 101 and rec["token_source"] == "usage"
    assert rec["chunks_are_steps"] is True


async def test_draft_model_chunks_chosen(tmp_path: Path) -> None:
    rec = await _one(
        tmp_path,
        "chat-stream-draftmodel-k3-code.sse",
        "metrics-draftmodel-before-code.txt",
        "metrics-draftmodel-after-code.txt",
    )
    spec = rec["spec"]
    assert isinstance(spec, dict)
    assert spec["source"] == "chunks"
    assert (spec["accepted"], spec["drafts"], spec["draft_tokens"]) == (69, 23, 69)
    assert spec["per_position"] == [23, 23, 23]
    assert spec["estimates"]["counters"]["accepted"] == 69
    assert spec["tokens_per_step"] == {"4": 23, "1": 1} or spec["tokens_per_step"]["4"] == 23


async def test_server_per_request_metrics_chosen(tmp_path: Path) -> None:
    rec = await _one(
        tmp_path,
        "chat-stream-ngram-k3-per-request-metrics.sse",
        "metrics-ngram-before-per-request.txt",
        "metrics-ngram-after-per-request.txt",
    )
    spec = rec["spec"]
    assert isinstance(spec, dict)
    assert spec["source"] == "server"
    assert (spec["accepted"], spec["drafts"], spec["draft_tokens"]) == (13, 14, 42)
    # from per_step_accepted; the counters' per position in metrics-ngram-*-per-request.txt moved by the same (a
    # request with the engine's own figures waits for no closing scrape, so the record may not hold them)
    assert spec["per_position"] == [6, 4, 3]
    assert spec["estimates"]["chunks"]["accepted"] == 13
    # the engine's own timing is kept beside the rate timed from chunks here (replayed 2 ms apart: not the engine's)
    assert rec["engine"] == "vllm" and rec["engine_timings"]["decode_tokens"] == 96
    assert rec["engine_timings"]["decode_s"] == pytest.approx(2.7612986750000346)
    assert "decode_rate_from_engine" not in rec["flags"]
    assert rec["decode_tok_s"] > 96 / 2.76 * 2  # 97 chunks 2 ms apart: far faster than the engine was
    assert "decode_rate_off_engine" in rec["flags"]  # and the record says its clock is not the engine's


async def test_metrics_down_falls_back_and_says_so(tmp_path: Path) -> None:
    pieces = capture_pieces("chat-stream-draftmodel-k3-code.sse")
    up = await start_upstream(lambda req, body: Script(pieces), ["garbage{"])
    try:
        async with running_proxy(up.url, tmp_path, rec_k=3) as px, aiohttp.ClientSession() as s:
            async with s.post(px.url + "/v1/chat/completions", data=b"{}") as r:
                assert r.status == 200
                assert len(await r.read()) == sum(len(p) for p in pieces)
            await px.flush()
            (rec,) = px.records()
            assert rec["outcome"] == "ok"
            assert "metrics_unavailable" in rec["flags"]
            assert rec["spec"]["source"] == "chunks" and rec["spec"]["accepted"] == 69
            assert px.recorder.scraper.state.errors >= 1
    finally:
        await up.server.close()


async def test_one_failed_closing_scrape_does_not_cost_the_record_its_counters(tmp_path: Path) -> None:
    """A scrape that fails once (a timeout on a busy host) while a finished request waits for its closing delta: the
    next good scrape still covers its steps, so its counter figures stay exact and it is not flagged."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")
    state = {"done": False, "failed": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for p in pieces:
            await resp.write(p)
        await resp.write_eof()
        state["done"] = True
        return resp

    async def metrics(request: web.Request) -> web.Response:
        if state["done"] and not state["failed"]:
            state["failed"] += 1  # the first scrape after the stream: an error
            return web.Response(status=500, text="busy")
        name = "metrics-ngram-after-code.txt" if state["done"] else "metrics-ngram-before-code.txt"
        return web.Response(text=_metrics(name), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        url = f"http://127.0.0.1:{server.port}"
        async with running_proxy(url, tmp_path) as px, aiohttp.ClientSession() as s:
            await _wait_baseline(px)
            async with s.post(px.url + "/v1/chat/completions", data=b'{"stream":true}') as r:
                await r.read()
            await px.flush()
            (rec,) = px.records()
    finally:
        await server.close()
    assert state["failed"] == 1
    est = rec["spec"]["estimates"]["counters"]
    assert est["exact"] is True and est["accepted"] == 21 and est["drafts"] == 16, est
    assert "metrics_unavailable" not in rec["flags"], rec["flags"]
