"""The simulator over real sockets: wire shape against the vLLM captures, counters against truth, faults."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from simutil import (
    CHAT_PROMPT,
    CODE_PROMPT,
    DATA,
    FAST,
    JA_PROMPT,
    chat_body,
    client,
    key_shape,
    post_sse,
    running_sim,
    scrape,
    split_sse,
    summed,
    truth,
)

from specproxy.sim import DEFAULT_PROFILES, SimConfig, SimHandle, serve

SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
LONG_PROFILES = {n: replace(p, min_output_tokens=5000, max_output_tokens=5000) for n, p in DEFAULT_PROFILES.items()}


def capture(name: str) -> list[dict[str, Any]]:
    return split_sse((DATA / name).read_bytes()).json


async def test_chat_stream_matches_vllm_capture_shape_and_truth() -> None:
    async with running_sim(spec_method="ngram", per_request_spec_metrics="detailed") as sim, client() as s:
        status, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body(max_tokens=300))
        assert status == 200 and sse.data[-1] == "[DONE]"
        assert sse.content_type == "text/event-stream; charset=utf-8"
        assert re.fullmatch(rb"(data: [^\n]+\n\n)+", sse.raw) and sse.raw.endswith(b"\n\ndata: [DONE]\n\n")
        assert all(orjson.dumps(orjson.loads(d)).decode() == d for d in sse.data[:-1])  # compact, like vLLM
        ours, real = sse.json, capture("chat-stream-ngram-k3-per-request-metrics.sse")
        assert key_shape(ours[0]) == key_shape(real[0])  # role chunk
        assert key_shape(ours[1]) == key_shape(real[1])  # content chunk
        assert key_shape(ours[-2]) == key_shape(real[-2])  # finish chunk
        assert key_shape(ours[-1]) == key_shape(real[-1])  # usage chunk with metrics.speculative_decoding
        assert ours[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert ours[0]["id"].startswith("chatcmpl-") and len(ours[0]["id"]) == len("chatcmpl-") + 16
        assert {c["id"] for c in ours} == {ours[0]["id"]}
        t = await truth(s, sim, ours[0]["id"])
        usage = [c["usage"]["completion_tokens"] for c in ours[:-1]]
        deltas = [b - a for a, b in itertools.pairwise(usage)]
        assert deltas == t["step_emitted"] and deltas[0] == 1
        assert ours[-1]["usage"]["completion_tokens"] == t["completion_tokens"] == sum(deltas)
        assert ours[-2]["choices"][0]["finish_reason"] == t["finish_reason"]
        spec = ours[-1]["metrics"]["speculative_decoding"]
        assert spec["per_step_accepted"] == t["per_step_accepted"]
        assert spec["num_spec_steps"] == t["drafts"] < len(deltas) - 1  # ngram skips steps
        assert spec["num_accepted_draft_tokens"] == t["counted_accepted"]
        assert len(spec["acceptance_histogram"]) == 4 and sum(spec["acceptance_histogram"]) == t["drafts"]
        assert t["profile"] == "code" and not t["aborted"] and t["started_at_s"] <= t["finished_at_s"]


async def test_per_step_chunks_carry_one_plus_accepted_tokens() -> None:
    async with running_sim(num_speculative_tokens=4) as sim, client() as s:
        _, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body(max_tokens=500))
        chunks = sse.json
        t = await truth(s, sim, chunks[0]["id"])
        usage = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
        deltas = [b - a for a, b in itertools.pairwise(usage)]
        assert deltas[1:] == [a + 1 for a in t["per_step_accepted"]]  # mtp: every decode step drafts
        assert t["finish_reason"] == "stop"  # max_tokens 500 is above every natural length
        text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
        assert text.startswith("```python\n")


async def test_completions_stream_shape() -> None:
    async with running_sim(spec_method="ngram", per_request_spec_metrics="detailed") as sim, client() as s:
        body = {
            "model": "sim-model",
            "prompt": "def fib(n):",
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        status, sse = await post_sse(s, f"{sim.url}/v1/completions", body)
        ours, real = sse.json, capture("completions-stream-ngram-k3-per-request-metrics.sse")
        assert status == 200 and sse.data[-1] == "[DONE]"
        assert [key_shape(c) for c in (ours[0], ours[-2], ours[-1])] == [
            key_shape(c) for c in (real[0], real[-2], real[-1])
        ]
        assert ours[0]["object"] == "text_completion" and ours[0]["id"].startswith("cmpl-")
        assert ours[-2]["choices"][0]["finish_reason"] == "length" and ours[-1]["usage"]["completion_tokens"] == 40


async def test_non_streaming_bodies_match_captures_and_stream_text() -> None:
    async with running_sim(per_request_spec_metrics="detailed") as sim, client() as s:
        async with s.post(f"{sim.url}/v1/chat/completions", json=chat_body(stream=False)) as resp:
            assert resp.status == 200
            body = await resp.json()
        real = orjson.loads((DATA / "chat-nonstream-ngram-k3-per-request-metrics.json").read_bytes())
        assert key_shape(body) == key_shape(real)
        _, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body())
        streamed = "".join(c["choices"][0]["delta"]["content"] for c in sse.json if c["choices"])
        assert body["choices"][0]["message"]["content"] == streamed  # same seed + same request -> same text
    async with running_sim() as sim, client() as s:
        async with s.post(f"{sim.url}/v1/chat/completions", json=chat_body(CHAT_PROMPT, stream=False)) as resp:
            body = await resp.json()
        real = orjson.loads((DATA / "chat-nonstream-ngram-k3.json").read_bytes())
        assert key_shape(body) == key_shape(real) and body["metrics"] is None


async def test_summary_metrics_and_no_usage_without_include_usage() -> None:
    async with running_sim(per_request_spec_metrics="summary") as sim, client() as s:
        _, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body())
        spec = sse.json[-1]["metrics"]["speculative_decoding"]
        real = capture("chat-stream-ngram-k3-per-request-metrics.sse")[-1]["metrics"]["speculative_decoding"]
        assert set(spec) == set(real) - {"per_step_accepted", "per_step_drafted"}
        _, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body(usage=False, return_token_ids=True))
        chunks = sse.json
        assert all("usage" not in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"]
        assert all(c["choices"][0]["token_ids"] for c in chunks[1:])


async def test_metrics_equal_truth_summed_over_two_engines() -> None:
    async with running_sim(engines=2, max_num_seqs=3) as sim, client() as s:
        prompts = [CODE_PROMPT, CHAT_PROMPT, JA_PROMPT] * 3
        results = await asyncio.gather(
            *(
                post_sse(s, f"{sim.url}/v1/chat/completions", chat_body(p, max_tokens=50 + i))
                for i, p in enumerate(prompts)
            )
        )
        ids = [sse.json[0]["id"] for _, sse in results]
        truths = [await truth(s, sim, rid) for rid in ids]
        assert {t["engine"] for t in truths} == {0, 1}
        assert {t["profile"] for t in truths} == {"code", "other", "ja_chat"}
        m = await scrape(s, sim)
        assert {dict(lab)["engine"] for name, lab in m if name == SPEC[0]} == {"0", "1"}
        assert summed(m, "vllm:spec_decode_num_drafts_total") == sum(t["drafts"] for t in truths) > 0
        assert summed(m, "vllm:spec_decode_num_draft_tokens_total") == sum(t["draft_tokens"] for t in truths)
        assert summed(m, "vllm:spec_decode_num_accepted_tokens_total") == sum(t["counted_accepted"] for t in truths)
        for pos in range(3):
            assert summed(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == sum(
                t["per_position"][pos] for t in truths
            )
        assert summed(m, "vllm:generation_tokens_total") == sum(t["completion_tokens"] for t in truths)
        assert summed(m, "vllm:prompt_tokens_total") == sum(t["prompt_tokens"] for t in truths)
        assert summed(m, "vllm:request_success_total") == len(truths)
        assert summed(m, "vllm:request_success_total", finished_reason="repetition") == 0
        assert summed(m, "vllm:time_to_first_token_seconds_count") == len(truths)
        assert summed(m, "vllm:estimated_read_bytes_per_gpu_total") > 0
        assert summed(m, "vllm:num_requests_running") == 0
        async with s.get(f"{sim.url}/sim/truth") as resp:
            total = (await resp.json())["total"]
        assert total["accepted"] == summed(m, "vllm:spec_decode_num_accepted_tokens_total")
        assert total["per_position"] == [
            summed(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(3)
        ]
        async with s.get(f"{sim.url}/sim/requests") as resp:
            assert {r["id"] for r in (await resp.json())["requests"]} == set(ids)


async def test_no_spec_series_without_speculation() -> None:
    async with running_sim(spec_method="none") as sim, client() as s:
        _, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body())
        usage = [c["usage"]["completion_tokens"] for c in sse.json[:-1]]
        assert {b - a for a, b in itertools.pairwise(usage)} == {1}
        m = await scrape(s, sim)
        assert not [name for name, _ in m if name.startswith("vllm:spec_decode")]
        assert summed(m, "vllm:generation_tokens_total") == 64
        async with s.get(f"{sim.url}/metrics") as resp:
            assert "vllm:spec_decode" not in await resp.text()


async def test_request_faults_status_reset_stall_error_event() -> None:
    async with running_sim() as sim, client() as s:
        url = f"{sim.url}/v1/chat/completions"
        async with s.post(url, json=chat_body(), headers={"X-Sim-Fault": "status=503"}) as resp:
            assert resp.status == 503
            err = {"message": "Simulated failure (HTTP 503)", "type": "ServiceUnavailableError", "param": None}
            assert await resp.json() == {"error": {**err, "code": 503}}
        received = b""
        with pytest.raises(aiohttp.ClientError):
            async with s.post(url, json=chat_body(max_tokens=200), headers={"X-Sim-Fault": "reset_after=3"}) as resp:
                async for chunk in resp.content.iter_any():
                    received += chunk
        events = split_sse(received).json
        assert len(events) == 3 and b"[DONE]" not in received
        t = await truth(s, sim, events[0]["id"])
        assert t["aborted"] and t["finish_reason"] == "abort"
        start = time.monotonic()
        async with s.post(url, json=chat_body(max_tokens=4), headers={"X-Sim-Fault": "stall=0.3"}) as resp:
            headers_after = time.monotonic() - start
            assert resp.status == 200 and split_sse(await resp.read()).data[-1] == "[DONE]"
        assert headers_after >= 0.3
        status, sse = await post_sse(s, url, chat_body(max_tokens=200), headers={"X-Sim-Fault": "error_event_after=2"})
        assert status == 200 and sse.data[-1] == "[DONE]" and len(sse.data) == 4
        err = orjson.loads(sse.data[2])
        assert set(err["error"]) == {"message", "type", "param", "code"}
        t = await truth(s, sim, orjson.loads(sse.data[0])["id"])
        assert t["finish_reason"] == "error" and not t["aborted"]
        m = await scrape(s, sim)
        assert summed(m, "vllm:request_success_total", finished_reason="error") == 1
        assert summed(m, "vllm:request_success_total", finished_reason="abort") == 1
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with s.post(url, json=chat_body(stream=False), headers={"X-Sim-Fault": "reset_after=0"}) as resp:
                await resp.read()
        async with s.post(url, json=chat_body(), headers={"X-Sim-Fault": "explode=1"}) as resp:
            assert resp.status == 400


async def test_server_wide_request_fault_and_runtime_switch() -> None:
    async with running_sim(request_faults="status=500") as sim, client() as s:
        url = f"{sim.url}/v1/chat/completions"
        async with s.post(url, json=chat_body()) as resp:
            assert resp.status == 500
        async with s.post(f"{sim.url}/sim/faults", json={"request": ""}) as resp:
            assert resp.status == 200
        async with s.post(url, json=chat_body()) as resp:
            assert resp.status == 200


async def test_metrics_faults_and_counter_reset() -> None:
    async with running_sim() as sim, client() as s:
        await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body())
        before = await scrape(s, sim)
        async with s.post(f"{sim.url}/sim/faults", json={"metrics": "fail"}) as resp:
            assert resp.status == 200
        async with s.get(f"{sim.url}/metrics") as resp:
            assert resp.status == 500
        await s.post(f"{sim.url}/sim/faults", json={"metrics": "hang"})
        with pytest.raises(asyncio.TimeoutError):
            async with s.get(f"{sim.url}/metrics", timeout=aiohttp.ClientTimeout(total=0.3)) as resp:
                await resp.read()
        async with s.post(f"{sim.url}/sim/faults", json={"metrics": "bogus"}) as resp:
            assert resp.status == 400
        await s.post(f"{sim.url}/sim/faults", json={"metrics": "none"})
        await s.post(f"{sim.url}/sim/reset-counters")
        after = await scrape(s, sim)
        assert summed(after, SPEC[2]) < summed(before, SPEC[2])
        assert summed(after, "vllm:generation_tokens_total") == 0
        created = "vllm:spec_decode_num_accepted_tokens_created"
        assert summed(after, created) > summed(before, created) > 0
        async with s.get(f"{sim.url}/sim/truth") as resp:
            assert (await resp.json())["total"]["accepted"] == 0


async def test_stream_interval_merges_steps() -> None:
    async with running_sim() as one, running_sim(stream_interval=3) as three, client() as s:
        _, a = await post_sse(s, f"{one.url}/v1/chat/completions", chat_body(max_tokens=120))
        _, b = await post_sse(s, f"{three.url}/v1/chat/completions", chat_body(max_tokens=120))
        text = ["".join(c["choices"][0]["delta"]["content"] for c in x.json if c["choices"]) for x in (a, b)]
        assert text[0] == text[1]
        content_a, content_b = len(a.json) - 2, len(b.json) - 2
        assert content_b < content_a / 2
        assert b.json[1]["usage"]["completion_tokens"] == 1  # the first output is sent at once


async def test_a_writer_that_lags_merges_the_steps_that_came_meanwhile() -> None:
    """--output-lag-ms: after each chunk the stream's writer is away for about three steps (a step is some 8 ms of
    the simulator's time), as a saturated API server's HTTP task is; the steps that came meanwhile go out as one
    chunk, the same text and token counts, in fewer chunks than steps."""
    async with running_sim() as one, running_sim(output_lag_ms=25) as lagging, client() as s:
        _, a = await post_sse(s, f"{one.url}/v1/chat/completions", chat_body(max_tokens=120))
        _, b = await post_sse(s, f"{lagging.url}/v1/chat/completions", chat_body(max_tokens=120))
        text = ["".join(c["choices"][0]["delta"]["content"] for c in x.json if c["choices"]) for x in (a, b)]
        assert text[0] == text[1]
        assert len(b.json) - 2 < (len(a.json) - 2) / 2
        assert b.json[1]["usage"]["completion_tokens"] == 1  # the first output is sent at once
        steps = len((await truth(s, lagging, b.json[0]["id"]))["per_step_accepted"])
        assert len(b.json) - 2 < steps  # fewer content chunks than the engine's steps


async def test_keepalive_comments_during_silence() -> None:
    async with running_sim(FAST, speed=0.5, keepalive_s=0.01) as sim, client() as s:
        status, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", chat_body(max_tokens=8))
        assert status == 200 and "keep-alive" in sse.comments and sse.data[-1] == "[DONE]"


async def _wait_aborted(s: aiohttp.ClientSession, sim: SimHandle, pick: object, left_at: float) -> dict[str, object]:
    """The aborted request's truth, once there: aborted within 1 s of ``left_at`` (the simulator's clock, no later
    than the client left), however long a busy host takes to show it."""
    for _ in range(500):
        async with s.get(f"{sim.url}/sim/requests") as resp:
            reqs = (await resp.json())["requests"]
        hit = [r for r in reqs if r["aborted"] and (pick is None or r["id"] == pick)]
        if hit:
            t = await truth(s, sim, hit[0]["id"])
            assert t["aborted_at_s"] - left_at < 1.0, (t["aborted_at_s"], left_at)
            return dict(hit[0])
        await asyncio.sleep(0.02)
    raise AssertionError("request never aborted")


async def test_client_disconnect_aborts_during_stall_and_mid_stream() -> None:
    async with running_sim(FAST, speed=1.0, profiles=LONG_PROFILES) as sim, client() as s:
        url = f"{sim.url}/v1/chat/completions"
        # 1 s of patience: the request reaches the simulator well before it gives up, whatever the host's load
        left_at = sim.state.now() + 1.0
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(
                url, json=chat_body(), headers={"X-Sim-Fault": "stall=5"}, timeout=aiohttp.ClientTimeout(total=1.0)
            ):
                pass
        first = await _wait_aborted(s, sim, None, left_at)
        async with s.post(url, json=chat_body(max_tokens=4000)) as resp:
            head = await resp.content.readuntil(b"\n\n")
            rid = orjson.loads(head[len(b"data: ") :])["id"]
            await resp.content.readuntil(b"\n\n")
            left_at = sim.state.now()
            resp.close()
        second = await _wait_aborted(s, sim, rid, left_at)
        t = await truth(s, sim, rid)
        assert t["aborted_at_s"] is not None and 0 < t["completion_tokens"] < 4000
        m = await scrape(s, sim)
        assert summed(m, "vllm:request_success_total", finished_reason="abort") == 2
        assert summed(m, "vllm:num_requests_running") == 0
        assert first["id"] != second["id"]


@pytest.mark.parametrize(
    ("path", "body", "status", "err_type"),
    [
        ("/v1/chat/completions", b"{not json", 400, "BadRequestError"),
        ("/v1/chat/completions", b'{"model": "sim-model"}', 400, "BadRequestError"),
        ("/v1/completions", b'{"model": "sim-model"}', 400, "BadRequestError"),
        (
            "/v1/chat/completions",
            b'{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}',
            404,
            "NotFoundError",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
            400,
            "BadRequestError",
        ),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "BadRequestError"),
    ],
)
async def test_bad_requests_get_vllm_error_shape(path: str, body: bytes, status: int, err_type: str) -> None:
    async with running_sim() as sim, client() as s:
        async with s.post(sim.url + path, data=body, headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == status
            err = (await resp.json())["error"]
        assert list(err) == ["message", "type", "param", "code"]
        assert err["type"] == err_type and err["code"] == status and err["message"]


async def test_health_models_profile_header_and_bounded_truth() -> None:
    async with running_sim(served_model_name="my-model", truth_capacity=2) as sim, client() as s:
        async with s.get(f"{sim.url}/health") as resp:
            assert resp.status == 200 and await resp.read() == b""
        async with s.get(f"{sim.url}/v1/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["my-model"]
        body = chat_body(max_tokens=8, model="my-model", chat_template_kwargs={"enable_thinking": False}, seed=3)
        _, sse = await post_sse(s, f"{sim.url}/v1/chat/completions", body, headers={"X-Sim-Profile": "ja_chat"})
        assert (await truth(s, sim, sse.json[0]["id"]))["profile"] == "ja_chat"
        async with s.post(f"{sim.url}/v1/chat/completions", json=body, headers={"X-Sim-Profile": "nope"}) as resp:
            assert resp.status == 400
        for prompt in (JA_PROMPT, CHAT_PROMPT):
            _, sse = await post_sse(
                s, f"{sim.url}/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
            )
        async with s.get(f"{sim.url}/sim/requests") as resp:
            listed = (await resp.json())["requests"]
        assert [r["profile"] for r in listed] == ["ja_chat", "other"]  # the oldest record was dropped


async def test_five_hundred_concurrent_streams() -> None:
    cfg = SimConfig(port=0, speed=200.0)
    async with running_sim(cfg) as sim, client(limit=0) as s:
        body = chat_body(CHAT_PROMPT, max_tokens=6, usage=False)
        results = await asyncio.gather(*(post_sse(s, f"{sim.url}/v1/chat/completions", body) for _ in range(500)))
        assert all(status == 200 and sse.data[-1] == "[DONE]" for status, sse in results)
        m = await scrape(s, sim)
        assert summed(m, "vllm:request_success_total", finished_reason="length") == 500
        assert summed(m, "vllm:generation_tokens_total") == 500 * 6


async def test_serve_starts_fast_and_stops_when_cancelled() -> None:
    ready = asyncio.Event()
    seen: list[SimHandle] = []
    # the work of starting, in this process's CPU seconds: what a busy host stretches is the wall clock, not this
    # (nothing to wait on while starting: the wait_for bounds that)
    start = time.process_time()
    task = asyncio.create_task(serve(SimConfig(port=0), ready=ready, on_listening=seen.append))
    await asyncio.wait_for(ready.wait(), 5)
    assert time.process_time() - start < 1.0
    async with client() as s, s.get(f"{seen[0].url}/health") as resp:
        assert resp.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(aiohttp.ClientConnectionError):
        async with client() as s, s.get(f"{seen[0].url}/health"):
            pass
