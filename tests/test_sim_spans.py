"""Where drafts land, against the simulator's truth: its mixed corpus has spans of every kind, each with its own
acceptance (``Profile.span_accept``), and it keeps per span type and output position what each step did.

First the engine alone (pure): the classifier finds every step's span, so the per-span counts the recorder would
write equal the truth exactly. Then as a user runs it: ``specproxy sim --profiles`` behind ``specproxy proxy``,
``specproxy report --format json`` on its records and ``/specproxy/status``: per span type, measured acceptance equals
the truth pooled from ``/sim/requests``, and the truth is within 4.5 standard errors of the configured rates (the
bound from each span's number of steps, not from the host's speed)."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from specproxy.attribution.spans import span_block
from specproxy.core.spans import SpanClassifier
from specproxy.sim.config import Profile, SimConfig
from specproxy.sim.engine import EngineCore, new_request
from tests.proxyutil import proxy_process
from tests.simutil import sim_process

K = 3
SPAN_ACCEPT = {
    "code": (0.9, 0.9, 0.9),
    "json": (0.8, 0.8, 0.8),
    "math": (0.6, 0.6, 0.6),
    "cjk": (0.3, 0.3, 0.3),
    "prose": (0.5, 0.5, 0.5),
    "whitespace": (0.95, 0.95, 0.95),
}
MIXED = Profile(
    accept=(0.5,),
    ngram_draft_prob=0.5,
    corpus="mixed",
    min_output_tokens=300,
    max_output_tokens=500,
    span_accept=SPAN_ACCEPT,
)


def _expected_rate(p: float, drafted: int = K) -> float:
    """Acceptance rate of a step drafting ``drafted`` tokens each accepted with p if the one before was."""
    return sum(p**i for i in range(1, drafted + 1)) / drafted


def test_the_engine_truth_per_span_is_what_the_classifier_finds() -> None:
    cfg = SimConfig(num_speculative_tokens=K, profiles={"mixed": MIXED})
    core = EngineCore(cfg)
    reqs = [
        new_request(
            cfg,
            request_id=f"r{i}",
            kind="chat",
            profile_name="mixed",
            prompt_tokens=10,
            max_tokens=600,
            engine=0,
            started_at_s=0.0,
            content_key=f"prompt {i}".encode(),
        )
        for i in range(6)
    ]
    texts: dict[str, list[str]] = {r.id: [] for r in reqs}
    for r in reqs:
        core.submit(r, 0.0)
    t = 0.0
    while core.has_work:
        t += core.begin_step(t)
        for out in core.finish_step(t).outputs:
            texts[out.request_id].append("".join(out.texts))
    for r in reqs:
        c = SpanClassifier()
        steps = texts[r.id]
        codes = bytes(c.feed(s) for s in steps)
        chunks = [(0.0, n) for n in r.truth.step_emitted]
        block = span_block(chunks, codes, chunks_are_steps=True, spec=None)
        assert block is not None
        got = {k: [c["steps"], c["tokens"], c["accepted"]] for k, c in block["types"].items()}
        assert got == {k: v[:3] for k, v in r.truth.spans.items()}, r.id
        got_pos = {k: [c["steps"], c["tokens"], c["accepted"]] for k, c in block["positions"].items()}
        assert got_pos == {k: v[:3] for k, v in r.truth.positions.items()}
        assert set(r.truth.spans) == set(SPAN_ACCEPT)  # every kind of span is there


async def _wait_written(s: aiohttp.ClientSession, url: str, n: int) -> dict[str, Any]:
    for _ in range(1000):  # a condition, polled: every record written
        async with s.get(url + "/specproxy/status") as r:
            status: dict[str, Any] = await r.json()
        if status["records"]["written"] >= n:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"records written: {status['records']}")


async def test_report_and_status_show_acceptance_per_span_as_the_truth(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.json"
    raw = {"mixed": {**{f: getattr(MIXED, f) for f in ("accept", "ngram_draft_prob", "corpus")}}}
    raw["mixed"].update(min_output_tokens=300, max_output_tokens=500, span_accept=SPAN_ACCEPT)
    profiles.write_text(json.dumps(raw))
    record = tmp_path / "records.jsonl"
    n = 12
    async with (
        sim_process("--profiles", str(profiles), "--speed", "20", "--num-speculative-tokens", str(K)) as sim,
        proxy_process(sim, record, "--k", str(K)) as (url, _),
        aiohttp.ClientSession() as s,
    ):

        async def one(i: int) -> str:
            body = {
                "model": "sim-model",
                "messages": [{"role": "user", "content": f"Tell me something, {i}."}],
                "max_tokens": 600,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            headers = {"X-Sim-Profile": "mixed", "X-Specproxy-Workload": "mixed"}
            async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                await r.read()
                return r.headers["X-Specproxy-Request-Id"]

        await asyncio.gather(*(one(i) for i in range(n)))
        status = await _wait_written(s, url, n)
        recs = [orjson.loads(line) for line in record.read_bytes().splitlines()]
        truth: dict[str, list[int]] = {}
        for rec in recs:
            assert rec["spans"]["basis"] == "steps", rec["flags"]
            async with s.get(f"{sim}/sim/requests/{rec['upstream_id']}") as r:
                t = await r.json()
            for k, v in t["spans"].items():
                cell = truth.setdefault(k, [0, 0, 0, 0])
                for j in range(4):
                    cell[j] += v[j]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "report", str(record), "--format", "json", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    (group,) = orjson.loads(out)["groups"]
    types = group["spans"]["types"]
    live = status["workloads"]["mixed"]["spans"]["types"]
    for kind, (steps, _tokens, accepted, drafted) in truth.items():
        assert types[kind]["basis"] == "steps"
        assert (types[kind]["steps"], types[kind]["accepted"]) == (steps, accepted), kind
        assert types[kind]["acceptance_rate"] == live[kind]["acceptance_rate"]
        # the truth against the configured rate: steps cut at a span's end draft fewer that can be accepted, so
        # only spans long enough for that to be rare are held to it
        rate = accepted / drafted
        if kind in ("code", "cjk", "prose", "json"):
            p = SPAN_ACCEPT[kind][0]
            sd = math.sqrt(p * (1 - p) / steps) * 2  # per-step rates correlate across positions: twice the binomial
            assert abs(rate - _expected_rate(p)) < 4.5 * sd + 0.03, (kind, rate, _expected_rate(p), steps)
    assert types["code"]["acceptance_rate"] > types["prose"]["acceptance_rate"] > types["cjk"]["acceptance_rate"]
    assert set(group["spans"]["positions"]) >= {"0", "32", "128"}
    mal = group["spans"]["mean_acceptance_length"]
    assert mal["requests"] == n and mal["pooled"] is not None and mal["per_request"] is not None


def test_profiles_file_takes_span_accept(tmp_path: Path) -> None:
    from specproxy.sim.config import load_profiles

    f = tmp_path / "p.json"
    f.write_text(json.dumps({"m": {"corpus": "mixed", "span_accept": {"code": [0.9, 0.8]}}}))
    prof = load_profiles(f)["m"]
    assert prof.accept_at(1, "code") == 0.8 and prof.accept_at(0, "prose") == prof.accept[0]
    f.write_text(json.dumps({"m": {"span_accept": {"poetry": [0.9]}}}))
    try:
        load_profiles(f)
    except ValueError as e:
        assert "span_accept keys" in str(e)
    else:
        raise AssertionError("an unknown span type was taken")
    assert replace(MIXED, span_accept=None).accept_at(0, "code") == 0.5
