"""The side-by-side run: direct, specproxy (one worker and N), nginx, at each stream level, then at saturation.

Every relay is started once, in front of one stamping upstream, and measured in turn at each level (direct first),
so that one run's ratios compare like with like on a noisy machine. Figures per level and relay: each event's added
transit (p50, p99 of the relay minus the same percentile direct), time to first event, the relay's CPU per 1,000
chunks (its whole process tree) and its RSS growth per stream in flight. At saturation (an unpaced upstream): chunks/s,
chunks per CPU-second of the relay (what one core fully used would relay), and the client's own capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specproxy.bench.procs import (
    Child,
    client_result,
    nginx,
    nginx_path,
    python_child,
    spawn_client,
    tree_cpu_by_role,
    tree_cpu_s,
    tree_rss_bytes,
)
from specproxy.core.stats import percentile

SATURATED_MS = 5.0  # direct's own p50 transit past this: the load, not the relay, sets the figures
CLIENT_FLOOR = 20_000  # chunks/s one client process must take, or the bench measures itself


@dataclass(frozen=True, slots=True)
class BenchConfig:
    streams: tuple[int, ...] = (1, 64, 256, 1024)
    tokens: int = 150
    steps_per_s: float = 25.0
    workers: int | None = None  # N for the `--workers N` row; None: one per core when the proxy has the option
    clients: int = 1
    saturation_streams: int = 64
    saturation_tokens: int = 1000
    use_nginx: bool = True
    hostile_streams: int = 64
    floors: bool = False  # also the two reference relays of bench/floors.py (uvloop TCP splice, aiohttp pass-through)


@dataclass(frozen=True, slots=True)
class Relay:
    name: str
    url: str
    pid: int | None  # None: direct, no relay process


def raise_nofile() -> None:
    """1,024 streams through a relay need several thousand descriptors across the processes (all inherit this)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def proxy_has_workers() -> bool:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specproxy",
        "proxy",
        "--help",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )
    out, _ = await proc.communicate()
    return b"--workers" in out


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


async def measure(relay: Relay, targets_streams: int, tokens: int, rate: float, clients: int) -> dict[str, Any]:
    """One phase: ``targets_streams`` streams through ``relay``, spread over ``clients`` client processes."""
    stagger = max(1.0 / rate if rate > 0 else 0.0, targets_streams * 0.001)
    per = [targets_streams // clients + (1 if i < targets_streams % clients else 0) for i in range(clients)]
    specs = [
        json.dumps(
            {
                "targets": [{"name": relay.name, "url": relay.url, "streams": n}],
                "tokens": tokens,
                "steps_per_s": rate,
                "stagger_s": stagger,
                "timeout_s": 120 + tokens / max(rate, 1.0),
            }
        )
        for n in per
        if n
    ]
    rss0 = tree_rss_bytes(relay.pid) if relay.pid else 0
    cpu0 = tree_cpu_s(relay.pid) if relay.pid else 0.0
    roles0 = tree_cpu_by_role(relay.pid) if relay.pid else {}
    peak = rss0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set() and relay.pid:
            peak = max(peak, tree_rss_bytes(relay.pid))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    sampler = asyncio.create_task(sample())
    outs = [client_result(o, relay.name) for o in await asyncio.gather(*(spawn_client(s) for s in specs))]
    done.set()
    await sampler
    cpu = tree_cpu_s(relay.pid) - cpu0 if relay.pid else None
    after = tree_cpu_by_role(relay.pid) if relay.pid else {}
    roles = {k: v - roles0[k] for k, v in after.items()}
    relay_cpu = roles["relay"] if after.get("named") else None  # a proxy that names its processes
    parts = [o["targets"][0] for o in outs]
    lat = sorted(x for p in parts for x in p["lat_us"])
    ttft = sorted(x for p in parts for x in p["ttft_us"])
    events = sum(p["events"] for p in parts)
    span_s = (max(p["last_ns"] for p in parts) - min(o["start_ns"] for o in outs)) / 1e9
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for p in parts:
        examples.update(p["error_examples"])
        for k, v in p["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
        for k, v in p["errors"].items():
            errors[k] = errors.get(k, 0) + v
    client_wall = max(o["wall_s"] for o in outs)
    return {
        "relay": relay.name,
        "streams": targets_streams,
        "events": events,
        "expected": sum(p["expected"] for p in parts),
        "statuses": statuses,
        "errors": errors,
        "error_examples": examples,
        "lat_p50_ms": _ms(percentile(lat, 50)),
        "lat_p99_ms": _ms(percentile(lat, 99)),
        "ttft_p50_ms": _ms(percentile(ttft, 50)),
        "max_gap_ms": _ms(max((g for p in parts for g in p["max_gap_us"]), default=None)),
        "chunks_per_s": events / span_s if span_s > 0 else None,
        "client_chunks_per_s_per_process": events / client_wall / len(outs) if client_wall > 0 else None,
        "client_cpu_s": sum(o["cpu_s"] for o in outs),
        "relay_cpu_s": cpu,
        "cpu_ms_per_1000": cpu * 1e6 / events if cpu is not None and events else None,
        "chunks_per_cpu_s": events / cpu if cpu else None,
        # specproxy with --workers: the relay processes alone, and the bookkeeping process
        "relay_only_cpu_ms_per_1000": relay_cpu * 1e6 / events if relay_cpu is not None and events else None,
        "bookkeeping_cpu_ms_per_1000": roles["bookkeeping"] * 1e6 / events
        if relay_cpu is not None and events
        else None,
        "rss_base_mb": rss0 / 2**20 if relay.pid else None,
        "rss_peak_mb": peak / 2**20 if relay.pid else None,
        "mem_per_stream_kib": (peak - rss0) / 1024 / targets_streams if relay.pid else None,
    }


def _added(row: dict[str, Any], direct: dict[str, Any]) -> None:
    for key, src in (("added_p50_ms", "lat_p50_ms"), ("added_p99_ms", "lat_p99_ms"), ("ttft_added_ms", "ttft_p50_ms")):
        a, b = row.get(src), direct.get(src)
        row[key] = a - b if a is not None and b is not None else None


@contextlib.asynccontextmanager
async def relays(cfg: BenchConfig, upstream: Child, tmp: Path, notes: list[str]) -> Any:
    """Start every relay of the run; yields the list, direct first. Notes say what was left out and why."""
    rows = [Relay("direct", upstream.url, None)]
    variants: list[tuple[str, list[str]]]
    if await proxy_has_workers():
        n = cfg.workers or min(os.cpu_count() or 1, 8)
        variants = [("specproxy --workers 1", ["--workers", "1"])]
        if n != 1:
            variants.append((f"specproxy --workers {n}", ["--workers", str(n)]))
    else:
        variants = [("specproxy", [])]
        notes.append(
            "specproxy proxy has no --workers option in this build: one specproxy row, measured without it"
            + (f" (--workers {cfg.workers} not applied)" if cfg.workers else "")
        )
    binary = nginx_path() if cfg.use_nginx else None
    if binary is None:
        notes.append(
            "nginx skipped: " + ("not installed (Debian: apt-get install nginx)" if cfg.use_nginx else "--no-nginx")
        )
    async with contextlib.AsyncExitStack() as stack:
        starts = [
            stack.enter_async_context(
                python_child(
                    "-m",
                    "specproxy",
                    "proxy",
                    "--upstream",
                    upstream.url,
                    "--listen",
                    "127.0.0.1:0",
                    "--record",
                    str(tmp / f"records-{i}.jsonl"),
                    *extra,
                )
            )
            for i, (_, extra) in enumerate(variants)
        ]
        names = [name for name, _ in variants]
        if binary is not None:
            starts.append(stack.enter_async_context(nginx(binary, upstream.url)))
            names.append("nginx (1 worker)")
        if cfg.floors:
            for kind, name in (("aiohttp", "floor: aiohttp pass-through"), ("splice", "floor: uvloop TCP splice")):
                floor = python_child("-m", "specproxy.bench.floors", kind, "--upstream", upstream.url)
                starts.append(stack.enter_async_context(floor))
                names.append(name)
        children = await asyncio.gather(*starts)  # all at once: startup is most of a short run's time
        rows += [Relay(name, c.url, c.pid) for name, c in zip(names, children, strict=True)]
        yield rows


async def run_levels(cfg: BenchConfig) -> dict[str, Any]:
    raise_nofile()
    notes: list[str] = []
    levels: list[dict[str, Any]] = []
    saturation: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="specproxy-bench-") as d:
        async with (
            python_child(
                "-m", "specproxy.bench.upstream", "--steps-per-s", str(cfg.steps_per_s), url_on="stdout"
            ) as up,
            relays(cfg, up, Path(d), notes) as rows,
        ):
            for n in cfg.streams:
                level = [await measure(r, n, cfg.tokens, cfg.steps_per_s, cfg.clients) for r in rows]
                for row in level:
                    _added(row, level[0])
                late = level[0]["lat_p50_ms"]
                if late is not None and late > SATURATED_MS:
                    notes.append(
                        f"at {n} streams direct itself is late (p50 {late:.1f} ms): the upstream, the client or the"
                        " machine is saturated, so that level's added figures measure contention, not the relay alone"
                    )
                levels.append({"streams": n, "rows": level})
            for r in rows:
                saturation.append(await measure(r, cfg.saturation_streams, cfg.saturation_tokens, 0.0, cfg.clients))
    direct_sat = saturation[0]
    for row in saturation[1:]:
        row["cpu_vs_nginx"] = row["relay_only_vs_nginx"] = None
    ng = next((r for r in saturation if r["relay"].startswith("nginx")), None)
    if ng and ng["cpu_ms_per_1000"]:
        for row in saturation[1:]:
            if row["cpu_ms_per_1000"] is not None:
                row["cpu_vs_nginx"] = row["cpu_ms_per_1000"] / ng["cpu_ms_per_1000"]
            if row["relay_only_cpu_ms_per_1000"] is not None:
                row["relay_only_vs_nginx"] = row["relay_only_cpu_ms_per_1000"] / ng["cpu_ms_per_1000"]
    cap = direct_sat["client_chunks_per_s_per_process"]
    return {
        "config": asdict(cfg),
        "cores": os.cpu_count(),
        "sharing": f"{os.cpu_count()} cores shared by the upstream (1 process), the client ({cfg.clients} process(es))"
        " and the relay under test (specproxy: its workers and bookkeeping; nginx: 1 master + 1 worker); all"
        " relays stay up and idle while another is measured; nothing is pinned",
        "notes": notes,
        "client_capacity": {
            "chunks_per_s_per_process": cap,
            "floor": CLIENT_FLOOR,
            "pass": cap is not None and cap >= CLIENT_FLOOR,
        },
        "levels": levels,
        "saturation": saturation,
        "targets": targets(levels, saturation),
    }


def targets(levels: list[dict[str, Any]], saturation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's targets, each with the measured value and pass or fail."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, limit: float, higher_is_better: bool = False) -> None:
        ok = value is not None and (value >= limit if higher_is_better else value <= limit)
        out.append({"target": name, "value": value, "limit": limit, "pass": ok})

    spec = [r for r in saturation if r["relay"].startswith("specproxy")]
    for level in levels:
        for row in level["rows"]:
            if not row["relay"].startswith("specproxy"):
                continue
            if level["streams"] == 256:
                add(f"{row['relay']}: added p50 at 256 streams (ms)", row["added_p50_ms"], 0.3)
                add(f"{row['relay']}: added p99 at 256 streams (ms)", row["added_p99_ms"], 2.0)
            if level is levels[-1] and level["streams"] >= 64:
                add(
                    f"{row['relay']}: memory per stream at {level['streams']} streams (KiB)",
                    row["mem_per_stream_kib"],
                    64.0,
                )
    if spec and spec[0]["cpu_vs_nginx"] is not None:
        add(f"{spec[0]['relay']}: CPU per chunk / nginx's (all processes)", spec[0]["cpu_vs_nginx"], 1.0)
    if spec and spec[0].get("relay_only_vs_nginx") is not None:
        add(f"{spec[0]['relay']}: CPU per chunk / nginx's (the relay process)", spec[0]["relay_only_vs_nginx"], 1.0)
    if len(spec) == 2 and spec[0]["chunks_per_s"] and spec[1]["chunks_per_s"] is not None:
        add(
            f"{spec[1]['relay']} / --workers 1: chunks/s at saturation",
            spec[1]["chunks_per_s"] / spec[0]["chunks_per_s"],
            1.8,
            higher_is_better=True,
        )
    return out
