"""Per-workload acceptance from counters alone through ``specproxy proxy --workers N``, against the simulator's truth.

    python -m benchmarks.workers_accuracy --workers 8 --concurrency 64 --requests 240 --seed 7
    python -m benchmarks.workers_accuracy --workers 2 --concurrency 32 --spin 3      # a busy host: 3 spinning processes

The run of ``tests/test_proxy_workers.py``'s two-relay test at any N and concurrency: the simulator and the proxy each
in their own process, mixed ja_chat / code_agent requests without usage (so acceptance comes from the engine's
counters alone), each on a connection of its own so that the kernel spreads them over the relays. Prints, per
workload, the acceptance the records give and the simulator's, and how many requests each relay served. With
``--spin N``, N processes spin (``while 1: pass``) for the whole run, as other work on a production host does, and
the machine's runnable processes (median over the run) are printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.core.record import read_records
from tests.proxyutil import proxy_process
from tests.simutil import chat_body, sim_process
from tests.test_proxy_sim_attribution import _mixed_plan, truth_at


async def _status(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/specproxy/status") as r:
        r.raise_for_status()
        doc: dict[str, Any] = await r.json()
        return doc


async def _ready(s: aiohttp.ClientSession, url: str, relays: int) -> None:
    for _ in range(1000):
        st = await _status(s, url)
        if st.get("partial"):  # the relay's own view: the bookkeeper did not answer in time
            await asyncio.sleep(0.02)
            continue
        if st["engine"]["scrapes_ok"] and len(st["bookkeeping"]["relay_pids"]) == relays:
            return
        await asyncio.sleep(0.02)
    raise RuntimeError(f"the proxy never had {relays} relays and a scrape: {st.get('bookkeeping')}")


def runnable() -> int:
    """Processes running or ready to run on the machine now (the kernel's count in /proc/loadavg)."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


async def _sample_runnable(into: list[int]) -> None:
    while True:
        into.append(runnable())
        await asyncio.sleep(0.2)


@contextlib.contextmanager
def spinning(n: int) -> Any:
    """``n`` processes that keep a core busy each, until the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def run(workers: int, concurrency: int, requests: int, seed: int, k: int = 3, spin: int = 0) -> dict[str, Any]:
    plan = _mixed_plan(requests, seed)
    with tempfile.TemporaryDirectory() as d, spinning(spin):
        record = Path(d) / "r.jsonl"
        async with sim_process("--seed", str(seed)) as sim_url, aiohttp.ClientSession() as s:
            async with proxy_process(sim_url, record, "--workers", str(workers), "--k", str(k)) as (url, proc_):
                proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
                await _ready(s, url, workers)
                sem = asyncio.Semaphore(concurrency)

                async def one(workload: str, prompt: str) -> str:
                    async with sem, aiohttp.ClientSession() as own:  # a connection of its own: spread over relays
                        body = chat_body(prompt, usage=False, max_tokens=160)
                        async with own.post(
                            url + "/v1/chat/completions", json=body, headers={"X-Specproxy-Workload": workload}
                        ) as r:
                            r.raise_for_status()
                            await r.read()
                            return r.headers["X-Specproxy-Request-Id"]

                t0 = time.monotonic()
                samples: list[int] = []
                sampler = asyncio.create_task(_sample_runnable(samples))
                ids = await asyncio.gather(*(one(w, p) for w, p in plan))
                sampler.cancel()
                wall = time.monotonic() - t0
                load = sorted(samples)[len(samples) // 2] if samples else runnable()
                st = await _status(s, url)
                served = [int(r["requests"]) for r in st["bookkeeping"]["per_relay"]]
                proc.send_signal(signal.SIGTERM)
                code = await asyncio.wait_for(proc.wait(), 60)
            recs: list[dict[str, Any]] = [dict(r) for r in read_records(record)]
            measured: dict[str, list[float]] = {}
            true: dict[str, list[float]] = {}
            for rec in recs:
                t = await truth_at(s, sim_url, rec["upstream_id"])
                m = measured.setdefault(rec["workload"], [0.0, 0.0])
                m[0] += rec["spec"]["accepted"]
                m[1] += rec["spec"]["draft_tokens"]
                tt = true.setdefault(rec["workload"], [0.0, 0.0])
                tt[0] += t["counted_accepted"]
                tt[1] += t["draft_tokens"]
    rates = {w: {"measured": measured[w][0] / measured[w][1], "truth": true[w][0] / true[w][1]} for w in true}
    for r in rates.values():
        r["off_points"] = 100 * (r["measured"] - r["truth"])
    return {
        "workers": workers,
        "concurrency": concurrency,
        "requests": requests,
        "seed": seed,
        "spinning": spin,
        "runnable_p50": load,
        "cores": os.cpu_count(),
        "wall_s": wall,
        "exit_code": code,
        "records": len(recs),
        "every_request_once": sorted(r["request_id"] for r in recs) == sorted(ids),
        "sources": sorted({r["spec"]["source"] for r in recs if r.get("spec")}),
        "shed_flagged": sum("bookkeeping_shed" in r["flags"] for r in recs),
        "served_per_relay": served,
        "acceptance": rates,
        "within_3_points": all(abs(r["off_points"]) <= 3.0 for r in rates.values()),
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.workers_accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--spin", type=int, default=0, help="processes spinning beside the run (a busy host)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the lines")
    a = p.parse_args()
    doc = asyncio.run(run(a.workers, a.concurrency, a.requests, a.seed, spin=a.spin))
    if a.json:
        print(json.dumps(doc))
        return
    print(
        f"--workers {doc['workers']}, concurrency {doc['concurrency']}, {doc['requests']} requests (seed"
        f" {doc['seed']}) in {doc['wall_s']:.1f} s, {doc['spinning']} processes spinning, {doc['runnable_p50']}"
        f" runnable (median) on {doc['cores']} cores; {doc['records']} records, sources {doc['sources']},"
        f" {doc['shed_flagged']} flagged shed; served per relay {doc['served_per_relay']}"
    )
    for w, r in sorted(doc["acceptance"].items()):
        print(f"{w:12s} acceptance {r['measured']:.4f}  truth {r['truth']:.4f}  off by {r['off_points']:+.1f} points")
    print("within 3 points: " + ("yes" if doc["within_3_points"] else "NO"))


if __name__ == "__main__":
    main()
