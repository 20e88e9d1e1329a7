"""Each dialect through the proxy, over sockets, against the simulator posing as its engine: what the records say
is checked against the simulator's ground truth (GET /sim/requests/{id})."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.proxyutil import RunningProxy, running_proxy
from tests.reference_report import gaps
from tests.simutil import CODE_PROMPT, running_sim

MSG = [{"role": "user", "content": CODE_PROMPT}]


async def _post(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with s.post(url, json=body) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


async def _truth(s: aiohttp.ClientSession, sim_url: str, rid: str | None = None) -> dict[str, Any]:
    if rid is None:  # the engine's API names no id: the last request the simulator saw
        async with s.get(f"{sim_url}/sim/requests") as r:
            rid = (await r.json())["requests"][-1]["id"]
    async with s.get(f"{sim_url}/sim/requests/{rid}") as r:
        assert r.status == 200
        data: dict[str, Any] = await r.json()
        return data


async def _ready(px: RunningProxy) -> None:
    for _ in range(300):
        if px.recorder.scraper.state.ok or not px.recorder.scraper.enabled:
            return
        await asyncio.sleep(0.01)


async def test_ollama_native_chat_and_generate(tmp_path: Path) -> None:
    async with (
        running_sim(speed=20.0, dialect="ollama", spec_method="none") as sim,
        running_proxy(sim.url, tmp_path, metrics=False, rec_probe_url=sim.url) as px,
        aiohttp.ClientSession() as s,
    ):
        status, ctype, body = await _post(
            s, px.url + "/api/chat", {"model": "sim-model", "messages": MSG, "options": {"num_predict": 30}}
        )
        assert status == 200 and ctype.startswith("application/x-ndjson")
        lines = [orjson.loads(x) for x in body.splitlines()]
        t_chat = await _truth(s, sim.url)
        status, _, body2 = await _post(
            s, px.url + "/api/generate", {"model": "sim-model", "prompt": "def f(x):", "stream": False}
        )
        assert status == 200 and orjson.loads(body2)["done"] is True
        t_gen = await _truth(s, sim.url)
        await px.flush()
        chat, gen = px.records()
    final = lines[-1]
    assert final["done"] and final["eval_count"] == t_chat["completion_tokens"] == 30
    assert chat["engine"] == "ollama" and chat["stream"] and chat["finish_reason"] == "length" and chat["truncated"]
    assert chat["completion_tokens"] == 30 and chat["prompt_tokens"] == t_chat["prompt_tokens"]
    assert [n for _, n in chat["chunks"]] and len(chat["chunks"]) == 30  # one event per token
    et = chat["engine_timings"]
    assert et["decode_tokens"] == 30 and et["decode_s"] == pytest.approx(
        t_chat["finished_at_s"] - t_chat["first_token_at_s"], abs=1e-6
    )
    assert chat["decode_tok_s"] == pytest.approx(30 / et["decode_s"]) and "decode_rate_from_engine" in chat["flags"]
    assert chat["spec"] is None and not chat["chunks_are_steps"]
    assert gen["engine"] == "ollama" and not gen["stream"] and gen["completion_tokens"] == t_gen["completion_tokens"]
    assert gen["engine_timings"]["prompt_tokens"] == t_gen["prompt_tokens"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_vllm_anthropic_and_responses_streams(tmp_path: Path, path: str) -> None:
    async with (
        running_sim(speed=20.0) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        await _ready(px)
        body: dict[str, Any] = {"model": "sim-model", "stream": True}
        if path == "/v1/messages":
            body.update(messages=MSG, max_tokens=48)
        else:
            body.update(input=CODE_PROMPT, max_output_tokens=48)
        status, ctype, _ = await _post(s, px.url + path, body)
        assert status == 200 and ctype.startswith("text/event-stream")
        await px.flush()
        (rec,) = px.records()
        t = await _truth(s, sim.url, rec["upstream_id"])
    assert rec["upstream_id"].startswith("msg_" if path == "/v1/messages" else "resp_")
    assert rec["engine"] == "vllm" and rec["finish_reason"] == t["finish_reason"] == "length"
    assert rec["completion_tokens"] == t["completion_tokens"] == 48 and rec["prompt_tokens"] == t["prompt_tokens"]
    # one delta per engine step: the first is prefill, every other one a decode step
    assert len(rec["chunks"]) == 1 + t["drafts"] and rec["ttft_s"] is not None and rec["ttft_s"] > 0
    est = rec["spec"]["estimates"]
    assert est["chunks"]["drafts"] == t["drafts"] and est["chunks"]["exact"] is False  # counted from text
    assert rec["spec"]["source"] == "counters" and est["counters"]["accepted"] == t["counted_accepted"]


async def test_llamacpp_native_and_openai_streams(tmp_path: Path) -> None:
    async with (
        running_sim(speed=20.0, dialect="llamacpp") as sim,
        running_proxy(sim.url, tmp_path, rec_probe_url=sim.url) as px,
        aiohttp.ClientSession() as s,
    ):
        await _ready(px)
        status, _, _ = await _post(s, px.url + "/completion", {"prompt": CODE_PROMPT, "n_predict": 40, "stream": True})
        assert status == 200
        t_native = await _truth(s, sim.url)
        await px.flush()
        status, _, _ = await _post(
            s,
            px.url + "/v1/chat/completions",
            {"model": "sim-model", "messages": MSG, "max_tokens": 40, "stream": True},
        )
        await px.flush()
        native, oai = px.records()
        t_oai = await _truth(s, sim.url, oai["upstream_id"])
    steps, tokens = gaps([native, oai])  # type: ignore[list-item]
    assert steps == [] and len(tokens) == 2 * 39  # per-token events: token gaps, but no step to see
    for rec, t in ((native, t_native), (oai, t_oai)):
        assert rec["engine"] == "llamacpp" and rec["completion_tokens"] == t["completion_tokens"] == 40
        assert len([n for _, n in rec["chunks"] if n > 0]) == 40  # one event per token, steps invisible
        assert "chunks_not_steps_engine" in rec["flags"] and not rec["chunks_are_steps"]
        est = rec["spec"]["estimates"]
        assert est["chunks"] is None
        assert est["server"]["accepted"] == t["counted_accepted"] and est["server"]["draft_tokens"] == t["draft_tokens"]
        assert est["counters"]["accepted"] == t["counted_accepted"] and est["counters"]["drafts"] == t["drafts"]
        assert rec["engine_timings"]["draft_tokens"] == t["draft_tokens"]
        assert "decode_rate_from_engine" in rec["flags"]


async def test_sglang_generate_meta_info(tmp_path: Path) -> None:
    async with (
        running_sim(speed=20.0, dialect="sglang") as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        await _ready(px)
        for n in (40, 400):
            await _post(
                s, px.url + "/generate", {"text": CODE_PROMPT, "sampling_params": {"max_new_tokens": n}, "stream": True}
            )
        await px.flush()
        recs = px.records()
        truths = [await _truth(s, sim.url, r["upstream_id"]) for r in recs]
        state = px.recorder.scraper.state
        # the engine's own figures came with each request, so no closing scrape: status catches up once it is quiet
        seen = state.ok
        for _ in range(1000):
            if state.ok > seen:
                break
            await asyncio.sleep(0.01)
        assert state.engine == "sglang" and state.running == 0 and state.waiting == 0
        # SGLang's gauge, over everything the simulator served: 1 + accepted / verify steps
        acc, steps = sum(t["counted_accepted"] for t in truths), sum(t["drafts"] for t in truths)
        assert state.accept_length_gauge == pytest.approx(1 + acc / steps)
    for rec, t in zip(recs, truths, strict=True):
        assert rec["engine"] == "sglang" and rec["token_source"] == "usage"
        assert rec["spec"]["source"] == "server"
        est = rec["spec"]["estimates"]
        assert (est["server"]["accepted"], est["server"]["drafts"], est["server"]["draft_tokens"]) == (
            t["counted_accepted"],
            t["drafts"],
            t["draft_tokens"],
        )
        assert est["chunks"]["accepted"] == t["accepted"] and est["chunks"]["drafts"] == t["drafts"]
        assert est["counters"] is None  # SGLang publishes acceptance as gauges only: no counter share


async def test_engine_auto_and_forced(tmp_path: Path) -> None:
    async with running_sim(speed=20.0) as sim, aiohttp.ClientSession() as s:
        # no /metrics and nothing engine-specific in an Anthropic stream: the probe of /version names vLLM
        async with running_proxy(sim.url, tmp_path, metrics=False, rec_probe_url=sim.url) as px:
            for _ in range(100):
                if px.recorder.engine.probed:
                    break
                await asyncio.sleep(0.01)
            await _post(
                s, px.url + "/v1/messages", {"model": "sim-model", "messages": MSG, "max_tokens": 8, "stream": True}
            )
            await px.flush()
            (rec,) = px.records()
            assert rec["engine"] == "vllm"
        forced = tmp_path / "forced"
        forced.mkdir()
        async with running_proxy(sim.url, forced, metrics=False, rec_engine="sglang") as px:
            await _post(s, px.url + "/v1/messages", {"model": "sim-model", "messages": MSG, "max_tokens": 8})
            await px.flush()
            (rec,) = px.records()
            assert rec["engine"] == "sglang" and rec["completion_tokens"] == 8
