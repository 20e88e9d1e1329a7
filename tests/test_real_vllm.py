"""End to end against a real vLLM (CPU build, SmolLM2-135M, ngram k = 3, per-request speculative figures): the
``ngram_engine`` fixture sets it up once and starts it for the session (tests/conftest.py), or uses the engine at
``SPECPROXY_VLLM_URL``. The server's own per-request figures and its counters, read here directly, are the truth.

Requests alone are checked exactly; requests that overlap within run-to-run noise. Nothing asserts which workload
gains more: with this small model Japanese chat repeats itself and is accepted more than code."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from specproxy.core.prom import SpecCounters, gauge, parse_snapshot, spec_counters
from specproxy.core.record import Record, as_record, read_records
from tests.conftest import RealEngine
from tests.proxyutil import proxy_process

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

MODEL = "smollm2"
# Copying code back: ngram finds its drafts in the prompt, accepts many, and the model stops by itself.
COPY_CODE = (
    "Repeat this Python code exactly, with no explanation:\n```python\ndef mean(values):\n"
    "    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n```"
)
HEADERS = {"X-Specproxy-Workload": "code_agent"}


def _body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **extra,
    }


async def _counters(s: aiohttp.ClientSession, engine: RealEngine) -> SpecCounters:
    async with s.get(engine.url + "/metrics") as r:
        return spec_counters("vllm", parse_snapshot(await r.text()).values)


async def _gauge(s: aiohttp.ClientSession, engine: RealEngine, name: str) -> float:
    async with s.get(engine.url + "/metrics") as r:
        return gauge(parse_snapshot(await r.text()), name) or 0.0


async def _settled(s: aiohttp.ClientSession, engine: RealEngine) -> SpecCounters:
    """The counters once the engine has nothing running (the last step's stats are in)."""
    for _ in range(100):
        if await _gauge(s, engine, "vllm:num_requests_running") == 0:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    return await _counters(s, engine)


async def _stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every JSON event of one streamed response."""
    events = []
    async with s.post(url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
        assert r.status == 200, await r.text()
        buf = b""
        async for data in r.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        events.append(json.loads(line[6:]))
    return events


def _steps(events: list[dict[str, Any]]) -> list[int]:
    """Tokens per content chunk, from the cumulative continuous usage (the role chunk carries none)."""
    out, last = [], 0
    for e in events:
        if e.get("choices") and e.get("usage"):
            n = e["usage"]["completion_tokens"]
            if n > last:
                out.append(n - last)
                last = n
    return out


def _server_figures(events: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(events[-1]["metrics"]["speculative_decoding"])


def _completions(path: Path) -> list[Record]:
    return [r for r in read_records(path) if r["path"].endswith("/completions")]


async def _alone(engine: RealEngine, tmp_path: Path, bodies: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each body alone through the proxy: (events, counter delta read here, the proxy's record)."""
    out = []
    record = tmp_path / "proxy.jsonl"
    async with proxy_process(engine.url, record, "--k", str(engine.k)) as (url, _), aiohttp.ClientSession() as s:
        for body in bodies:
            before = await _settled(s, engine)
            events = await _stream(s, url, body)
            after = await _settled(s, engine)
            out.append((events, _minus(after, before)))
    recs = _completions(record)
    assert len(recs) == len(bodies)
    by_id = {r["upstream_id"]: r for r in recs}
    return [(ev, delta, by_id[ev[0]["id"]]) for ev, delta in out]


def _minus(a: SpecCounters, b: SpecCounters) -> dict[str, Any]:
    assert a.accepted is not None and b.accepted is not None and a.drafts is not None and b.drafts is not None
    assert a.draft_tokens is not None and b.draft_tokens is not None
    return {
        "accepted": a.accepted - b.accepted,
        "drafts": a.drafts - b.drafts,
        "draft_tokens": a.draft_tokens - b.draft_tokens,
        "per_position": [x - y for x, y in zip(a.per_position, b.per_position, strict=True)],
    }


async def test_a_request_that_stops_by_itself_chunks_server_and_counters_agree(
    ngram_engine: RealEngine, tmp_path: Path
) -> None:
    [(events, delta, rec)] = await _alone(ngram_engine, tmp_path, [_body(COPY_CODE, 200)])
    assert rec["finish_reason"] == "stop" and not rec["truncated"]
    steps = _steps(events)
    chunk_accepted = sum(n - 1 for n in steps[1:])
    server = _server_figures(events)
    assert chunk_accepted > 0, steps  # speculation did something to agree on
    assert server["num_accepted_draft_tokens"] == chunk_accepted == delta["accepted"], (server, steps, delta)
    assert sum(server["per_step_accepted"]) == chunk_accepted
    assert server["num_draft_tokens"] == delta["draft_tokens"]
    # ...and the proxy's record says the same from each source
    est = rec["spec"]["estimates"]
    assert rec["spec"]["source"] == "server"
    assert est["server"]["accepted"] == est["counters"]["accepted"] == delta["accepted"]  # type: ignore[index]
    assert est["counters"]["per_position"] == delta["per_position"]  # type: ignore[index]
    assert est["counters"]["exact"]  # type: ignore[index]
    assert rec["completion_tokens"] == sum(steps)


async def test_a_request_cut_by_max_tokens_counts_drafts_it_never_emitted(
    ngram_engine: RealEngine, tmp_path: Path
) -> None:
    """vLLM counts the last step's accepted drafts before it cuts the output at max_tokens: the counters exceed what
    was emitted by exactly what that step brought beyond the cut, 1 to k when it brought more than the cut let out."""
    k = ngram_engine.k
    bodies = [_body(COPY_CODE, n) for n in (21, 22, 23, 24)]
    beyond_the_cut = []
    for body, (events, delta, rec) in zip(bodies, await _alone(ngram_engine, tmp_path, bodies), strict=True):
        assert rec["finish_reason"] == "length" and rec["truncated"], rec
        steps = _steps(events)
        emitted_accepted = sum(n - 1 for n in steps[1:])
        server = _server_figures(events)
        last_step_tokens = 1 + server["per_step_accepted"][-1]
        unemitted = last_step_tokens - steps[-1]
        assert 0 <= unemitted <= k, (steps, server)
        assert delta["accepted"] - emitted_accepted == unemitted, (delta, steps, server)
        assert server["num_accepted_draft_tokens"] == delta["accepted"]
        est = rec["spec"]["estimates"]
        assert est["chunks"] is not None and est["counters"] is not None
        assert est["counters"]["accepted"] - est["chunks"]["accepted"] == unemitted  # the record keeps both
        assert rec["completion_tokens"] == sum(steps) == body["max_tokens"]
        beyond_the_cut.append(unemitted)
    assert any(1 <= u <= k for u in beyond_the_cut), beyond_the_cut
