"""Through the proxy: each engine's per-request figure, replayed byte for byte by a real upstream, becomes the
record's server figure and names its shape; a simulator batching steps (``--stream-interval``) is caught."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.proxyutil import running_proxy
from tests.simutil import FAST, chat_body, running_sim
from tests.upstreams import DATA, Script, capture_pieces, start_upstream

CASES = {
    "vllm-metrics.sse": ("vllm_metrics", 3),
    "sglang-spec-tokens-details.sse": ("sglang_spec_tokens_details", 3),
    "trtllm-choice.sse": ("trtllm_choice", 0),
    "smg-usage-prediction.sse": ("usage_prediction_tokens", 0),
}


async def _record(tmp_path: Path, name: str) -> dict[str, Any]:
    pieces = capture_pieces(f"engine-shapes/{name}")
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=0.002))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            async with s.post(px.url + "/v1/chat/completions", data=b'{"stream":true}') as r:
                assert r.status == 200 and len(await r.read()) == sum(map(len, pieces))
            await px.flush()
            (rec,) = px.records()
            return rec
    finally:
        await up.server.close()


@pytest.mark.parametrize("name", sorted(CASES))
async def test_each_engine_shape_reaches_the_record(tmp_path: Path, name: str) -> None:
    shape, drafts = CASES[name]
    rec = await _record(tmp_path, name)
    spec = rec["spec"]
    server = spec["estimates"]["server"]
    assert server is not None and (server["accepted"], server["drafts"], server["draft_tokens"]) == (3, drafts, 9)
    assert spec["server_source"] == shape and spec["source"] == "server"
    assert spec["acceptance_rate"] == pytest.approx(1 / 3)
    assert rec["completion_tokens"] == 7 and "server_spec_unusable" not in rec["flags"]


async def _sim_record(tmp_path: Path, stream_interval: int) -> dict[str, Any]:
    async with (
        running_sim(FAST, spec_method="none", stream_interval=stream_interval) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=60)) as r:
            assert r.status == 200
            await r.read()
        await px.flush()
        (rec,) = px.records()
        return rec


async def test_a_stream_interval_without_speculation_is_caught(tmp_path: Path) -> None:
    rec = await _sim_record(tmp_path, 4)
    assert rec["chunk_token_source"] == "usage"
    assert max(n for _, n in rec["chunks"]) == 4  # four one-token steps per chunk
    assert "stream_interval_suspected" in rec["flags"] and rec["chunks_are_steps"] is False
    spec = rec["spec"]
    assert spec is None or spec["source"] != "chunks"
    assert rec["spans"] is None or rec["spans"]["basis"] != "steps"


async def test_one_step_per_chunk_is_not_taken_for_an_interval(tmp_path: Path) -> None:
    rec = await _sim_record(tmp_path, 1)
    assert "stream_interval_suspected" not in rec["flags"] and rec["chunks_are_steps"] is True


def test_fixtures_are_listed_in_their_readme() -> None:
    readme = (DATA / "engine-shapes" / "README.md").read_text()
    assert all(f"`{name}`" in readme and f"`{shape}`" in readme for name, (shape, _) in CASES.items())


async def test_a_stream_interval_with_speculation_chooses_no_chunk_derived_share(tmp_path: Path) -> None:
    async with (
        running_sim(FAST, spec_method="mtp", num_speculative_tokens=3, stream_interval=4) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(500):  # a baseline scrape, so the request's counter deltas are had
            if px.recorder.scraper.state.ok:
                break
            await asyncio.sleep(0.01)
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=60)) as r:
            await r.read()
        await px.flush()
        (rec,) = px.records()
    assert "stream_interval_suspected" in rec["flags"] and rec["chunks_are_steps"] is False
    spec = rec["spec"]
    assert spec["source"] != "chunks"
    # a share split by chunks that merge steps reads more accepted than drafted: never the record's figure
    assert spec["acceptance_rate"] is None or spec["acceptance_rate"] <= 1
