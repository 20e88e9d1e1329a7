"""``specproxy bench``: what the proxy costs, measured side by side in one run.

A fast simulator (``specproxy sim --speed X``) and a proxy in front of it run as their own processes, as they would
in production; this process is the client. Rounds alternate between talking to the simulator directly and through
the proxy, so that a noisy machine hits both alike; the figures are medians over rounds and the ratios are what to
read. The proxy's own bookkeeping per relayed read comes from its ``specproxy_proxy_overhead_seconds`` histogram.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specproxy.core.record import read_records
from specproxy.core.stats import median, percentile

_URL = re.compile(rb"(http://[\d.]+:\d+)")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    concurrency: int = 32
    requests: int = 128  # per round and path
    max_tokens: int = 256
    rounds: int = 5
    speed: float = 20.0  # simulator speed: 20 = a step every ~0.4 ms at batch 1


@dataclass(frozen=True, slots=True)
class RoundResult:
    chunks: int
    chunks_per_s: float
    tokens_per_s: float
    ttft_p50_s: float
    gap_p50_s: float
    failed: int


@dataclass(frozen=True, slots=True)
class _Process:
    url: str
    pid: int


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used so far (Linux ``/proc``; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces: split after it
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@contextlib.asynccontextmanager
async def _process(*args: str) -> AsyncIterator[_Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", *args, stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        m = _URL.search(line)
        if m is None:
            raise RuntimeError(f"specproxy {args[0]} did not start: {line.decode(errors='replace').strip()}")
        yield _Process(m.group(1).decode(), proc.pid)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def _round(session: aiohttp.ClientSession, url: str, cfg: BenchConfig) -> RoundResult:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "Implement a function that parses durations like '1h30m'."}],
        "max_tokens": cfg.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(cfg.requests):
        queue.put_nowait(i)
    chunks = tokens = failed = 0
    ttfts: list[float] = []
    gaps: list[float] = []
    clock = time.perf_counter  # uvloop's loop.time() has millisecond resolution

    async def worker() -> None:
        nonlocal chunks, tokens, failed
        while not queue.empty():
            queue.get_nowait()
            t0 = clock()
            first = last = None
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as r:
                    buf = b""
                    async for piece in r.content.iter_any():
                        now = clock()
                        n = piece.count(b"data: {")  # events in this read (bench only: no full parse)
                        buf = piece[-200:]
                        if n:
                            chunks += n
                            if first is None:
                                first = now
                                ttfts.append(now - t0)
                            elif last is not None:
                                gaps.append(now - last)
                            last = now
                    m = re.search(rb'"completion_tokens":(\d+)', buf)
                    tokens += int(m.group(1)) if m else 0
                    if r.status != 200:
                        failed += 1
            except aiohttp.ClientError:
                failed += 1

    t0 = clock()
    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    span = clock() - t0
    return RoundResult(
        chunks=chunks,
        chunks_per_s=chunks / span,
        tokens_per_s=tokens / span,
        ttft_p50_s=median(ttfts) or 0.0,
        gap_p50_s=percentile(gaps, 50) or 0.0,
        failed=failed,
    )


def _overhead(record: Path) -> tuple[float, float, int]:
    """(seconds of proxy bookkeeping, relayed reads, records) from the proxy's own records."""
    total = reads = 0.0
    n = 0
    for rec in read_records(record):
        n += 1
        po = rec["proxy_overhead_s"]
        if po is not None:
            total += po["mean"] * po["count"]
            reads += po["count"]
    return total, reads, n


async def run_bench(cfg: BenchConfig) -> str:
    with tempfile.TemporaryDirectory(prefix="specproxy-bench-") as tmp:
        record = Path(tmp) / "bench.jsonl"
        async with (
            _process("sim", "--listen", "127.0.0.1:0", "--speed", str(cfg.speed)) as sim,
            _process("proxy", "--upstream", sim.url, "--listen", "127.0.0.1:0", "--record", str(record)) as proxy,
        ):
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as s:
                await _round(s, sim.url, BenchConfig(concurrency=4, requests=8, max_tokens=32))  # warm both paths
                await _round(s, proxy.url, BenchConfig(concurrency=4, requests=8, max_tokens=32))
                direct: list[RoundResult] = []
                proxied: list[RoundResult] = []
                t0 = time.monotonic()
                cpu0 = cpu_seconds(proxy.pid)
                for _ in range(cfg.rounds):
                    direct.append(await _round(s, sim.url, cfg))
                    proxied.append(await _round(s, proxy.url, cfg))
                await asyncio.sleep(1.0)  # the last records' closing scrapes and finalisation
                cpu1 = cpu_seconds(proxy.pid)
                elapsed = time.monotonic() - t0
        total, reads, records = _overhead(record)  # the proxy has stopped: every record is written
    # the proxy is idle while the client talks to the simulator directly: all its CPU is the proxied rounds'
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return _render(cfg, direct, proxied, total, reads, records, elapsed, cpu)


def _med(xs: list[RoundResult], attr: str) -> float:
    return median([getattr(x, attr) for x in xs]) or 0.0


def _render(
    cfg: BenchConfig,
    direct: list[RoundResult],
    proxied: list[RoundResult],
    overhead_sum: float,
    overhead_count: float,
    records: int,
    elapsed: float,
    proxy_cpu_s: float | None = None,
) -> str:
    rows = [
        ("chunks/s", "chunks_per_s", "{:.0f}"),
        ("tokens/s", "tokens_per_s", "{:.0f}"),
        ("TTFT p50 (ms)", "ttft_p50_s", "{:.2f}"),
        ("chunk gap p50 (ms)", "gap_p50_s", "{:.3f}"),
    ]
    out = [
        f"specproxy bench: {cfg.concurrency} concurrent streams, {cfg.requests} requests x {cfg.max_tokens} max tokens"
        f" per round, {cfg.rounds} rounds alternating direct / through the proxy (simulator at speed {cfg.speed:g});"
        " medians over rounds",
        "",
        f"{'':20} {'direct':>10} {'proxy':>10} {'proxy/direct':>13}",
    ]
    for name, attr, fmt in rows:
        d, p = _med(direct, attr), _med(proxied, attr)
        scale = 1000.0 if attr.endswith("_s") and "per" not in attr else 1.0
        ratio = f"{p / d:.3f}" if d else "-"
        out.append(f"{name:20} {fmt.format(d * scale):>10} {fmt.format(p * scale):>10} {ratio:>13}")
    failed = sum(x.failed for x in direct + proxied)
    per_read = overhead_sum / overhead_count * 1e6 if overhead_count else float("nan")
    relayed = sum(r.chunks for r in proxied)
    out += [
        "",
        f"time recording adds per relayed read: {per_read:.1f} us mean over {overhead_count:.0f} reads"
        " (SSE scan, JSON parse, timeline; from the proxy's records)",
        f"proxy CPU per 1,000 relayed chunks: {proxy_cpu_s / relayed * 1000 * 1000:.1f} ms (user + system, recording"
        " and scraping on; all rounds)"
        if proxy_cpu_s is not None and relayed
        else "proxy CPU: not measured (no /proc)",
        f"records written by the proxy: {records}; failed requests: {failed}; measured in {elapsed:.1f} s",
        "on a shared 2-core machine the simulator, the proxy and this client compete for the cores: read the ratios",
    ]
    return "\n".join(out)
