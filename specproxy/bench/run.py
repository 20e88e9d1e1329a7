"""The side-by-side run: direct, specproxy (one worker and N), nginx, at each stream level, then at saturation.

Every relay is started once, in front of one stamping upstream, and measured in turn at each level (direct first),
so that one run's ratios compare like with like on a noisy machine. Figures per level and relay: each event's added
transit (p50, p99 of the relay minus the same percentile direct), time to first event, the relay's CPU per thousand
chunks (its whole process tree) and its RSS growth per stream in flight. At saturation (an unpaced upstream): chunks/s,
chunks per CPU-second of the relay (what one core fully used would relay), and the client's own capacity.

For scaling (``--workers 1,2,4,8``): one specproxy row per N; the upstream can be several processes on one port
(``--upstreams``) and the client several processes (``--clients``), so that neither caps the relays; each role can
have CPUs of its own (``--cpus-upstream``, ``--cpus-client``, ``--cpus-relays``). After each specproxy phase the
bench waits for the bookkeeping to take what the relays still hold for it, so its CPU counts all the phase's work,
and reads the proxy's status: what the relays shed, and from that the bookkeeper's ceiling (the event rate at which
the relays start shedding).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specproxy.bench.config import BenchConfig, Load, Relay
from specproxy.bench.floors import floor_rows
from specproxy.bench.procs import (
    Child,
    client_result,
    format_cpus,
    nginx,
    nginx_path,
    python_child,
    spawn_client,
    tree_cpu_by_role,
    tree_cpu_s,
    tree_rss_bytes,
)
from specproxy.bench.roles import (
    pin_roles,
    proxy_has_workers,
    proxy_status,
    sample_phase,
    settled_status,
    sharing,
    shed_delta,
)
from specproxy.bench.verdicts import bookkeeper_ceiling, compare_saturation, level_vs_nginx, splice_notes, targets
from specproxy.bench.window import saturation_window
from specproxy.bench.wire import now_ns
from specproxy.compiled import PURE_ENV, build
from specproxy.core.stats import percentile

PURE_ROW = "specproxy --workers 1 (pure-Python)"  # with --floors, beside a compiled install's rows

SATURATED_MS = 5.0  # direct's own p50 transit past this: the load, not the relay, sets the figures
CLIENT_FLOOR = 20_000  # chunks/s one client process must take, or the bench measures itself


def raise_nofile() -> None:
    """1,024 streams through a relay need several thousand descriptors across the processes (all inherit this)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def _cpu_of(pids: tuple[int, ...]) -> float:
    return sum(tree_cpu_s(p) for p in pids)


async def measure(
    relay: Relay,
    targets_streams: int,
    tokens: int,
    rate: float,
    clients: int,
    load: Load | None = None,
    stagger_s: float | None = None,
) -> dict[str, Any]:
    """One phase: ``targets_streams`` streams through ``relay``, spread over ``clients`` client processes; their
    starts spread over ``stagger_s`` (default: one step or 1 ms per stream, whichever is longer; 0: a burst)."""
    stagger = max(1.0 / rate if rate > 0 else 0.0, targets_streams * 0.001) if stagger_s is None else stagger_s
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
    load = load or Load(())
    status0 = await proxy_status(relay.url) if relay.workers is not None else None
    rss0 = tree_rss_bytes(relay.pid) if relay.pid else 0
    cpu0 = tree_cpu_s(relay.pid) if relay.pid else 0.0
    roles0 = tree_cpu_by_role(relay.pid) if relay.pid else {}
    up0 = _cpu_of(load.upstream_pids)
    peak = rss0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set() and relay.pid:
            peak = max(peak, tree_rss_bytes(relay.pid))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    sampler = asyncio.create_task(sample())
    sampled = asyncio.create_task(sample_phase(relay, load.upstream_pids, done, rate == 0))  # at saturation
    spawned = await asyncio.gather(*(spawn_client(s, cpus=load.cpus_client) for s in specs))
    up_cpu = _cpu_of(load.upstream_pids) - up0
    outs = [client_result(o, relay.name) for o in spawned]
    status1 = None
    settle_s = None
    if status0 is not None:  # the bookkeeping's work for this phase may still be under way: it counts here
        t_end = now_ns()
        status1 = await settled_status(relay.url)
        settle_s = (now_ns() - t_end) / 1e9
    done.set()
    await sampler
    win = saturation_window([o["targets"][0] for o in outs], *await sampled) if rate == 0 else None
    cpu = tree_cpu_s(relay.pid) - cpu0 if relay.pid else None
    after = tree_cpu_by_role(relay.pid) if relay.pid else {}
    roles = {k: v - roles0[k] for k, v in after.items()}
    relay_cpu = roles["relay"] if after.get("named") else None  # a proxy that names its processes
    parts = [o["targets"][0] for o in outs]
    lat = sorted(x for p in parts for x in p["lat_us"])
    ttft = sorted(x for p in parts for x in p["ttft_us"])
    events = sum(p["events"] for p in parts)
    span_s = (max(p["last_ns"] for p in parts) - min(o["start_ns"] for o in outs)) / 1e9
    phase_rate = events / span_s if span_s > 0 else None
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
    client_cpu = sum(o["cpu_s"] for o in outs)

    def cores(cpu_s: float | None) -> float | None:
        return cpu_s / span_s if cpu_s is not None and span_s > 0 else None

    def per_1000(cpu_s: float | None) -> float | None:
        return cpu_s * 1e6 / events if cpu_s is not None and events else None

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
        "ttft_p99_ms": _ms(percentile(ttft, 99)),
        "max_gap_ms": _ms(max((g for p in parts for g in p["max_gap_us"]), default=None)),
        # at saturation: over the window in which every relay process has streams (bench/window.py), if there is one
        "chunks_per_s": win["chunks_per_s"] if win else phase_rate,
        "chunks_per_s_phase": phase_rate,  # events over the whole phase, first start to last event
        "window": win,
        "client_chunks_per_s_per_process": events / client_wall / len(outs) if client_wall > 0 else None,
        "client_cpu_s": client_cpu,
        "span_s": span_s,
        # per role: CPU per thousand events, and cores in use over the phase (CPU-seconds per second)
        "client_cpu_ms_per_1000": per_1000(client_cpu),
        "client_cores": client_cpu / client_wall if client_wall > 0 else None,
        "upstream_cpu_ms_per_1000": per_1000(up_cpu) if load.upstream_pids else None,
        "upstream_cores": cores(up_cpu) if load.upstream_pids else None,
        "relay_cores": cores(cpu),
        "relay_only_cores": cores(relay_cpu),
        # over the phase and the wait for the bookkeeping to catch up (its backlog is worked off after the last event)
        "bookkeeping_cores": roles["bookkeeping"] / (span_s + (settle_s or 0.0))
        if relay_cpu is not None and span_s > 0
        else None,
        "settle_s": settle_s,
        "other_cpu_ms_per_1000": per_1000(roles["other"]) if relay_cpu is not None else None,
        **shed_delta(status0, status1),
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
    for key, src in (
        ("added_p50_ms", "lat_p50_ms"),
        ("added_p99_ms", "lat_p99_ms"),
        ("ttft_added_ms", "ttft_p50_ms"),
        ("ttft_added_p99_ms", "ttft_p99_ms"),
    ):
        a, b = row.get(src), direct.get(src)
        row[key] = a - b if a is not None and b is not None else None


def worker_rows(cfg: BenchConfig) -> tuple[int, ...]:
    """The N of every `specproxy --workers N` row: 1 first (the ratios' base), then each asked for, ascending."""
    if cfg.worker_rows:
        return tuple(sorted({1, *cfg.worker_rows}))
    n = cfg.workers or min(os.cpu_count() or 1, 8)
    return (1,) if n == 1 else (1, n)


@contextlib.asynccontextmanager
async def relays(cfg: BenchConfig, upstream: Child, tmp: Path, notes: list[str]) -> Any:
    """Start every relay of the run; yields the list, direct first. Notes say what was left out and why."""
    rows = [Relay("direct", upstream.url, None)]
    variants: list[tuple[str, list[str], int | None]]
    if await proxy_has_workers():
        variants = [(f"specproxy --workers {n}", ["--workers", str(n)], n) for n in worker_rows(cfg)]
        if cfg.aiohttp_door:
            variants.append(("specproxy --workers 1 --no-fast-lane", ["--workers", "1", "--no-fast-lane"], 1))
    else:
        variants = [("specproxy", [], None)]
        notes.append(
            "specproxy proxy has no --workers option in this build: one specproxy row, measured without it"
            + (f" (--workers {cfg.workers} not applied)" if cfg.workers else "")
        )
    envs: list[dict[str, str] | None] = [None] * len(variants)
    if cfg.floors and variants[0][2] is not None:
        if build() == "pure-Python":
            notes.append(
                "this install's per-event modules are pure Python (built without a C compiler, or with"
                f" {PURE_ENV}=1): no compiled row beside the pure-Python one"
            )
        else:  # the same install with its per-event modules loaded from their .py files
            variants.append((PURE_ROW, ["--workers", "1"], 1))
            envs.append({PURE_ENV: "1"})
    binary = nginx_path() if cfg.use_nginx else None
    if binary is None:
        notes.append(
            "nginx skipped: " + ("not installed (Debian: apt-get install nginx)" if cfg.use_nginx else "--no-nginx")
        )
    pin = cfg.cpus_relays
    async with contextlib.AsyncExitStack() as stack:
        starts = [
            stack.enter_async_context(
                python_child(
                    *("-m", "specproxy", "proxy", "--upstream", upstream.url, "--listen", "127.0.0.1:0"),
                    *("--record", str(tmp / f"records-{i}.jsonl"), *extra),
                    cpus=pin,
                    env=env,
                )
            )
            for i, ((_, extra, _n), env) in enumerate(zip(variants, envs, strict=True))
        ]
        names = [name for name, _, _ in variants]
        workers: list[int | None] = [n for _, _, n in variants]
        if binary is not None:
            starts.append(stack.enter_async_context(nginx(binary, upstream.url, cpus=pin)))
            names.append("nginx (1 worker)")
            workers.append(None)
        splices: list[int | None] = [None] * len(names)
        for kind, name, n in floor_rows([n for _, _, n in variants]) if cfg.floors else ():
            args = ("-m", "specproxy.bench.floors", kind, "--upstream", upstream.url, "--processes", str(n))
            starts.append(stack.enter_async_context(python_child(*args, cpus=pin)))
            names.append(name)
            workers.append(None)
            splices.append(n if kind == "splice" else None)
        children = await asyncio.gather(*starts)  # all at once: startup is most of a short run's time
        rows += [Relay(m, c.url, c.pid, n, k) for m, c, n, k in zip(names, children, workers, splices, strict=True)]
        if cfg.cpus_bookkeeper or (cfg.relay_each and cfg.cpus_relays):
            for r in rows:
                if r.workers is not None:
                    await pin_roles(r, cfg, notes)
        yield rows


@contextlib.asynccontextmanager
async def upstreams(cfg: BenchConfig, tmp: Path) -> Any:
    """The stamping upstream: ``cfg.upstreams`` processes on one port (the first finds a free port, the others join
    it with SO_REUSEPORT), their counters summed through a shared file. Yields (the first, every pid)."""
    rate = ["--steps-per-s", str(cfg.steps_per_s), "--batch", str(cfg.upstream_batch)]
    if cfg.upstreams == 1:
        async with python_child("-m", "specproxy.bench.upstream", *rate, url_on="stdout", cpus=cfg.cpus_upstream) as up:
            yield up, (up.pid,)
        return
    shared = ["--reuse-port", "--shared", str(tmp / "upstream-counters"), "--slots", str(cfg.upstreams)]
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            python_child(
                "-m", "specproxy.bench.upstream", *rate, *shared, "--slot", "0", url_on="stdout", cpus=cfg.cpus_upstream
            )
        )
        port = first.url.rsplit(":", 1)[1]
        rest = await asyncio.gather(
            *(
                stack.enter_async_context(
                    python_child(
                        "-m",
                        "specproxy.bench.upstream",
                        *rate,
                        *shared,
                        "--slot",
                        str(i),
                        "--port",
                        port,
                        url_on="stdout",
                        cpus=cfg.cpus_upstream,
                    )
                )
                for i in range(1, cfg.upstreams)
            )
        )
        yield first, (first.pid, *(c.pid for c in rest))


async def run_levels(cfg: BenchConfig) -> dict[str, Any]:
    raise_nofile()
    if cfg.cpus_client:  # the bench's own sampling and bookkeeping run beside the clients, off the relays' CPUs
        os.sched_setaffinity(0, cfg.cpus_client)
    notes: list[str] = []
    levels: list[dict[str, Any]] = []
    saturation: list[dict[str, Any]] = []
    burst: list[dict[str, Any]] = []
    for a, b, name in (
        (cfg.cpus_relays, cfg.cpus_client, "the relays share CPU {} with the client"),
        (cfg.cpus_relays, cfg.cpus_upstream, "the relays share CPU {} with the upstream"),
        (cfg.cpus_bookkeeper, cfg.cpus_relays, "the bookkeeping shares CPU {} with the relays"),
        (cfg.cpus_bookkeeper, cfg.cpus_client, "the bookkeeping shares CPU {} with the client"),
        (cfg.cpus_bookkeeper, cfg.cpus_upstream, "the bookkeeping shares CPU {} with the upstream"),
    ):
        if a and b and a & b:
            notes.append(name.format(format_cpus(a & b)))
    with tempfile.TemporaryDirectory(prefix="specproxy-bench-") as d:
        async with (
            upstreams(cfg, Path(d)) as (up, up_pids),
            relays(cfg, up, Path(d), notes) as rows,
        ):
            load = Load(tuple(up_pids), cfg.cpus_client)
            for n in cfg.streams:
                level = [await measure(r, n, cfg.tokens, cfg.steps_per_s, cfg.clients, load) for r in rows]
                for row in level:
                    _added(row, level[0])
                    row["workers"] = next(r.workers for r in rows if r.name == row["relay"])
                level_vs_nginx(level)
                late = level[0]["lat_p50_ms"]
                if late is not None and late > SATURATED_MS:
                    notes.append(
                        f"at {n} streams direct itself is late (p50 {late:.1f} ms): the upstream, the client or the"
                        " machine is saturated, so that level's added figures measure contention, not the relay alone"
                    )
                levels.append({"streams": n, "rows": level})
            if cfg.burst:
                for r in rows:
                    row = await measure(r, cfg.burst, cfg.burst_tokens, cfg.steps_per_s, cfg.clients, load, 0.0)
                    row["workers"] = r.workers
                    burst.append(row)
                for row in burst:
                    _added(row, burst[0])
            for r in rows:
                row = await measure(r, cfg.saturation_streams, cfg.saturation_tokens, 0.0, cfg.clients, load)
                row["workers"] = r.workers
                row["splices"] = r.splices
                saturation.append(row)
    if short := compare_saturation(saturation):
        notes.append(short)
    notes += splice_notes(saturation)
    direct_sat = saturation[0]
    cap = direct_sat["client_chunks_per_s_per_process"]
    return {
        "config": {**asdict(cfg), **{k: sorted(v) if v else None for k, v in _cpu_fields(cfg).items()}},
        "build": build(),  # of the specproxy rows without "(pure-Python)" in their name
        "cores": os.cpu_count(),
        "sharing": sharing(cfg),
        "notes": notes,
        "client_capacity": {
            "chunks_per_s_per_process": cap,
            "floor": CLIENT_FLOOR,
            "pass": cap is not None and cap >= CLIENT_FLOOR,
        },
        "levels": levels,
        "burst": burst,
        "saturation": saturation,
        "bookkeeper": bookkeeper_ceiling([*(r for lv in levels for r in lv["rows"]), *burst, *saturation]),
        "targets": targets(levels, saturation),
    }


def _cpu_fields(cfg: BenchConfig) -> dict[str, frozenset[int] | None]:
    return {
        "cpus_upstream": cfg.cpus_upstream,
        "cpus_client": cfg.cpus_client,
        "cpus_relays": cfg.cpus_relays,
        "cpus_bookkeeper": cfg.cpus_bookkeeper,
    }
