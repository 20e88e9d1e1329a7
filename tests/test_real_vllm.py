"""Against a real vLLM (skipped unless ``SPECPROXY_VLLM_URL`` points at one started with speculative decoding and
``--enable-per-request-metrics --per-request-spec-decode-metrics detailed``; ../shared/docs/real-vllm-cpu.md shows how
on a CPU). The server's own per-request figures are the truth."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from specproxy.core.record import read_records
from tests.proxyutil import proxy_process

VLLM = os.environ.get("SPECPROXY_VLLM_URL")
pytestmark = [pytest.mark.realvllm, pytest.mark.skipif(not VLLM, reason="set SPECPROXY_VLLM_URL to a real vLLM")]

PROMPTS = [
    ("code_agent", "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."),
    ("ja_chat", "こんにちは！最近おすすめのカフェってある？週末に友だちと行きたいんだ。"),
]


def _body(model: str, prompt: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


async def _model(s: aiohttp.ClientSession) -> str:
    async with s.get(f"{VLLM}/v1/models") as r:
        return str((await r.json())["data"][0]["id"])


async def test_counters_alone_equal_the_servers_per_request_figures(tmp_path: Path) -> None:
    assert VLLM is not None
    record = tmp_path / "r.jsonl"
    async with proxy_process(VLLM, record) as (url, _), aiohttp.ClientSession() as s:
        model = await _model(s)
        for workload, prompt in PROMPTS * 2:
            body = _body(model, prompt, 64)
            async with s.post(url + "/v1/chat/completions", json=body, headers={"X-Specproxy-Workload": workload}) as r:
                assert r.status == 200
                await r.read()
    recs = [r for r in read_records(record) if r["path"].endswith("completions")]
    assert len(recs) == 4
    for rec in recs:
        est = rec["spec"]["estimates"]
        assert rec["spec"]["source"] == "server"
        for key in ("accepted", "drafts", "draft_tokens", "per_position"):
            assert est["counters"][key] == est["server"][key], (key, est)
        if rec["finish_reason"] == "stop":
            assert est["chunks"]["accepted"] == est["server"]["accepted"]
        else:  # cut by max_tokens: the counters include the last step's unemitted drafts (1 to 4 tokens)
            assert 0 <= est["server"]["accepted"] - est["chunks"]["accepted"] <= 4


async def test_overlapping_requests_per_workload_close_to_the_servers_figures(tmp_path: Path) -> None:
    """Four at a time through the proxy: the counters, shared among overlapping requests, against the server's own
    per-request figures summed per workload."""
    assert VLLM is not None
    record = tmp_path / "r.jsonl"
    async with proxy_process(VLLM, record) as (url, _), aiohttp.ClientSession() as s:
        model = await _model(s)
        queue: list[tuple[str, str]] = PROMPTS * 8

        async def worker() -> None:
            while queue:
                workload, prompt = queue.pop()
                body = _body(model, prompt, 160)
                headers = {"X-Specproxy-Workload": workload}
                async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200
                    await r.read()

        await asyncio.gather(*(worker() for _ in range(4)))
    sums: dict[str, dict[str, list[float]]] = {}
    for rec in read_records(record):
        if not rec["path"].endswith("completions"):
            continue
        est = rec["spec"]["estimates"]
        per = sums.setdefault(rec["workload"], {"server": [0.0, 0.0], "counters": [0.0, 0.0]})
        for src in ("server", "counters"):
            per[src][0] += est[src]["accepted"]
            per[src][1] += est[src]["draft_tokens"]
    assert set(sums) == {"code_agent", "ja_chat"}
    for per in sums.values():
        server, counters = per["server"][0] / per["server"][1], per["counters"][0] / per["counters"][1]
        assert abs(server - counters) <= 0.05, (server, counters)
