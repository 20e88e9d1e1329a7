"""The bench's client: opens streams, subtracts each event's upstream stamp from its own receipt time.

Run as its own process (``python -m specproxy.bench.client SPEC_JSON``) so that it shares no GIL with the upstream or
the relays; prints one JSON object on stdout. The spec names targets (``{"name", "url", "streams"}``), tokens per
stream, the upstream rate to ask for and how long to spread the starts over. Per target it returns every event's
transit (µs), each stream's time to first event, each stream's largest gap between two events, and counts.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from array import array
from collections import Counter
from typing import Any

import aiohttp

from specproxy.bench.procs import write_result
from specproxy.bench.window import BIN_NS
from specproxy.bench.wire import StampScan, now_ns


class _Target:
    def __init__(self, name: str, url: str, streams: int) -> None:
        self.name, self.url, self.streams = name, url, streams
        self.lat_us = array("q")
        self.ttft_us: list[int] = []
        self.max_gap_us: list[int] = []
        self.events = 0
        self.errors: Counter[str] = Counter()
        self.error_examples: dict[str, str] = {}
        self.statuses: Counter[int] = Counter()
        self.last_ns = 0
        # at saturation: events read per 1 ms bin, and when every stream was in flight (bench/window.py)
        self.bins: dict[int, int] = {}
        self.flowing = 0  # streams that had their first event
        self.all_flowing_ns = 0  # the latest first event
        self.first_end_ns: int | None = None  # the earliest last event
        self.ends: list[tuple[int, int]] = []  # each stream's local port and last event (which relay: by port)

    def result(self, tokens: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "streams": self.streams,
            "expected": self.streams * tokens,
            "events": self.events,
            "lat_us": self.lat_us.tolist(),
            "ttft_us": self.ttft_us,
            "max_gap_us": self.max_gap_us,
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "errors": dict(self.errors),
            "error_examples": self.error_examples,
            "last_ns": self.last_ns,
            "bins": self._bins(),
            "all_flowing_ns": self.all_flowing_ns if self.bins and self.flowing == self.streams else None,
            "first_end_ns": self.first_end_ns,
            "ends": self.ends,
        }

    def _bins(self) -> dict[str, Any] | None:
        if not self.bins:
            return None
        lo, hi = min(self.bins), max(self.bins)
        return {"first": lo, "counts": [self.bins.get(k, 0) for k in range(lo, hi + 1)]}


class _Flow:
    """Says ``flowing`` on stderr once every stream has its first event (the hostile bench waits for it)."""

    def __init__(self, streams: int) -> None:
        self.left = streams

    def first(self) -> None:
        self.left -= 1
        if self.left == 0:
            sys.stderr.write("flowing\n")
            sys.stderr.flush()


async def _stream(
    session: aiohttp.ClientSession, t: _Target, body: bytes, delay_s: float, flow: _Flow, per_read: bool = False
) -> None:
    """One stream: its events counted, their transit times kept (``per_read``: one a read, the newest event's, for
    saturation, where the client must cost less per event than what it measures)."""
    await asyncio.sleep(delay_s)
    scan = StampScan()
    lat = t.lat_us
    bins = t.bins
    t0 = now_ns()
    first = last = 0
    gap = 0
    port = 0
    try:
        async with session.post(
            t.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            t.statuses[r.status] += 1
            port = _local_port(r)
            async for piece in r.content.iter_any():
                now = now_ns()
                if per_read:
                    n, newest = scan.count(piece)
                    if not n:
                        continue
                    if newest is not None:
                        lat.append((now - newest) // 1000)
                    k = now // BIN_NS
                    bins[k] = bins.get(k, 0) + n
                else:
                    stamps = scan.feed(piece)
                    n = len(stamps)
                    if not n:
                        continue
                    for s in stamps:
                        lat.append((now - int(s)) // 1000)
                t.events += n
                if first == 0:
                    first = now
                    t.ttft_us.append((now - t0) // 1000)
                    t.flowing += 1
                    t.all_flowing_ns = max(t.all_flowing_ns, now)
                    flow.first()
                else:
                    gap = max(gap, now - last)
                last = now
    except (TimeoutError, aiohttp.ClientError) as e:
        t.errors[type(e).__name__] += 1
        t.error_examples.setdefault(type(e).__name__, str(e)[:160])
    t.max_gap_us.append(gap // 1000)
    t.last_ns = max(t.last_ns, last)
    if per_read:
        t.first_end_ns = last if t.first_end_ns is None else min(t.first_end_ns, last)
        t.ends.append((port, last))


def _local_port(r: aiohttp.ClientResponse) -> int:
    conn = r.connection
    name = conn.transport.get_extra_info("sockname") if conn is not None and conn.transport is not None else None
    return int(name[1]) if name else 0


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    tokens = int(spec["tokens"])
    req: dict[str, Any] = {
        "model": "bench",
        "messages": [{"role": "user", "content": "Stream tokens."}],
        "max_tokens": tokens,
        "stream": True,
    }
    if spec.get("steps_per_s") is not None:
        req["bench_steps_per_s"] = spec["steps_per_s"]
    body = json.dumps(req).encode()
    targets = [_Target(t["name"], t["url"], int(t["streams"])) for t in spec["targets"]]
    per_read = spec.get("steps_per_s") == 0  # saturation: an unpaced upstream
    total = sum(t.streams for t in targets)
    stagger = float(spec.get("stagger_s", 0.0))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=float(spec.get("timeout_s", 300.0)))
    flow = _Flow(total)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warm = json.dumps({**req, "max_tokens": 1}).encode()
        for t in targets:  # the process's first request pays for lazy setup; not the relay's TTFT
            await _stream(session, _Target("warm", t.url, 1), warm, 0.0, _Flow(1))
        cpu0, t0 = time.process_time(), now_ns()
        jobs = []
        i = 0
        for t in targets:  # targets interleaved in start order, so that each sees the same moments
            for _ in range(t.streams):
                jobs.append(_stream(session, t, body, stagger * i / max(1, total), flow, per_read))
                i += 1
        await asyncio.gather(*jobs)
    return {
        "start_ns": t0,
        "wall_s": (now_ns() - t0) / 1e9,
        "cpu_s": time.process_time() - cpu0,
        "targets": [t.result(tokens) for t in targets],
    }


def main() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import uvloop

    out = uvloop.run(run(json.loads(sys.argv[1])))
    write_result(json.dumps(out).encode())


if __name__ == "__main__":
    main()
