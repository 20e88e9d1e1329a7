"""The side-by-side run: direct, specproxy (one worker and N), nginx, at each stream level, then at saturation.

Every relay is started once, in front of one stamping upstream, and measured in turn at each level (direct first),
so that one run's ratios compare like with like on a noisy machine. Figures per level and relay: each event's added
transit (p50, p99 of the relay minus the same percentile direct), time to first event, the relay's CPU per 1,000
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
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.procs import (
    Child,
    client_result,
    format_cpus,
    nginx,
    nginx_path,
    pin_process,
    python_child,
    spawn_client,
    tree_cpu_by_role,
    tree_cpu_s,
    tree_rss_bytes,
)
from specproxy.bench.wire import now_ns
from specproxy.core.stats import percentile
from specproxy.proxy.link import STATS_INTERVAL_S

SATURATED_MS = 5.0  # direct's own p50 transit past this: the load, not the relay, sets the figures
CLIENT_FLOOR = 20_000  # chunks/s one client process must take, or the bench measures itself


@dataclass(frozen=True, slots=True)
class BenchConfig:
    streams: tuple[int, ...] = (1, 64, 256, 1024)
    tokens: int = 150
    steps_per_s: float = 25.0
    workers: int | None = None  # N for the `--workers N` row; None: one per core when the proxy has the option
    worker_rows: tuple[int, ...] | None = None  # every N with a row (1 first); None: 1 and `workers`
    clients: int = 1
    upstreams: int = 1  # upstream processes on one port
    upstream_batch: int = 1  # events per upstream write at saturation (1: one event, one write)
    cpus_upstream: frozenset[int] | None = None  # None: not pinned
    cpus_client: frozenset[int] | None = None  # the clients' and the bench's own
    cpus_relays: frozenset[int] | None = None  # every relay's whole process tree
    cpus_bookkeeper: frozenset[int] | None = None  # specproxy's bookkeeping process, once started; None: as relays
    relay_each: bool = False  # each of specproxy's relay processes on one CPU of cpus_relays, in turn
    burst: int = 0  # streams started at once (no stagger), paced, after the levels; 0: none
    burst_tokens: int = 20
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
    workers: int | None = None  # specproxy's --workers N; None: not specproxy with --workers


@dataclass(frozen=True, slots=True)
class Load:
    """The processes that make the load: the upstream's (CPU read per phase) and where clients run."""

    upstream_pids: tuple[int, ...]
    cpus_client: frozenset[int] | None = None


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


async def proxy_status(url: str) -> dict[str, Any] | None:
    """specproxy's ``/specproxy/status``; None when it does not answer (another relay, or a broken proxy)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
            s.get(url + "/specproxy/status") as r,
        ):
            if r.status != 200:
                return None
            doc = await r.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


async def settled_status(url: str, wait_s: float = 20.0) -> dict[str, Any] | None:
    """The proxy's status once its relays have held nothing for the bookkeeping twice in a row (or ``wait_s`` has
    passed): then the bookkeeper has read the phase's events. The relays report every ``STATS_INTERVAL_S``, so each
    read comes one report after the last."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    calm = 0
    while True:
        await asyncio.sleep(STATS_INTERVAL_S + 0.05)
        st = await proxy_status(url)
        if st is None:
            return None
        bk = st["bookkeeping"]
        calm = calm + 1 if not bk.get("backlog_bytes") and not bk.get("relay_in_flight") else 0
        if calm >= 2 or loop.time() > end:
            return st


def _shed_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if before is None or after is None:
        return {"shed_chunks": None, "shed_requests": None, "lost_records": None}
    b, a = before["bookkeeping"], after["bookkeeping"]
    return {
        "shed_chunks": int(a["shed"].get("chunk", 0)) - int(b["shed"].get("chunk", 0)),
        "shed_requests": int(a["shed_requests"]) - int(b["shed_requests"]),
        "lost_records": int(a["lost_records"]) - int(b["lost_records"]),
    }


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
        "chunks_per_s": events / span_s if span_s > 0 else None,
        "client_chunks_per_s_per_process": events / client_wall / len(outs) if client_wall > 0 else None,
        "client_cpu_s": client_cpu,
        "span_s": span_s,
        # per role: CPU per 1,000 events, and cores in use over the phase (CPU-seconds per second)
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
        **_shed_delta(status0, status1),
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
    else:
        variants = [("specproxy", [], None)]
        notes.append(
            "specproxy proxy has no --workers option in this build: one specproxy row, measured without it"
            + (f" (--workers {cfg.workers} not applied)" if cfg.workers else "")
        )
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
                    cpus=pin,
                )
            )
            for i, (_, extra, _n) in enumerate(variants)
        ]
        names = [name for name, _, _ in variants]
        workers: list[int | None] = [n for _, _, n in variants]
        if binary is not None:
            starts.append(stack.enter_async_context(nginx(binary, upstream.url, cpus=pin)))
            names.append("nginx (1 worker)")
            workers.append(None)
        if cfg.floors:
            for kind, name in (("aiohttp", "floor: aiohttp pass-through"), ("splice", "floor: uvloop TCP splice")):
                floor = python_child("-m", "specproxy.bench.floors", kind, "--upstream", upstream.url, cpus=pin)
                starts.append(stack.enter_async_context(floor))
                names.append(name)
                workers.append(None)
        children = await asyncio.gather(*starts)  # all at once: startup is most of a short run's time
        rows += [Relay(name, c.url, c.pid, n) for name, c, n in zip(names, children, workers, strict=True)]
        if cfg.cpus_bookkeeper or (cfg.relay_each and cfg.cpus_relays):
            for r in rows:
                if r.workers is not None:
                    await _pin_roles(r, cfg, notes)
        yield rows


async def _pin_roles(relay: Relay, cfg: BenchConfig, notes: list[str]) -> None:
    """specproxy's bookkeeping process on CPUs of its own, and with ``relay_each`` each relay process on one CPU of
    the relays', in turn: found by the pids its status gives, once every relay has reported."""
    for _ in range(100):
        st = await proxy_status(relay.url)
        bk = st.get("bookkeeping", {}) if st is not None else {}
        if bk.get("pid") and len(bk.get("relay_pids", ())) >= (relay.workers or 1):
            break
        await asyncio.sleep(0.1)
    else:
        notes.append(f"{relay.name}: its status never listed its processes: none of them pinned beyond --cpus-relays")
        return
    try:
        if cfg.cpus_bookkeeper:
            pin_process(int(bk["pid"]), cfg.cpus_bookkeeper)
        if cfg.relay_each and cfg.cpus_relays:
            cpus = sorted(cfg.cpus_relays)
            for i, pid in enumerate(sorted(int(p) for p in bk["relay_pids"])):
                pin_process(pid, frozenset({cpus[i % len(cpus)]}))
    except OSError as e:
        notes.append(f"{relay.name}: its processes could not be pinned ({e})")


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


def _sharing(cfg: BenchConfig) -> str:
    cores = os.cpu_count()
    ups = f"the upstream ({cfg.upstreams} process{'es' if cfg.upstreams > 1 else ''})"
    cls = f"the client ({cfg.clients} process(es))"
    if not (cfg.cpus_upstream or cfg.cpus_client or cfg.cpus_relays or cfg.cpus_bookkeeper):
        return (
            f"{cores} cores shared by {ups}, {cls} and the relay under test (specproxy: its workers and bookkeeping;"
            " nginx: 1 master + 1 worker); all relays stay up and idle while another is measured; nothing is pinned"
        )

    def on(cpus: frozenset[int] | None) -> str:
        return f"CPU{'s' if len(cpus) > 1 else ''} {format_cpus(cpus)}" if cpus else "any CPU"

    return (
        f"{cores} cores: {ups} on {on(cfg.cpus_upstream)}, {cls} and the bench on {on(cfg.cpus_client)}, every relay"
        f" (all its processes: specproxy's workers and bookkeeping) on {on(cfg.cpus_relays)}"
        + (f", specproxy's bookkeeping process then moved to {on(cfg.cpus_bookkeeper)}" if cfg.cpus_bookkeeper else "")
        + (", each specproxy relay process on one of those CPUs in turn" if cfg.relay_each and cfg.cpus_relays else "")
        + "; all relays stay up and idle while another is measured"
    )


CEILING_MIN_SPAN_S = 1.0  # a shorter phase fits in the relays' buffers: it says nothing of a sustained rate
LAG_S = 2.5  # the bookkeeping still working this long after the last event: it did not keep up


def bookkeeper_ceiling(phases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the bookkeeper stops keeping up, from every phase of specproxy (paced levels, burst, saturation) of at
    least ``CEILING_MIN_SPAN_S``, by the event rate relayed: the highest rate it sustained (nothing shed, caught up
    within ``LAG_S`` of the last event) and the lowest it did not (the relays shed, or it was still behind), with
    its cores and CPU per event at each; and what one full core would take at its CPU per event at the highest
    sustained rate (an estimate, not a reading)."""
    rows = sorted(
        (
            r
            for r in phases
            if r.get("workers") is not None
            and r.get("shed_chunks") is not None
            and r["chunks_per_s"]
            and r.get("span_s", 0.0) >= CEILING_MIN_SPAN_S
        ),
        key=lambda r: r["chunks_per_s"],
    )
    if not rows:
        return None

    def behind(r: dict[str, Any]) -> str | None:
        if r["shed_chunks"] or r["shed_requests"]:
            return "shed"
        return "lagging" if (r.get("settle_s") or 0.0) > LAG_S else None

    first = next((r for r in rows if behind(r)), None)
    kept = [r for r in rows if not behind(r)]
    last = max(kept, key=lambda r: r["chunks_per_s"]) if kept else None

    def at(r: dict[str, Any] | None) -> dict[str, Any] | None:
        if r is None:
            return None
        return {
            "relay": r["relay"],
            "workers": r["workers"],
            "streams": r["streams"],
            "chunks_per_s": r["chunks_per_s"],
            "bookkeeping_cores": r["bookkeeping_cores"],
            "bookkeeping_cpu_ms_per_1000": r["bookkeeping_cpu_ms_per_1000"],
            "shed_chunks": r["shed_chunks"],
            "shed_requests": r["shed_requests"],
            "settle_s": r.get("settle_s"),
            "behind": behind(r),
        }

    est = None
    if last is not None and last["bookkeeping_cpu_ms_per_1000"]:
        est = 1e6 / last["bookkeeping_cpu_ms_per_1000"]  # events per CPU-second of the bookkeeper
    return {
        "shedding": any(behind(r) == "shed" for r in rows),
        "last_sustained": at(last),
        "first_behind": at(first),
        "events_per_bookkeeper_cpu_s": est,
    }


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
                saturation.append(row)
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
    one = next((r for r in saturation if r.get("workers") == 1), None)
    for row in saturation:
        row["vs_workers_1"] = (
            row["chunks_per_s"] / one["chunks_per_s"]
            if one and one["chunks_per_s"] and row.get("workers") is not None and row["chunks_per_s"] is not None
            else None
        )
    cap = direct_sat["client_chunks_per_s_per_process"]
    return {
        "config": {**asdict(cfg), **{k: sorted(v) if v else None for k, v in _cpu_fields(cfg).items()}},
        "cores": os.cpu_count(),
        "sharing": _sharing(cfg),
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


SCALING_TARGETS = {2: 1.8, 4: 3.5}  # --workers N: at least this many times --workers 1's chunks/s at saturation


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
    if spec and spec[0].get("cpu_vs_nginx") is not None:
        add(f"{spec[0]['relay']}: CPU per chunk / nginx's (all processes)", spec[0]["cpu_vs_nginx"], 1.0)
    if spec and spec[0].get("relay_only_vs_nginx") is not None:
        add(f"{spec[0]['relay']}: CPU per chunk / nginx's (the relay process)", spec[0]["relay_only_vs_nginx"], 1.0)
    one = next((r for r in spec if r.get("workers") == 1), None)
    for row in spec:
        n = row.get("workers")
        if one is None or n is None or n == 1 or not one["chunks_per_s"] or row["chunks_per_s"] is None:
            continue
        limit = SCALING_TARGETS.get(n, 1.8 if len(spec) == 2 else None)  # one N beside 1: the 1.8x of two workers
        if limit is not None:
            add(
                f"{row['relay']} / --workers 1: chunks/s at saturation",
                row["chunks_per_s"] / one["chunks_per_s"],
                limit,
                higher_is_better=True,
            )
    return out
