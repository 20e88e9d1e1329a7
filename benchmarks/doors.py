"""What a request costs at the front door: bursts of new streams, each on a new connection, alternated between
``specproxy proxy --workers 1`` with its fast lane, the same with ``--no-fast-lane`` (every request read by aiohttp's
server), and the uvloop TCP splice (:mod:`specproxy.bench.floors`, the least a Python relay can do), in front of one
stamping upstream, round after round.

Per relay: TTFT p50 of each burst and what it adds to direct's in the same round, and the CPU per request of its
relay process and of its bookkeeping process, read from ``/proc/PID/task/*/schedstat`` (nanoseconds, not 10 ms
ticks) around each burst and the ``--gap`` after it; medians over the rounds but the first (connections, caches and
pools warming up). The client is a raw asyncio one (a request written whole, reads until the chunked body's end), so
that it spends little of the cores the relays share with it.

    python -m benchmarks.doors                       # bursts of 256 five-event streams, 12 rounds
    python -m benchmarks.doors --gap 4.5             # 4.5 s apart: each burst opens new upstream connections
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import uvloop

from specproxy.bench.observer import proxy_child
from specproxy.bench.procs import Child, named_stat, python_child, tree


def _request(host: str, tokens: int) -> bytes:
    body = b'{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":%d}' % tokens
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def task_ns(pid: int | None) -> int:
    """CPU nanoseconds of every thread of ``pid`` so far (0 for none, or one that is gone)."""
    if pid is None:
        return 0
    total = 0
    with contextlib.suppress(OSError):
        for t in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
    return total


def _named(root: int, name: str) -> int | None:
    """The first live process of ``root``'s tree called ``name`` (its ``/proc/PID/stat`` name, which is ``comm``)."""
    for pid in tree(root):
        named = named_stat(pid)
        if named is not None and named[0] == name:
            return pid
    return None


async def _stream(host: str, port: int, request: bytes) -> float:
    """One stream on a new connection: seconds from the request's write to the first bytes of the answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        t = time.perf_counter()
        writer.write(request)
        first = await reader.read(65536)
        ttft = time.perf_counter() - t
        data = first
        while data and not data.endswith(b"0\r\n\r\n"):
            data = await reader.read(65536)
        return ttft
    finally:
        writer.close()


async def burst(url: str, streams: int, tokens: int) -> float:
    """TTFT p50 (ms) of ``streams`` streams of ``tokens`` events started at once."""
    hostport = url.rsplit("/", 1)[-1]
    host, port = hostport.rsplit(":", 1)
    request = _request(hostport, tokens)
    ttfts = sorted(await asyncio.gather(*(_stream(host, int(port), request) for _ in range(streams))))
    return ttfts[len(ttfts) // 2] * 1000


async def measure(streams: int, tokens: int, rounds: int, gap_s: float, steps_per_s: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="specproxy-doors-") as tmp:
        up_args = ("-m", "specproxy.bench.upstream", "--steps-per-s", str(steps_per_s))
        async with python_child(*up_args, url_on="stdout") as up:
            splice_args = ("-m", "specproxy.bench.floors", "splice", "--upstream", up.url, "--processes", "1")
            async with (
                proxy_child(up.url, Path(tmp) / "fast.jsonl") as fast,
                proxy_child(up.url, Path(tmp) / "aiohttp.jsonl", "--no-fast-lane") as slow,
                python_child(*splice_args) as splice,
            ):
                return await _rounds(up, [fast, slow, splice], streams, tokens, rounds, gap_s)


async def _rounds(
    up: Child, relays: list[Child], streams: int, tokens: int, rounds: int, gap_s: float
) -> list[dict[str, Any]]:
    names = ["direct", "specproxy --workers 1", "specproxy --workers 1 --no-fast-lane", "floor: uvloop TCP splice"]
    urls = [up.url, *(r.url for r in relays)]
    pids: list[tuple[int | None, int | None]] = [(None, None)]
    for r in relays[:2]:
        for _ in range(100):  # the relay and the bookkeeper are forked once the proxy listens
            relay, keeper = _named(r.pid, "sp-relay-0"), _named(r.pid, "sp-bookkeeper")
            if relay and keeper:
                break
            await asyncio.sleep(0.05)
        pids.append((relay, keeper))
    pids.append((relays[2].pid, None))
    seen: list[list[tuple[float, float, float]]] = [[] for _ in urls]
    for _ in range(rounds):
        for i, url in enumerate(urls):
            relay, keeper = pids[i]
            r0, k0 = task_ns(relay), task_ns(keeper)
            ttft = await burst(url, streams, tokens)
            await asyncio.sleep(gap_s)  # what the burst left to do (the bookkeeping's records) counts for it
            seen[i].append((ttft, (task_ns(relay) - r0) / streams / 1e6, (task_ns(keeper) - k0) / streams / 1e6))
    direct = median(t for t, _, _ in seen[0][1:])
    out = []
    for i, name in enumerate(names):
        kept = seen[i][1:] or seen[i]
        relay, keeper = pids[i]
        out.append(
            {
                "relay": name,
                "ttft_p50_ms": median(t for t, _, _ in kept),
                "ttft_added_ms": median(t for t, _, _ in kept) - direct if i else None,
                "relay_ms_per_request": median(c for _, c, _ in kept) if relay else None,
                "bookkeeping_ms_per_request": median(c for _, _, c in kept) if keeper else None,
            }
        )
    return out


def render(rows: list[dict[str, Any]], streams: int, tokens: int, rounds: int, gap_s: float) -> str:
    def f(v: float | None, fmt: str) -> str:
        return "" if v is None else fmt.format(v)

    lines = [
        f"front doors: bursts of {streams} new streams of {tokens} events, alternated, {rounds} rounds ({gap_s:g} s"
        " after each);"
        " medians over the rounds but the first; CPU per request from schedstat",
        f"{'':40}{'TTFT p50':>10}{'added':>10}{'relay ms/req':>14}{'bookkeeping ms/req':>20}",
    ]
    for r in rows:
        lines.append(
            f"{r['relay']:40}{f(r['ttft_p50_ms'], '{:.1f}'):>10}{f(r['ttft_added_ms'], '{:+.1f}'):>10}"
            f"{f(r['relay_ms_per_request'], '{:.3f}'):>14}{f(r['bookkeeping_ms_per_request'], '{:.3f}'):>20}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.doors", description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=256, help="streams per burst (default 256)")
    p.add_argument("--tokens", type=int, default=5, help="events per stream (default 5)")
    p.add_argument("--rounds", type=int, default=12, help="bursts per relay (default 12; the first is not counted)")
    p.add_argument("--gap", type=float, default=0.5, help="seconds after each burst (default 0.5)")
    p.add_argument("--steps-per-s", type=float, default=25.0, help="the upstream's events per second per stream")
    p.add_argument("--format", choices=("text", "json"), default="text")
    a = p.parse_args(argv)
    if not 1 <= a.streams <= 4096 or not 1 <= a.tokens <= 10000 or not 2 <= a.rounds <= 1000:
        p.error("--streams takes 1 to 4096, --tokens 1 to 10,000, --rounds 2 to 1,000")
    if not 0 <= a.gap <= 60 or not a.steps_per_s > 0:
        p.error("--gap takes 0 to 60 seconds, --steps-per-s a rate above 0")
    rows = uvloop.run(measure(a.streams, a.tokens, a.rounds, a.gap, a.steps_per_s))
    if a.format == "json":
        print(json.dumps({"streams": a.streams, "tokens": a.tokens, "rounds": a.rounds, "gap_s": a.gap, "rows": rows}))
    else:
        print(render(rows, a.streams, a.tokens, a.rounds, a.gap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
