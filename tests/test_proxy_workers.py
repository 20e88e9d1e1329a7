"""``specproxy proxy --workers N`` as users run it: relay processes on one port, one bookkeeping process.

Records complete through the bookkeeper; two relays serve one port and attribution stays close to the simulator's
truth; a stalled bookkeeper slows no stream and sheds, counted and flagged; a stop mid-stream records ``shutdown``
and leaves no process; a killed bookkeeper breaks no stream and makes the exit say records were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.core.record import read_records
from tests.proxyutil import proxy_process
from tests.simutil import CODE_PROMPT, JA_PROMPT, chat_body, sim_process
from tests.test_proxy_sim_attribution import _mixed_plan, truth_at


async def _status(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/specproxy/status") as r:
        assert r.status == 200
        st: dict[str, Any] = await r.json()
        return st


async def _stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any], workload: str = "w") -> tuple[str, float]:
    """Relay one request; (its request id, the longest gap between two reads the client saw)."""
    async with s.post(url + "/v1/chat/completions", json=body, headers={"X-Specproxy-Workload": workload}) as r:
        assert r.status == 200
        last = time.monotonic()
        gap = 0.0
        async for _ in r.content.iter_any():
            now = time.monotonic()
            gap = max(gap, now - last)
            last = now
        return r.headers["X-Specproxy-Request-Id"], gap


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for every purpose but its exit status
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _until_ready(s: aiohttp.ClientSession, url: str, relays: int) -> dict[str, Any]:
    for _ in range(500):
        st = await _status(s, url)
        if st["engine"]["scrapes_ok"] and len(st["bookkeeping"]["relay_pids"]) == relays:
            return st
        await asyncio.sleep(0.02)
    raise AssertionError(f"never ready: {st}")


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


async def test_two_relays_one_port_every_record_and_acceptance_close_to_truth(tmp_path: Path) -> None:
    """240 mixed requests at concurrency 32 through two relays, counters only (no usage): every request is recorded
    once, both relays served, and per-workload acceptance is within 3 points of the simulator's counters."""
    record = tmp_path / "r.jsonl"
    plan = _mixed_plan(240, 7)  # the one-process test's plan: fewer requests leave the per-workload fit too loose
    async with sim_process("--seed", "7") as sim_url, aiohttp.ClientSession() as s:
        async with proxy_process(sim_url, record, "--workers", os.environ.get("W", "2"), "--k", "3") as (url, proc_):
            proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
            st = await _until_ready(s, url, max(1, int(os.environ.get("W", "2"))))
            pids = [st["bookkeeping"]["pid"], *st["bookkeeping"]["relay_pids"]]
            assert proc.pid not in pids and len(set(pids)) == 3
            # named for ps and top, and for the bench's CPU split by role
            names = [_comm(p) for p in pids]
            assert names[0] == "sp-bookkeeper" and sorted(names[1:]) == ["sp-relay-0", "sp-relay-1"]
            sem = asyncio.Semaphore(32)

            async def one(workload: str, prompt: str) -> str:
                # a new connection per request: the kernel spreads connections, not requests, over relays
                async with sem, aiohttp.ClientSession() as own:
                    rid, _ = await _stream(own, url, chat_body(prompt, usage=False, max_tokens=160), workload)
                    return rid

            ids = await asyncio.gather(*(one(w, p) for w, p in plan))
            after = (await _status(s, url))["bookkeeping"]
            served = [r["requests"] for r in after["per_relay"]]
            assert len(served) == 2 and all(n > 0 for n in served) and sum(served) >= 240  # + the status queries
            # aiohttp's client sends plain POSTs and GETs: the fast lane read them all, the status queries too
            assert after["fast_lane_requests"] >= 240 and after["handed_to_aiohttp"] == 0
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert not any(_alive(p) for p in pids)
        recs = list(read_records(record))
        assert sorted(r["request_id"] for r in recs) == sorted(ids)  # each exactly once, through the bookkeeper
        assert all(r["outcome"] == "ok" and r["chunks"] and r["completion_tokens"] for r in recs)
        assert all("bookkeeping_shed" not in r["flags"] for r in recs)
        measured: dict[str, list[float]] = {}
        true: dict[str, list[float]] = {}
        for rec in recs:
            t = await truth_at(s, sim_url, rec["upstream_id"])
            assert rec["spec"]["source"] == "counters"
            m = measured.setdefault(rec["workload"], [0.0, 0.0])
            m[0] += rec["spec"]["accepted"]
            m[1] += rec["spec"]["draft_tokens"]
            tt = true.setdefault(rec["workload"], [0.0, 0.0])
            tt[0] += t["counted_accepted"]
            tt[1] += t["draft_tokens"]
    rates = {w: (measured[w][0] / measured[w][1], true[w][0] / true[w][1]) for w in true}
    assert rates["code_agent"][1] > rates["ja_chat"][1] + 0.2  # the workloads really differ
    for w, (m_rate, t_rate) in rates.items():
        assert abs(m_rate - t_rate) <= 0.03, (w, m_rate, t_rate)


async def test_a_stalled_bookkeeper_slows_no_stream_and_sheds_counted_and_flagged(tmp_path: Path) -> None:
    """The bookkeeping process stopped dead (SIGSTOP) while streams run: they run as fast as before, the relay sheds
    chunk events past its small buffer, and once the bookkeeper resumes every request still has its record,
    the shed ones flagged, the counts in /specproxy/status and /specproxy/metrics."""
    record = tmp_path / "r.jsonl"
    args = ("--workers", "1", "--metrics-url", "none", "--bookkeeping-buffer", "64KB", "--capture", "none")
    async with (
        sim_process("--speed", "10") as sim_url,
        proxy_process(sim_url, record, *args) as (url, proc_),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        st = await _until_ready_no_scrape(s, url)
        keeper = int(st["bookkeeping"]["pid"])
        body = chat_body(CODE_PROMPT, max_tokens=400)
        _, gap_before = await _stream(s, url, body)
        os.kill(keeper, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*(_stream(s, url, body) for _ in range(32))), 30)
            took = time.monotonic() - t0
        finally:
            os.kill(keeper, signal.SIGCONT)
        assert took < 15  # the streams did not wait for the stopped bookkeeper
        assert max(g for _, g in results) < max(0.5, 10 * gap_before)  # nor did any read
        st = await _status(s, url)
        shed = st["bookkeeping"]["shed"]
        assert shed["chunk"] > 0 and st["bookkeeping"]["shed_requests"] > 0
        async with s.get(url + "/specproxy/metrics") as r:
            metrics = await r.text()
        assert 'specproxy_bookkeeping_shed_total{kind="chunk"} 0.0' not in metrics
        assert 'specproxy_bookkeeping_shed_total{kind="chunk"}' in metrics
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0  # shed, not lost: every record written
    recs = list(read_records(record))
    assert len(recs) == 33  # the first, the 32 and no other (status queries are not relayed)
    flagged = [r for r in recs if "bookkeeping_shed" in r["flags"]]
    assert len(flagged) == st["bookkeeping"]["shed_requests"] > 0
    assert all(r["outcome"] == "ok" for r in recs)
    whole = [r for r in recs if "bookkeeping_shed" not in r["flags"]]
    assert whole and all(r["completion_tokens"] for r in whole)


async def _until_ready_no_scrape(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    for _ in range(500):
        st = await _status(s, url)
        if st["bookkeeping"]["relay_pids"]:
            return st
        await asyncio.sleep(0.02)
    raise AssertionError("the relay never reported")


async def _until_in_flight(s: aiohttp.ClientSession, url: str, n: int) -> None:
    for _ in range(1000):
        if (await _status(s, url))["in_flight"] == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{n} requests never were in flight together")


async def test_sigterm_mid_stream_records_shutdown_and_leaves_no_process(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    args = ("--workers", "2", "--metrics-url", "none", "--drain-timeout", "0.5")
    async with (
        sim_process("--speed", "1") as sim_url,
        proxy_process(sim_url, record, *args) as (url, proc_),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        st = await _until_ready_no_scrape(s, url)
        pids = [st["bookkeeping"]["pid"], *st["bookkeeping"]["relay_pids"]]
        streams = [asyncio.ensure_future(_stream(s, url, chat_body(JA_PROMPT, max_tokens=2000))) for _ in range(6)]
        await _until_in_flight(s, url, 6)  # every stream has begun
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0  # cut by the drain timeout: the configured way to stop
        for fut in streams:
            with contextlib.suppress(aiohttp.ClientError):
                await fut
    assert not any(_alive(p) for p in pids)
    recs = list(read_records(record))
    assert len(recs) == 6
    assert {r["outcome"] for r in recs} == {"shutdown"}
    assert all("drain timeout" in str(r["error"]) and r["chunks"] for r in recs)


async def test_a_killed_bookkeeper_breaks_no_stream_and_the_exit_says_records_were_lost(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    async with (
        sim_process("--speed", "10") as sim_url,
        proxy_process(sim_url, record, "--workers", "1", "--metrics-url", "none") as (url, proc_),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        st = await _until_ready_no_scrape(s, url)
        keeper, relay = st["bookkeeping"]["pid"], st["bookkeeping"]["relay_pids"][0]
        body = chat_body(CODE_PROMPT, max_tokens=200)
        streams = [asyncio.ensure_future(_stream(s, url, body)) for _ in range(4)]
        await _until_in_flight(s, url, 4)  # the bookkeeper dies under streams that flow, however slow the host
        os.kill(keeper, signal.SIGKILL)
        done = await asyncio.wait_for(asyncio.gather(*streams), 30)  # every stream ends cleanly
        assert len(done) == 4
        await _stream(s, url, body)  # and new ones are relayed (recorded once a new bookkeeper has started)
        assert _alive(relay)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 1
        assert proc.stderr is not None
        err = await proc.stderr.read()
    assert b"records were lost" in err
    assert not _alive(relay)
