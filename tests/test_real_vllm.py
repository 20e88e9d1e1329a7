"""End to end against a real vLLM (CPU build, SmolLM2-135M, ngram k = 3, per-request speculative figures): the
``ngram_engine`` fixture sets it up once and starts it for the session (tests/conftest.py), or uses the engine at
``SPECPROXY_VLLM_URL``. The server's own per-request figures and its counters, read here directly, are the truth.

Requests alone are checked exactly; requests that overlap within run-to-run noise. Nothing asserts which workload
gains more: with this small model Japanese chat repeats itself and is accepted more than code."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from benchmarks.workers_accuracy import spinning
from specproxy.analysis.compare.model import build_comparison
from specproxy.analysis.tables import fmt_pct
from specproxy.core.dialects.engine import OFF_ENGINE, OFF_ENGINE_FLAG
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
# Copying a list: its stop token is the last token of its step (3 tokens of 4, then the stop token).
STOPS_AT_STEP_END = "Repeat this list exactly: apple, banana, cherry, apple, banana, cherry."
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
        "decode_steps": (a.decode_steps or 0) - (b.decode_steps or 0),
        "generation_tokens": (a.generation_tokens or 0) - (b.generation_tokens or 0),
    }


def _check_alone(events: list[dict[str, Any]], delta: dict[str, Any], rec: Record, k: int) -> int:
    """What holds for every request alone on the engine, however it ended; returns the tokens its last step brought
    beyond the end of the output (drafts accepted, then discarded at the stop token or the max_tokens cut).

    The engine produced 1 token at prefill and 1 + accepted at each decode step (the inter-token latency histogram
    counts decode steps); whatever of that is not in the output was accepted and counted, never emitted."""
    server = _server_figures(events)
    steps = _steps(events)
    emitted, accepted = sum(steps), server["num_accepted_draft_tokens"]
    beyond = 1 + delta["decode_steps"] + accepted - emitted
    assert 0 <= beyond <= k, (beyond, steps, server, delta)
    # the server's own figures and the counter delta are the same numbers, position by position
    assert (accepted, server["num_draft_tokens"], server["num_spec_steps"]) == (
        delta["accepted"], delta["draft_tokens"], delta["drafts"],
    ), (server, delta)  # fmt: skip
    est = rec["spec"]["estimates"]
    assert est["server"] is not None and est["counters"] is not None and est["chunks"] is not None
    assert rec["spec"]["source"] == "server" and est["counters"]["exact"]
    assert est["server"]["accepted"] == accepted
    if rec["finish_reason"] == "length" or beyond == 0:
        assert est["counters"]["accepted"] == accepted
        assert est["counters"]["per_position"] == delta["per_position"]
    else:  # a stop token inside the last step: the attribution gives that tail to nobody (docs/real-engine.md)
        assert est["counters"]["accepted"] == accepted - beyond
    assert rec["completion_tokens"] == emitted
    if "chunks_fewer_than_steps" not in rec["flags"]:  # the API server merged no steps into one chunk
        assert len(steps) == 1 + delta["decode_steps"], (steps, delta)
        chunk_accepted = sum(n - 1 for n in steps[1:])
        assert chunk_accepted == est["chunks"]["accepted"] == accepted - beyond, (steps, server)
    return int(beyond)


async def test_a_request_that_stops_by_itself_chunks_server_and_counters_agree(
    ngram_engine: RealEngine, tmp_path: Path
) -> None:
    """A request whose stop token ends its engine step: the chunk-derived accepted count, the server's per-request
    figure and the counter delta are one number. A stop token inside a step discards the drafts accepted after it,
    as a max_tokens cut does (COPY_CODE's last step brings 4 tokens, the stop token is the second)."""
    bodies = [_body(STOPS_AT_STEP_END, 200), _body(COPY_CODE, 200)]
    results = await _alone(ngram_engine, tmp_path, bodies)
    beyond = []
    for events, delta, rec in results:
        assert rec["finish_reason"] == "stop" and not rec["truncated"]
        beyond.append(_check_alone(events, delta, rec, ngram_engine.k))
    events, delta, rec = results[0]
    assert beyond[0] == 0 and delta["accepted"] > 0  # speculation did something to agree on
    if "chunks_fewer_than_steps" not in rec["flags"]:
        chunk_accepted = sum(n - 1 for n in _steps(events)[1:])
        assert chunk_accepted == _server_figures(events)["num_accepted_draft_tokens"] == delta["accepted"]
    assert beyond[1] >= 1, "the stop token no longer falls inside COPY_CODE's last step: pick another prompt"


async def test_a_request_cut_by_max_tokens_counts_drafts_it_never_emitted(
    ngram_engine: RealEngine, tmp_path: Path
) -> None:
    """vLLM counts the last step's accepted drafts before it cuts the output at max_tokens: the counters exceed what
    was emitted by what that step brought beyond the cut (COPY_CODE decodes 1, 4, 4, 1... tokens per step, so cuts
    at 6 to 9 tokens leave 3, 2, 1 and 0 beyond), and the record says it was cut (``truncated``) and keeps both."""
    bodies = [_body(COPY_CODE, n) for n in (6, 7, 8, 9)]
    beyond = []
    for body, (events, delta, rec) in zip(bodies, await _alone(ngram_engine, tmp_path, bodies), strict=True):
        assert rec["finish_reason"] == "length" and rec["truncated"], rec
        assert rec["completion_tokens"] == body["max_tokens"]
        beyond.append(_check_alone(events, delta, rec, ngram_engine.k))
        est = rec["spec"]["estimates"]
        if "chunks_fewer_than_steps" not in rec["flags"]:
            assert est["counters"]["accepted"] - est["chunks"]["accepted"] == beyond[-1]  # type: ignore[index]
    assert any(1 <= b <= ngram_engine.k for b in beyond), beyond


async def _generate(target: str, engine: RealEngine, out: Path, workloads: str, requests: int) -> None:
    """``specproxy run`` as a user runs it: closed loop at concurrency 4, round-robin over the workloads' first items
    (no seed), so a workload's requests are the same prompts alone or mixed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "run", "--target", target, "--workload", workloads,
        "--requests", str(requests), "--concurrency", "4", "--max-tokens", "64", "--model", MODEL,
        "--metrics-url", engine.url + "/metrics", "--k", str(engine.k), "--out", str(out), "--no-progress",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, (stdout.decode() + stderr.decode())[-3000:]


def _acceptance(recs: list[Record], source: str) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for r in recs:
        est = r["spec"]["estimates"][source]  # type: ignore[index, literal-required]
        per = sums.setdefault(r["workload"], [0.0, 0.0])
        per[0] += est["accepted"]
        per[1] += est["draft_tokens"]
    return {w: a / d for w, (a, d) in sums.items()}


def _check_shares(who: str, recs: list[Record], totals: dict[str, Any]) -> None:
    """A recorder's counters figures in a mixed run: every counter delta went to a request, and per workload the
    shares stay close to the server's own figures."""
    # every counter delta of the run went to a request: exactly, but for steps the API server merged into one
    # chunk when it fell behind (a busy machine), each of which makes a request's "tokens - chunks" one more
    chunks = sum(len(r["chunks"]) for r in recs)
    merged = len(recs) + totals["decode_steps"] - chunks
    server = sum(r["spec"]["estimates"]["server"]["accepted"] for r in recs)  # type: ignore[index, misc]
    # A reader that fell far behind (the load generator beside busy processes) can read a whole reply in one read
    # after the engine counted its steps: its chunks then never meet the interval of their steps, and the record
    # has no counters figure (1 of 16 records, in 4 of 35 runs of this test, 2026-12-03). Those requests' part
    # of the delta is their server figure here
    counted = [r for r in recs if r["spec"]["estimates"].get("counters") is not None]
    for r in recs:
        assert r in counted or ("multi_event_reads" in r["flags"] and len({t for t, _ in r["chunks"]}) == 1), r
    attributed = {
        key: sum(r["spec"]["estimates"]["counters"][key] for r in counted)  # type: ignore[index, misc]
        + sum(r["spec"]["estimates"]["server"][key] for r in recs if r not in counted)  # type: ignore[index, misc]
        for key in ("accepted", "drafts", "draft_tokens")
    }
    assert merged >= 0 and len(counted) >= len(recs) - 2
    assert server == totals["accepted"]
    # Not exact (measured here, 12 requests at concurrency 4 on a busy 2-core machine: accepted +4.4 to +4.5 %;
    # docs/real-engine.md), but close; drafts within 3 % through the proxy (each request takes its part of an
    # interval's hidden drafts once, so the parts add up to the delta: docs/attribution.md; what is left is requests
    # whose chunks a busy host read too late for their interval). The load generator reads in the process that
    # drives the requests and lags on a busy host: its late chunks meet other intervals' deltas, and one busy run of
    # 16 shared 4.2 % fewer drafts than the delta
    drafts_bound = 0.03 if who == "proxy" else 0.05
    for key, bound in (("accepted", 0.08), ("drafts", drafts_bound), ("draft_tokens", drafts_bound)):
        assert attributed[key] == pytest.approx(totals[key], rel=bound, abs=merged), (who, key, attributed, totals)
    # and per workload, the shares of overlapping requests stay close to the server's own figures. With ngram
    # (not every step drafts) a request's drafts hidden in one-token steps follow from its share of multi-token
    # steps and its workload's first-draft acceptance, fitted over the run's intervals: a dozen or two here, as
    # the engine gives per-request figures and the proxy then scrapes seldom. Seen 0.1-3.9 points off in two
    # quiet runs, up to 8.6 beside two busy processes (the load generator, whose reads lag most). Before that
    # model (a drafting rate per workload, fitted freely) the same test read up to 15 points off through the
    # proxy and 31 for the load generator on a busy host (docs/real-engine.md). Under a busy CI run (the suite
    # beside two busy processes) reads lag further and move chunks across intervals, which no drafting model
    # undoes: 18.8 points through the proxy and 24.0 for the load generator in one run of three (an unsolved
    # drift). So these bounds catch a share gone wrong altogether; the quiet figures are in docs/real-engine.md
    server, shared = _acceptance(counted, "server"), _acceptance(counted, "counters")
    assert set(shared) == {"ja_chat", "code_agent"}
    for w in shared:
        assert abs(shared[w] - server[w]) <= (0.20 if who == "proxy" else 0.25), (who, w, shared, server)


async def test_mixed_run_attribution_sums_to_the_counters_and_matches_separate_runs(
    ngram_engine: RealEngine, tmp_path: Path
) -> None:
    """ja_chat and code_agent at concurrency 4 through the proxy, with the load generator recording too; then each
    workload alone on the same prompts. Also: both recorders' files are complete and parse."""
    per_workload = 8
    async with aiohttp.ClientSession() as s:
        mixed_proxy, mixed_gen = tmp_path / "mixed-proxy.jsonl", tmp_path / "mixed-gen.jsonl"
        before = await _settled(s, ngram_engine)
        async with proxy_process(ngram_engine.url, mixed_proxy, "--k", str(ngram_engine.k)) as (url, _):
            await _generate(url, ngram_engine, mixed_gen, "ja_chat,code_agent", 2 * per_workload)
        totals = _minus(await _settled(s, ngram_engine), before)
        alone: dict[str, float] = {}
        for workload in ("ja_chat", "code_agent"):
            out = tmp_path / f"{workload}.jsonl"
            await _generate(ngram_engine.url, ngram_engine, out, workload, per_workload)
            alone.update(_acceptance(list(read_records(out)), "server"))

    _complete_and_parse(mixed_proxy, 2 * per_workload)
    _complete_and_parse(mixed_gen, 2 * per_workload)
    proxy_recs, gen_recs = _completions(mixed_proxy), _completions(mixed_gen)
    # the two recorders saw the same responses, token for token
    assert {r["upstream_id"]: r["completion_tokens"] for r in proxy_recs} == {
        r["upstream_id"]: r["completion_tokens"] for r in gen_recs
    }
    for who, recs in (("proxy", proxy_recs), ("load generator", gen_recs)):
        _check_shares(who, recs, totals)
    await _report_shows_where_drafts_land(mixed_proxy, proxy_recs)
    # mixed or alone, a workload's acceptance is the same within run-to-run noise (batching changes bf16 numerics,
    # so texts and acceptance move between runs: with 8 requests, one reply that turns repetitive moves the pooled
    # figure; seen in CI on the server's own figures: code_agent 0.532 alone, 0.635 mixed)
    mixed = _acceptance(proxy_recs, "server")
    for w in mixed:
        assert abs(mixed[w] - alone[w]) <= 0.12, (w, mixed, alone)


async def test_mixed_run_through_the_proxy_on_a_busy_host(ngram_engine: RealEngine, tmp_path: Path) -> None:
    """The mixed run through the proxy while two processes spin on the machine's cores (a production host runs other
    work; the engine, the proxy and the client share those cores with them): drafts within 3 % of the counters'
    delta, and the per-workload shares as in the quiet run. The server's own figures are the truth, so the bound
    holds however slow the host is."""
    record = tmp_path / "busy-proxy.jsonl"
    async with aiohttp.ClientSession() as s:
        before = await _settled(s, ngram_engine)
        with spinning(2):
            async with proxy_process(ngram_engine.url, record, "--k", str(ngram_engine.k)) as (url, _):
                await _generate(url, ngram_engine, tmp_path / "busy-gen.jsonl", "ja_chat,code_agent", 16)
        totals = _minus(await _settled(s, ngram_engine), before)
    _complete_and_parse(record, 16)
    _check_shares("proxy", _completions(record), totals)


async def _report_shows_where_drafts_land(path: Path, recs: list[Record]) -> None:
    """``specproxy report --format json`` as a user runs it: per workload, where drafts landed (span types and output
    positions), measured from the chunks (engine steps), adding up to every decode step and accepted draft."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "report", str(path), "--format", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    groups = {g["key"]["workload"]: g for g in json.loads(out)["groups"]}
    for w in ("ja_chat", "code_agent"):
        mine = [r for r in recs if r["workload"] == w]
        # measured where chunks are steps (all of them on a quiet host; a merged event makes a record's shared)
        measured = [r for r in mine if r["chunks_are_steps"]]
        assert len(measured) >= len(mine) / 2, [r["flags"] for r in mine]
        decode = [n for r in measured for n in [n for _, n in r["chunks"] if n > 0][1:]]  # the steps after prefill
        spans = groups[w]["spans"]
        assert spans is not None and spans["types"] and spans["positions"], (w, spans)
        for table in ("types", "positions"):
            cells = [c for c in spans[table].values() if c["basis"] == "steps"]
            assert sum(c["steps"] for c in cells) == len(decode), (w, table)
            assert sum(c["tokens"] for c in cells) == sum(decode), (w, table)
            assert sum(c["accepted"] for c in cells) == sum(n - 1 for n in decode), (w, table)
        assert "0" in spans["positions"]
        mal = spans["mean_acceptance_length"]
        assert mal["requests"] == len(mine) and mal["pooled"] > 1 and mal["per_request"] > 1


def _complete_and_parse(path: Path, expected: int) -> None:
    """Every line is JSON with every field of the schema, reads back unchanged through the typed reader, and the
    figures a report needs are there."""
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    recs = [raw for raw in lines if "correction_of" not in raw and raw["path"].endswith("/completions")]
    assert len(recs) == expected
    for raw in recs:
        assert set(Record.__annotations__) - {"read_bytes_per_token"} <= set(raw), sorted(
            set(Record.__annotations__) - set(raw)
        )
        typed = as_record(raw)
        assert json.loads(json.dumps(typed)) == {k: raw[k] for k in typed}, "the typed reader lost or changed a field"
        assert raw["outcome"] == "ok" and raw["status"] == 200, raw
        # ngram drafts on some steps only; under load a read can hold two steps' chunks, and vLLM's API server, when
        # it falls behind its engine, merges the outputs of two steps into one event (RequestOutputCollector): more
        # tokens than a step can bring, or steps the engine counted that never came as chunks (put back: unmerged)
        allowed = {
            "partial_drafting",
            "multi_event_reads",
            "decode_rate_off_engine",
            "stream_interval_suspected",
            "steps_unmerged",
        }
        assert set(raw["flags"]) <= allowed, raw["flags"]
        assert raw["ttft_s"] > 0 and raw["completion_tokens"] == sum(n for _, n in raw["chunks"])
        # no decode rate only when the reply came in one read (a recorder that did not run while the engine decoded)
        assert (raw["decode_tok_s"] is not None and raw["decode_tok_s"] > 0) or (
            "multi_event_reads" in raw["flags"] and len({t for t, _ in raw["chunks"]}) == 1
        ), raw
        assert raw["token_source"] == "usage" and raw["spec"]["source"] == "server"
        offsets = [t for t, _ in raw["chunks"]]
        assert offsets == sorted(offsets) and offsets[-1] <= raw["e2e_s"]


async def test_the_openai_client_streams_through_the_proxy_unchanged(ngram_engine: RealEngine, tmp_path: Path) -> None:
    """The same greedy request, straight to the engine and through the proxy, with the official client: the same
    text, chunk for chunk, and the same usage and per-request figures."""

    async def chunks(base: str) -> list[Any]:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": COPY_CODE}],
                max_tokens=120,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            )
            return [c async for c in stream]
        finally:
            await client.close()

    direct = await chunks(ngram_engine.url)
    record = tmp_path / "proxy.jsonl"
    async with proxy_process(ngram_engine.url, record) as (url, _):
        proxied = await chunks(url)

    def shape(cs: list[Any]) -> list[tuple[Any, ...]]:
        return [
            (c.object, c.model, [(ch.index, ch.delta.content, ch.finish_reason) for ch in c.choices],
             c.usage.completion_tokens if c.usage else None)
            for c in cs
        ]  # fmt: skip

    assert shape(proxied) == shape(direct)
    # the per-request figures too (their timings differ from run to run)
    spec = [c.model_extra["metrics"]["speculative_decoding"] for c in (proxied[-1], direct[-1])]  # type: ignore[index]
    assert spec[0] == spec[1]
    assert "".join(c.choices[0].delta.content or "" for c in proxied if c.choices).strip()
    [rec] = _completions(record)
    assert rec["upstream_id"] == proxied[0].id and rec["outcome"] == "ok"


async def test_a_client_that_disconnects_aborts_the_engine_request(ngram_engine: RealEngine, tmp_path: Path) -> None:
    record = tmp_path / "proxy.jsonl"
    # as long as the context allows: unless aborted it decodes for many seconds even on a fast host, so a count short
    # of max_tokens can only be an abort
    max_tokens = 1900
    body = _body("Tell me a long story about a lighthouse keeper.", max_tokens, ignore_eos=True)
    loop = asyncio.get_running_loop()
    async with proxy_process(ngram_engine.url, record) as (url, _), aiohttp.ClientSession() as s:
        before = await _settled(s, ngram_engine)
        sent = loop.time()
        async with s.post(url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200
            arrived: list[float] = []  # when each read came, from the request's start
            async for _ in r.content.iter_any():
                arrived.append(round(loop.time() - sent, 3))
                if len(arrived) >= 5:
                    break
            # the request decodes for many seconds: it is running now. (One CI run read 0 here, and its record said
            # the stream had run to its end; if this fails again, these times say whether the reads came late.)
            gauges = [await _gauge(s, ngram_engine, "vllm:num_requests_running")]
            while gauges[-1] != 1 and len(gauges) < 20:
                await asyncio.sleep(0.1)
                gauges.append(await _gauge(s, ngram_engine, "vllm:num_requests_running"))
            assert gauges[-1] == 1, f"reads at {arrived} s; gauges {gauges}, the last at {loop.time() - sent:.3f} s"
            r.close()  # the client goes away mid-stream
        left_at = loop.time()
        left = 1.0
        for _ in range(200):
            left = sum([await _gauge(s, ngram_engine, f"vllm:num_requests_{g}") for g in ("running", "waiting")])
            if left == 0:
                break
            await asyncio.sleep(0.1)
        gone_after = loop.time() - left_at
        after = await _settled(s, ngram_engine)
    [rec] = _completions(record)
    seen_by_proxy = f"the proxy recorded outcome {rec['outcome']} ({rec.get('error')})"
    assert rec["outcome"] == "client_cancelled", seen_by_proxy
    assert left == 0, f"still decoding {gone_after:.1f} s after the client left; {seen_by_proxy}"
    assert after.generation_tokens is not None and before.generation_tokens is not None
    decoded = after.generation_tokens - before.generation_tokens
    # aborted, not run to its end: nothing is left running, and fewer than max_tokens were decoded (ignore_eos: a
    # request left to run decodes every one). How many came before the client left depends on the host's speed and
    # on how often ngram matches the reply (a repetitive story brings several tokens a step): one CI host decoded
    # 1,140 before the abort
    assert decoded < max_tokens, f"{decoded:.0f} tokens decoded, {gone_after:.1f} s to go; {seen_by_proxy}"


MATRIX_PROMPTS = {  # (workload, prompts): short, so that the matrix and the manual method fit in about a minute
    "code": [
        "Add type hints to this function and return it whole:\n```python\ndef area(w, h):\n    return w * h\n```",
        COPY_CODE,
        "Write a Python function `is_even(n)` that returns True when n is even, and a test for it.",
    ],
    "chat": [
        "こんにちは。今日はなんだか疲れちゃって…。甘いものに合うコーヒーってありますか？",
        "週末に京都へ行きます。おすすめの散歩道を教えてください。",
        "猫が毎朝五時に起こしてくるんです。どうしたらいいでしょう？",
    ],
}
MATRIX_MAX_TOKENS = 64


def _workload_file(folder: Path, name: str, prompts: list[str]) -> Path:
    doc = {
        "format_version": 1, "name": name, "description": f"{len(prompts)} short {name} prompts",
        "max_tokens": MATRIX_MAX_TOKENS,
        "items": [{"id": f"{name}-{i}", "messages": [{"role": "user", "content": p}]} for i, p in enumerate(prompts)],
    }  # fmt: skip
    path = folder / f"{name}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return path


async def _manual(
    s: aiohttp.ClientSession, engine: RealEngine, bodies: list[dict[str, Any]]
) -> tuple[float, list[float | None], list[float | None]]:
    """The seeds' method for one workload: /metrics before, each request alone straight to the engine, streamed with
    usage and timed here, /metrics after. (acceptance, each request's decode tok/s) with acceptance = delta accepted /
    delta draft tokens, decode tok/s = (completion_tokens - 1) / (last token's time - first token's time).

    A token's time is that of the chunk whose running usage count (``continuous_usage_stats``, which the bodies ask
    for) first includes it, not that of the first chunk with text. SmolLM2's byte-level tokens often end inside a
    Japanese character, so vLLM streams them with empty text (seen: the first token at 0.927 s with text "", the first
    text at 1.052 s with 5 tokens), and an end-of-sequence token has no text either (an 18-token code reply: its last
    token came 124 ms after its last text). Timing by text left those out of the time but not of the count: that
    chat reply read 5.7 % faster, that code reply 25 % (34.7 against 27.7 tok/s), and the matrix, which times
    tokens, looked up to 17 % slower than the method by hand."""
    before = await _settled(s, engine)
    rates: list[float | None] = []
    engine_rates: list[float | None] = []
    for body in bodies:
        assert body.get("stream_options", {}).get("continuous_usage_stats"), body  # the token times come from it
        first = last = None
        tokens = 0
        engine_rate = None
        async with s.post(engine.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            buf = b""
            async for data in r.content.iter_any():
                now = time.perf_counter()
                buf += data
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        e = json.loads(line[6:])
                        if (m := e.get("metrics")) and m.get("generation_time_ms"):
                            engine_rate = ((e.get("usage") or {}).get("completion_tokens", 1) - 1) / (
                                m["generation_time_ms"] / 1e3
                            )
                        count = (e.get("usage") or {}).get("completion_tokens") or 0
                        if count > tokens:  # this chunk brought tokens (text or not)
                            first = now if first is None else first
                            last = now
                            tokens = count
        assert first is not None and last is not None and tokens > 1, (body, tokens)
        # None when every token came in one read: a client that did not run while the engine decoded cannot time it
        rates.append((tokens - 1) / (last - first) if last > first else None)
        engine_rates.append(engine_rate)
    delta = _minus(await _settled(s, engine), before)
    assert delta["draft_tokens"] > 0
    return delta["accepted"] / delta["draft_tokens"], rates, engine_rates


async def _matrix_table(tmp_path: Path, engine: RealEngine, round_: int) -> tuple[dict[str, Any], list[Record]]:
    """``specproxy matrix`` through the real command line, one ``url`` configuration (the running engine: measured,
    not started, left running): the comparison rows it printed, by workload, and its records."""
    files = [_workload_file(tmp_path, name, prompts) for name, prompts in MATRIX_PROMPTS.items()]
    results = tmp_path / f"results-{round_}"
    doc = {
        "workloads": [str(f) for f in files], "requests": 3, "warmup": 1, "repeats": 1, "concurrency": 1,
        "max_tokens": MATRIX_MAX_TOKENS, "model": MODEL, "results": str(results),
        "configurations": [{"label": "ngram-n3", "url": engine.url}],
    }  # fmt: skip
    path = tmp_path / f"m{round_}.yaml"
    path.write_text(json.dumps(doc, ensure_ascii=False))
    # At the same priority as the method by hand (this process): a measuring process at nice 10 on a machine as busy
    # as its cores read whole replies in one read, the times of their tokens lost (docs/real-engine.md).
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "matrix", str(path), "--no-progress",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, err = await asyncio.wait_for(p.communicate(), 180)
    assert p.returncode == 0, err.decode()[-2000:]
    printed = out.decode()
    assert printed.strip() and printed == (results / "summary.txt").read_text()
    recs = [r for r in read_records(results / "ngram-n3.jsonl") if r["path"].endswith("/completions")]
    assert len(recs) == 6 and all(r["status"] == 200 for r in recs)
    table = {row.workload: row for row in build_comparison(recs).rows}  # the rows the matrix printed
    assert set(table) == set(MATRIX_PROMPTS)
    for name, row in table.items():
        assert row.label == "ngram-n3" and row.requests == 3 and row.tok_s.value is not None
        assert row.acceptance_rate is not None and fmt_pct(row.acceptance_rate) in printed, (name, printed)
    return table, recs


async def test_matrix_reproduces_the_manual_method_on_the_same_prompts(
    ngram_engine: RealEngine, tmp_path: Path
) -> None:
    """``specproxy matrix`` over the running engine, then the seeds' method by hand on the same requests in the same
    order: per workload, acceptance within 0.02 (temperature 0, the same text, so the same drafts) and decode tok/s
    within 10 %, each request against itself.

    The engine's own speed is not the same in two runs of the same request: on this shared 2-core machine, round
    medians of the same three requests moved between 20.4 and 27.8 tok/s, and one CI run read every request by hand
    faster than alone (21-23 tok/s against 17-20) while the matrix read 18-19. So each request's decode tok/s is taken
    over the engine's own timing of that very run (vLLM's ``generation_time_ms``, ``--enable-per-request-metrics``,
    which the matrix's records keep in ``engine_timings``): per workload, the median over three rounds of (matrix over
    engine) must be within 15 % of 1, the matrix's clock against the truth, and the median of (matrix over engine)
    over (by hand over engine) within 10 %, the two methods against each other. Records that say their chunks
    arrived late (``decode_rate_off_engine``; by hand, the same rule on rates) are left out of both, which need three
    records each: on a busy host they are many. The raw ratio, matrix over by hand, is printed. The order alternates
    (matrix first, then by hand first, then matrix first). A request either side read in one piece (every token in
    one read: its process did not run while the engine decoded) cannot be timed and is left out; at most a third may
    be. The matrix's printed figure is the median of its records' (checked here)."""
    ratios: dict[str, list[float]] = {name: [] for name in MATRIX_PROMPTS}
    seen: dict[str, list[tuple[float, float | None]]] = {name: [] for name in MATRIX_PROMPTS}
    # per request: (round, matrix's rate, the engine's own rate then, the rate by hand, the engine's own rate then)
    detail: dict[str, list[tuple[Any, ...]]] = {name: [] for name in MATRIX_PROMPTS}
    sent_bodies: dict[str, list[dict[str, Any]]] = {}
    async with aiohttp.ClientSession() as s:
        for round_ in range(3):
            manual: dict[str, tuple[float, list[float | None], list[float | None]]] = {}
            if round_ % 2:  # by hand first, on the bodies the matrix sent before
                for name in MATRIX_PROMPTS:
                    manual[name] = await _manual(s, ngram_engine, sent_bodies[name])
            table, recs = await _matrix_table(tmp_path, ngram_engine, round_)
            async with s.get(ngram_engine.url + "/health") as r:
                assert r.status == 200  # the matrix left the server it did not start running
            for name in MATRIX_PROMPTS:
                sent = sorted((r for r in recs if r["workload"] == name), key=lambda r: r["started_at"] or 0.0)
                bodies = [dict(r["request"]) for r in sent]  # the same bodies in the same order, timed here
                assert sorted(b["messages"][0]["content"] for b in bodies) == sorted(MATRIX_PROMPTS[name])
                assert sent_bodies.setdefault(name, bodies) == bodies  # every round sends the same requests
                if name not in manual:
                    manual[name] = await _manual(s, ngram_engine, bodies)
                manual_acc, manual_rates, manual_engine = manual[name]
                acc, tok_s = table[name].acceptance_rate, table[name].tok_s.value
                assert acc is not None and tok_s is not None
                assert abs(acc - manual_acc) <= 0.02, (name, round_, acc, manual_acc)
                mine = [r["decode_tok_s"] for r in sent]
                assert tok_s == pytest.approx(statistics.median(m for m in mine if m is not None))  # its records'
                for r, hand, hand_engine in zip(sent, manual_rates, manual_engine, strict=True):
                    t = r["engine_timings"] or {}
                    assert t.get("decode_s") and hand_engine, (r, hand_engine)  # the engine timed both runs
                    engine_rate = t["decode_tokens"] / t["decode_s"]
                    late = OFF_ENGINE_FLAG in r["flags"]  # the record says its chunks arrived late
                    detail[name].append((round_, r["decode_tok_s"], engine_rate, hand, hand_engine, late))
                    if r["decode_tok_s"] and hand:
                        ratios[name].append(r["decode_tok_s"] / hand)
                timed_by_hand = [h for h in manual_rates if h is not None]  # none: every reply read in one piece
                seen[name].append((tok_s, statistics.median(timed_by_hand) if timed_by_hand else None))
    sys.stderr.write(f"\nmatrix / by hand, per request: {ratios}\nmedians per round: {seen}\n")
    for name, rows in detail.items():
        for row in rows:
            sys.stderr.write(
                f"{name} round {row[0]}: matrix {row[1]} (engine {row[2]:.2f}) by hand {row[3]} (engine {row[4]:.2f})"
                f"{' flagged late' if row[5] else ''}\n"
            )
    for name, rows in detail.items():
        timed = [(m / e, h / he, late) for _, m, e, h, he, late in rows if m and h]
        assert len(timed) >= 6, (name, rows)  # at most a third read in one piece
        # the chunks' timing against the engine's own: within 1 % quiet. Beside two busy processes on the 2 cores
        # that also run the engine, reads come late (the engine's API server and the reader descheduled) and a short
        # reply's span moves by half either way (0.50 to 2.30 in one run); each such record says so
        # (decode_rate_off_engine), and those that do not must be right
        trusted = [m for m, _, late in timed if not late]
        if len(trusted) >= 3:
            against_engine = statistics.median(trusted)
            assert abs(against_engine - 1.0) <= 0.15, (name, "matrix over the engine's own", against_engine, rows)
        # by hand is read the same way (and judged late by the same rule, on rates), so the matrix against by hand
        # stays within 10 %
        pairs = [m / h for m, h, late in timed if not late and abs(h - 1.0) <= OFF_ENGINE]
        if len(pairs) >= 3:
            against_hand = statistics.median(pairs)
            assert abs(against_hand - 1.0) <= 0.10, (name, "matrix over by hand, each over the engine's", pairs, rows)
