"""``specproxy bench``: the stamping upstream and client measure what they should, and the bench's output holds.

All over real loopback sockets with the real processes (upstream, client, proxy, nginx when installed).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specproxy.bench.procs import nginx_path, python_child, spawn_client
from specproxy.bench.window import BIN_NS
from specproxy.bench.wire import StampScan, event
from specproxy.core.prom import SpecCounters, detect_engine, parse_snapshot, spec_counters
from tests.proxyutil import running_proxy


def test_stamps_survive_any_split() -> None:
    data = b"".join(event(i, 1_000_000 + i) for i in range(5)) + b"data: [DONE]\n\n"
    for cut in range(1, len(data)):
        scan = StampScan()
        got = scan.feed(data[:cut]) + scan.feed(data[cut:])
        assert [int(s) for s in got] == [1_000_000 + i for i in range(5)], cut


def test_counted_stamps_survive_any_split() -> None:
    """The saturation client's count: every event once, whatever the reads, and each read's newest stamp."""
    data = b"".join(event(i, 1_000_000 + i) for i in range(5)) + b"data: [DONE]\n\n"
    for cut in range(1, len(data)):
        scan = StampScan()
        (a, newest_a), (b, newest_b) = scan.count(data[:cut]), scan.count(data[cut:])
        assert a + b == 5, cut
        assert (newest_a is None) == (a == 0) and (newest_b is None) == (b == 0), cut
        assert newest_a is None or newest_a == 1_000_000 + a - 1, cut
        assert (newest_b if b else newest_a) == 1_000_004, cut


async def _delaying_relay(upstream: str, delay_s: float) -> TestServer:
    """A pass-through that holds every piece exactly ``delay_s`` after it arrived (no accumulation)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read(r: aiohttp.ClientResponse) -> None:
            async for piece in r.content.iter_any():
                queue.put_nowait((loop.time() + delay_s, piece))
            queue.put_nowait(None)

        async with (
            aiohttp.ClientSession() as s,
            s.post(upstream + request.path, data=body, headers={"Content-Type": "application/json"}) as r,
        ):
            reader = asyncio.create_task(read(r))
            while (item := await queue.get()) is not None:
                await asyncio.sleep(max(0.0, item[0] - loop.time()))
                await resp.write(item[1])
            await reader
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    return server


async def test_client_measures_an_injected_delay() -> None:
    delay_ms = 40.0
    async with python_child("-m", "specproxy.bench.upstream", "--steps-per-s", "20", url_on="stdout") as up:
        relay = await _delaying_relay(up.url, delay_ms / 1000)
        try:
            spec = {
                "targets": [
                    {"name": "direct", "url": up.url, "streams": 3},
                    {"name": "delayed", "url": str(relay.make_url("")).rstrip("/"), "streams": 3},
                ],
                "tokens": 8,
                "steps_per_s": 20,
                "stagger_s": 0.05,
            }
            out = json.loads(await spawn_client(json.dumps(spec)))
        finally:
            await relay.close()
    direct, delayed = out["targets"]
    for t in (direct, delayed):
        assert t["events"] == t["expected"] == 24 and not t["errors"]
        assert t["statuses"] == {"200": 3}
        assert all(x >= 0 for x in t["lat_us"])
    p50 = sorted(delayed["lat_us"])[12] / 1000 - sorted(direct["lat_us"])[12] / 1000
    assert delay_ms - 5 <= p50 <= delay_ms + 30, p50
    # the delay is per event, not per stream: the first event is late by it too, gaps are not
    assert min(delayed["ttft_us"]) / 1000 >= delay_ms - 5
    assert max(delayed["max_gap_us"]) / 1000 < 50 + 30  # 20 steps/s: 50 ms between events either way


async def test_at_saturation_the_client_bins_every_event_and_says_when_all_its_streams_were_in_flight() -> None:
    """The window of bench/window.py: every event counted once in a 1 ms bin, the last first event after the last
    request sent and before the first last event. A stream's first event may come before another stream's request is
    sent, so the first bin says nothing about when the last request went out."""
    async with python_child("-m", "specproxy.bench.upstream", "--steps-per-s", "0", url_on="stdout") as up:
        spec = {"targets": [{"name": "direct", "url": up.url, "streams": 4}], "tokens": 20000, "steps_per_s": 0}
        (t,) = json.loads(await spawn_client(json.dumps(spec)))["targets"]
    assert t["events"] == t["expected"] == 4 * 20000 and not t["errors"]
    assert sum(t["bins"]["counts"]) == t["events"]
    assert t["bins"]["first"] * BIN_NS <= t["all_flowing_ns"]
    assert t["all_started_ns"] < t["all_flowing_ns"] < t["first_end_ns"] <= t["last_ns"]
    assert t["last_ns"] < (t["bins"]["first"] + len(t["bins"]["counts"])) * BIN_NS


def _bench(*args: str) -> dict:  # type: ignore[type-arg]
    p = subprocess.run(
        [sys.executable, "-m", "specproxy", "bench", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_bench_side_by_side_at_a_tiny_scale() -> None:
    r = _bench("--streams", "3", "--tokens", "8", "--steps-per-s", "50", "--saturation-streams", "2",
               "--saturation-tokens", "200", "--workers", "2", "--floors", "--aiohttp-door")  # fmt: skip
    (level,) = r["levels"]
    assert level["streams"] == 3
    names = [row["relay"] for row in level["rows"]]
    assert names[0] == "direct" and any(n.startswith("specproxy") for n in names)
    if "specproxy --workers 1" in names:  # and beside it, every request read by aiohttp's server
        assert names.index("specproxy --workers 1 --no-fast-lane") > names.index("specproxy --workers 2")
    if nginx_path() is not None:
        assert any(n.startswith("nginx") for n in names)
    else:
        assert any(n.startswith("nginx skipped") for n in r["notes"])
    if not any(n.startswith("specproxy --workers") for n in names):
        assert any("no --workers option" in n for n in r["notes"])
    for row in level["rows"]:
        assert row["events"] == row["expected"] == 3 * 8 and row["statuses"] == {"200": 3} and not row["errors"]
        assert 0 < row["lat_p50_ms"] <= row["lat_p99_ms"] < 1000
        assert 0 < row["ttft_p50_ms"] < 5000
        if row["relay"] != "direct":
            assert row["added_p50_ms"] > -0.5  # a relay cannot make events arrive sooner (beyond noise)
            assert row["cpu_ms_per_1000"] >= 0 and row["rss_peak_mb"] > 1
    # beside specproxy --workers 1 and 2, the splice in one process and in two (the scaling of the least a relay does)
    assert names[-3:] == ["floor: aiohttp pass-through", "floor: uvloop TCP splice", "floor: uvloop TCP splice x2"]
    sat = r["saturation"]
    assert [s["relay"] for s in sat] == names
    assert all(s["events"] == s["expected"] == 400 for s in sat)
    assert [s["splices"] for s in sat[-3:]] == [None, 1, 2] and all(s["splices"] is None for s in sat[:-3])
    one, two = sat[-2:]
    assert one["vs_one_splice"] == 1.0 and two["vs_one_splice"] == two["chunks_per_s"] / one["chunks_per_s"]
    assert all(s["vs_one_splice"] is None for s in sat[:-2])
    for s in sat:  # the CPU split by role: specproxy's relay and bookkeeping processes, none for the others
        split = s["relay_only_cpu_ms_per_1000"], s["bookkeeping_cpu_ms_per_1000"]
        if s["relay"].startswith("specproxy --workers"):
            tick = 0.01 * 1e6 / s["events"]  # one clock tick, in ms per 1,000 events: the two reads are not atomic
            assert all(x is not None and x >= 0 for x in split) and sum(split) <= s["cpu_ms_per_1000"] + 2 * tick
        else:
            assert split == (None, None)
    assert r["client_capacity"]["chunks_per_s_per_process"] > 0
    assert all(isinstance(t["pass"], bool) for t in r["targets"])


@pytest.mark.slow
def test_bench_hostile_inputs_get_answers() -> None:
    r = _bench("--hostile", "--hostile-streams", "2", "--tokens", "20", "--steps-per-s", "50")
    rows = {row["input"].split(",")[0].split(":")[0]: row for row in r["inputs"]}
    assert len(r["inputs"]) == 6 and "none (reference)" in rows
    for row in r["inputs"]:
        if row["refused"]:  # a rule the proxy refuses at start is an answer too
            assert row["status"].startswith("refused at start")
            continue
        assert row["events"] == row["expected"] == 2 * 20 and not row["errors"]
        assert row["rss_peak_mb"] > 1 and row["gap_added_ms"] is not None
        assert row["answered"], row
    body = rows["60 MB JSON body of tiny elements"]
    assert body["status"] in ("200", "400", "413")
    flood = rows["upstream"]  # more interim replies than the relay reads before an answer: refused, 502
    assert flood["status"].startswith("502"), flood


@pytest.mark.slow
def test_soak_records_every_request_with_the_outcome_the_client_saw() -> None:
    """A short soak: streams through the proxy with client cancels and upstream resets (TCP RST); every request has
    exactly one record, with the outcome the client saw, and RSS was sampled throughout."""
    # the soak's seed (0) draws a cancel (2nd request) and a reset (7th) among the first 8, which start at once
    r = _bench("--soak", "6", "--soak-streams", "8", "--steps-per-s", "50")
    client = r["client_outcomes"]
    assert r["requests"] == sum(client.values()) > 8
    assert client.get("cancelled", 0) > 0 and client.get("reset", 0) > 0 and client.get("ok", 0) > 0, client
    assert set(client) <= {"ok", "cancelled", "reset"}, client  # nothing broke that was not meant to
    assert r["records"] == r["requests"] and r["every_request_one_record"] and r["outcomes_match"], r
    assert len(r["rss_samples"]) >= 5 and all(mb > 1 for _, mb in r["rss_samples"])
    assert isinstance(r["flat"], bool)
    procs = r["processes"]  # RSS per process, each with its growth per 1,000 requests
    assert {"main", "sp-bookkeeper"} <= set(procs) and any(n.startswith("sp-relay-") for n in procs), sorted(procs)
    for p in procs.values():
        assert len(p["samples"]) >= 5 and all(mb > 1 for _, _, mb in p["samples"])
        assert p["slope_mb_per_1000"] is not None and isinstance(p["passed"], bool)
    done = [n for _, n in r["requests_samples"]]
    assert done == sorted(done) and 0 < done[-1] <= r["requests"]


async def test_the_upstream_counts_what_vllm_would_and_the_proxy_attributes_it(tmp_path: Path) -> None:
    """The bench's upstream moves vLLM's speculative counters with the events it sends, so a bench through the proxy
    pays for attribution as in front of vLLM: a request alone gets exactly the counters' figures."""
    async with (
        python_child("-m", "specproxy.bench.upstream", "--steps-per-s", "200", url_on="stdout") as up,
        running_proxy(up.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        before = await _spec(s, up.url)
        body = {"model": "bench", "stream": True, "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(px.url + "/v1/chat/completions", json=body) as r:
            text = (await r.read()).decode()
        after = await _spec(s, up.url)
        await px.flush()
        (rec,) = px.records()
    tokens = text.count("tok ")
    assert after.generation_tokens - before.generation_tokens == tokens > 9  # some steps brought several tokens
    assert after.drafts - before.drafts == after.decode_steps - before.decode_steps == 8  # every event but the first
    assert after.draft_tokens - before.draft_tokens == 8 * 3
    accepted = after.accepted - before.accepted
    assert accepted == tokens - 9 and accepted == sum(after.per_position) - sum(before.per_position)
    assert rec["spec"]["drafts"] == 8 and rec["spec"]["accepted"] == accepted, rec["spec"]


async def _spec(s: aiohttp.ClientSession, url: str) -> SpecCounters:
    async with s.get(url + "/metrics") as r:
        snap = parse_snapshot(await r.text())
    return spec_counters(detect_engine(snap), snap.values)


async def test_the_in_process_measure_runs_the_real_per_event_paths() -> None:
    """The relay's per-read path and the bookkeeper's per-event path, as ``python -m benchmarks.inprocess``
    measures them: every figure a positive CPU time, and a read of 100 events cheaper per event than 100 reads."""
    from benchmarks.inprocess import measure

    got = await measure(2000)
    assert all(0 < v < 10_000 for v in got.values()), got
    assert got["relay_us_per_event_100_per_read"] < got["relay_us_per_read_1_event"], got


def test_the_front_doors_bench_measures_each_door() -> None:
    """`python -m benchmarks.doors` at a tiny scale: a row per door and the splice, TTFT from every burst, CPU
    per request of each relay process and each bookkeeper; bad arguments are one line and exit 2."""
    args = ["--streams", "4", "--tokens", "2", "--rounds", "2", "--gap", "0.2", "--format", "json"]
    out = subprocess.run([sys.executable, "-m", "benchmarks.doors", *args], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    doc = json.loads(out.stdout)
    rows = {r["relay"]: r for r in doc["rows"]}
    assert list(rows) == [
        "direct", "specproxy --workers 1", "specproxy --workers 1 --no-fast-lane", "floor: uvloop TCP splice",
    ]  # fmt: skip
    assert all(r["ttft_p50_ms"] > 0 for r in rows.values()) and rows["direct"]["ttft_added_ms"] is None
    for name in ("specproxy --workers 1", "specproxy --workers 1 --no-fast-lane"):
        assert rows[name]["relay_ms_per_request"] > 0 and rows[name]["bookkeeping_ms_per_request"] > 0
    assert rows["floor: uvloop TCP splice"]["relay_ms_per_request"] > 0
    assert rows["floor: uvloop TCP splice"]["bookkeeping_ms_per_request"] is None
    bad = subprocess.run([sys.executable, "-m", "benchmarks.doors", "--rounds", "1"], capture_output=True)
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr and b"--rounds" in bad.stderr
