"""The proxy's processes as the bench sees them: whether it has workers, its status (and when the bookkeeping has
caught up with a phase), what its relays shed, its processes pinned to CPUs, and the sentence that says what shares
which cores."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

import aiohttp

from specproxy.bench.config import BenchConfig, Relay
from specproxy.bench.floors import SPLICE_PREFIX
from specproxy.bench.procs import format_cpus, named_stat, pin_process, tree
from specproxy.bench.wire import now_ns
from specproxy.proxy.link import STATS_INTERVAL_S
from specproxy.proxy.names import RELAY_PREFIX

_TICK = os.sysconf("SC_CLK_TCK")


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
        calm = calm + 1 if not (st.get("partial") or bk.get("backlog_bytes") or bk.get("relay_in_flight")) else 0
        if calm >= 2 or loop.time() > end:
            return st


def shed_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if before is None or after is None:
        return {"shed_chunks": None, "shed_requests": None, "lost_records": None}
    b, a = before["bookkeeping"], after["bookkeeping"]
    return {
        "shed_chunks": int(a["shed"].get("chunk", 0)) - int(b["shed"].get("chunk", 0)),
        "shed_requests": int(a["shed_requests"]) - int(b["shed_requests"]),
        "lost_records": int(a["lost_records"]) - int(b["lost_records"]),
    }


async def pin_roles(relay: Relay, cfg: BenchConfig, notes: list[str]) -> None:
    """specproxy's bookkeeping process on CPUs of its own, and with ``relay_each`` each relay process on one CPU of
    the relays', in turn: found by the pids its status gives, once every relay has reported."""
    for _ in range(100):
        st = await proxy_status(relay.url)
        bk = st.get("bookkeeping", {}) if st is not None and not st.get("partial") else {}  # partial: a relay's pid
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


def cpu_series(root: int | None, upstream_pids: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """What to sample for saturation's window (bench/window.py): each of specproxy's relay processes (``relay
    PID``; the splice floor's processes likewise), all of them (``relay``; a relay that does not name its processes:
    its whole tree), the upstream's."""
    out: dict[str, tuple[int, ...]] = {}
    if root is not None:
        pids = tree(root)
        each = [p for p in pids if (named := named_stat(p)) and named[0].startswith((RELAY_PREFIX, SPLICE_PREFIX))]
        for p in each:
            out[f"relay {p}"] = (p,)
        out["relay"] = tuple(each) or tuple(pids)
    if upstream_pids:
        out["upstream"] = upstream_pids
    return out


async def sample_cpu(
    series: dict[str, tuple[int, ...]], done: asyncio.Event, listen_port: int = 0, every_s: float = 0.02
) -> tuple[dict[str, list[tuple[int, float]]], dict[int, int]]:
    """Each series' CPU-seconds, read every ``every_s`` with the time of reading, until ``done``; and every half second
    which process of series ``relay`` holds each client connection to ``listen_port`` (client port: pid)."""
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in series}
    owners: dict[int, int] = {}
    i = 0
    while True:
        t = now_ns()
        for k, pids in series.items():
            out[k].append((t, cpu_s(pids)))
        if listen_port and i % max(1, round(0.5 / every_s)) == 0:
            owners.update(connection_owners(series.get("relay", ()), listen_port))
        i += 1
        if done.is_set() or not series:
            return out, owners
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), every_s)


async def sample_phase(
    relay: Relay, upstream_pids: tuple[int, ...], done: asyncio.Event, on: bool
) -> tuple[dict[str, list[tuple[int, float]]], dict[int, int]]:
    """At saturation (``on``), :func:`sample_cpu` of the relay's processes and the upstream's, and which relay
    process holds each client connection; else nothing."""
    if not on:
        return {}, {}
    port = int(relay.url.rsplit(":", 1)[1]) if relay.pid else 0
    return await sample_cpu(cpu_series(relay.pid, upstream_pids), done, port)


def connection_owners(pids: tuple[int, ...], listen_port: int) -> dict[int, int]:
    """Which of ``pids`` holds each accepted loopback connection on ``listen_port``: the client's port, the pid
    (``/proc/PID/fd`` gives each process's socket inodes, ``/proc/net/tcp`` each inode's ports)."""
    by_inode: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        by_inode[link[8:-1]] = pid
    out: dict[int, int] = {}
    try:
        with open("/proc/net/tcp") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        cols = line.split()
        if len(cols) > 9 and cols[9] in by_inode and int(cols[1].rsplit(":", 1)[1], 16) == listen_port:
            out[int(cols[2].rsplit(":", 1)[1], 16)] = by_inode[cols[9]]
    return out


def cpu_s(pids: tuple[int, ...]) -> float:
    """User + system seconds of these live processes (not their children)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        ticks += int(rest[11]) + int(rest[12])
    return ticks / _TICK


def sharing(cfg: BenchConfig) -> str:
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
