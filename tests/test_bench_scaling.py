"""``specproxy bench`` for scaling: a row per ``--workers N``, roles on CPUs of their own, several upstream and client
processes, the bookkeeper's ceiling from what the relays shed.

The small sizes run on a 2-core machine; the figures themselves come from a larger one (docs/bench.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specproxy.bench.config import BenchConfig
from specproxy.bench.floors import SPLICE_PREFIX
from specproxy.bench.procs import (
    CpuListError,
    available_cpus,
    format_cpus,
    on_cpus,
    parse_cpus,
    python_child,
    tree,
)
from specproxy.bench.roles import connection_owners, cpu_series
from specproxy.bench.run import worker_rows
from specproxy.bench.upstream import Counters, SharedCounters
from specproxy.bench.verdicts import bookkeeper_ceiling, targets
from specproxy.bench.wire import StampScan
from specproxy.core.prom import detect_engine, parse_snapshot, spec_counters

CPU0 = min(available_cpus())


def test_cpu_lists_read_as_taskset_writes_them() -> None:
    have = frozenset(range(16))
    assert parse_cpus("0-3,8", available=have) == {0, 1, 2, 3, 8}
    assert parse_cpus(" 5 , 7-7 ", available=have) == {5, 7}
    assert format_cpus({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert format_cpus(parse_cpus("2,0,1", available=have)) == "0-2"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "takes CPU numbers and ranges like 0-3,8"),
        ("0-", "takes CPU numbers and ranges like 0-3,8"),
        ("a", "takes CPU numbers and ranges like 0-3,8"),
        ("1,,2", "takes CPU numbers and ranges like 0-3,8"),
        ("-1", "takes CPU numbers and ranges like 0-3,8"),
        ("3-1", "the range 3-1 runs backwards"),
        ("2-17", "CPU 16-17 not available to this process (available: 0-15)"),
    ],
)
def test_a_bad_cpu_list_says_why_in_one_line(text: str, says: str) -> None:
    with pytest.raises(CpuListError) as e:
        parse_cpus(text, "--cpus-relays", available=frozenset(range(16)))
    assert says in str(e.value) and str(e.value).startswith("--cpus-relays") and "\n" not in str(e.value)


async def test_a_pinned_child_and_what_it_starts_run_on_those_cpus() -> None:
    script = (
        "import os, subprocess, sys\n"
        "print(sorted(os.sched_getaffinity(0)))\n"
        "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
        " capture_output=True, text=True).stdout.strip())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, preexec_fn=on_cpus(frozenset({CPU0}))
    )
    out, _ = await proc.communicate()
    assert out.decode().split("\n")[:2] == [f"[{CPU0}]", f"[{CPU0}]"]
    assert on_cpus(None) is None and on_cpus(frozenset()) is None


def test_upstream_processes_on_one_port_sum_their_counters(tmp_path: Path) -> None:
    a, b = Counters(), Counters()
    sa, sb = (SharedCounters(c, str(tmp_path / "c"), i, 2) for i, c in enumerate((a, b)))
    for c, n in ((a, 3), (b, 5)):
        c.sent(True, 1)
        for i in range(n):
            c.sent(False, (1, 2, 1, 3)[i % 4])
    sb.publish()
    total = sa.total()  # publishes its own slot, reads the other's
    assert total.values() == [x + y for x, y in zip(a.values(), b.values(), strict=True)]
    assert total.prefills == 2 and total.steps == 8
    with pytest.raises(ValueError, match=r"slot 2 not in 0\.\.1"):
        SharedCounters(Counters(), str(tmp_path / "c"), 2, 2)


async def test_two_upstream_processes_serve_one_port_and_one_engine(tmp_path: Path) -> None:
    shared = ["--reuse-port", "--shared", str(tmp_path / "c"), "--slots", "2", "--steps-per-s", "0"]
    mod = "specproxy.bench.upstream"
    async with python_child("-m", mod, *shared, "--slot", "0", url_on="stdout") as first:
        port = first.url.rsplit(":", 1)[1]
        async with python_child("-m", mod, *shared, "--slot", "1", "--port", port, url_on="stdout") as second:
            assert second.url == first.url
            body = {"model": "bench", "messages": [], "max_tokens": 4, "stream": True}
            for _ in range(12):  # a connection each: the kernel spreads them over both processes
                async with aiohttp.ClientSession() as s, s.post(first.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200 and b"data: [DONE]" in await r.read()
            for _ in range(100):  # each publishes its slot every 5 ms; a busy machine may delay one
                async with aiohttp.ClientSession() as s, s.get(first.url + "/metrics") as r:
                    snap = parse_snapshot(await r.text())
                spec = spec_counters(detect_engine(snap), snap.values)
                if (spec.drafts or 0) >= 12 * 3:
                    break
                await asyncio.sleep(0.02)
    assert spec.drafts == spec.decode_steps == 12 * 3  # every stream's 3 decode steps, whichever process sent them
    assert spec.draft_tokens == 12 * 3 * 3


async def test_the_splice_floor_in_two_processes_serves_one_port_and_ends_with_its_launcher() -> None:
    """``floors splice --processes 2``: two named splice processes on one port, the kernel spreading connections over
    both (as over ``--workers 2``'s relays), every stream relayed whole; the bench samples each as a relay process."""
    async with python_child("-m", "specproxy.bench.upstream", "--steps-per-s", "0", url_on="stdout") as up:
        floor = python_child("-m", "specproxy.bench.floors", "splice", "--upstream", up.url, "--processes", "2")
        async with floor as splice:
            procs = [p for p in tree(splice.pid) if p != splice.pid]
            assert len(procs) == 2
            assert sorted(cpu_series(splice.pid, ())) == sorted(["relay", *(f"relay {p}" for p in procs)])
            port = int(splice.url.rsplit(":", 1)[1])
            body = json.dumps({"model": "bench", "messages": [], "max_tokens": 4, "stream": True}).encode()
            head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(16)]
            try:
                for reader, writer in conns:  # a stream each, relayed whole, the connection kept open
                    writer.write(head.encode() + body)
                    got = await asyncio.wait_for(reader.readuntil(b"data: [DONE]\n\n"), 30)
                    assert got.startswith(b"HTTP/1.1 200")
                owners = {k: v for k, v in connection_owners(tuple(procs), port).items() if k}  # not the listeners
            finally:
                for _, writer in conns:
                    writer.close()
        assert len(owners) == 16 and set(owners.values()) == set(procs)  # both took connections (2 ** -15 to fail)
        for _ in range(200):  # the launcher stopped them on its way out
            if not _alive(procs):
                break
            await asyncio.sleep(0.05)
        assert not _alive(procs)


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_the_splice_processes_say_what_they_are() -> None:
    assert SPLICE_PREFIX.startswith("sp-") and len(SPLICE_PREFIX) + 2 <= 15  # a Linux comm: 15 bytes
    bad = subprocess.run(
        [sys.executable, "-m", "specproxy.bench.floors", "aiohttp", "--upstream", "x", "--processes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "more than 1 only for splice" in bad.stderr and "Traceback" not in bad.stderr


def _sat(
    workers: int | None, chunks: float, shed: int = 0, bk_ms: float = 10.0, span: float = 5.0, settle: float = 1.1
) -> dict[str, Any]:
    return {
        "relay": f"specproxy --workers {workers}" if workers else "direct",
        "workers": workers,
        "streams": 64,
        "chunks_per_s": chunks,
        "span_s": span,
        "settle_s": settle if workers else None,
        "shed_chunks": shed if workers else None,
        "shed_requests": (1 if shed else 0) if workers else None,
        "bookkeeping_cores": chunks * bk_ms / 1e6 if workers else None,
        "bookkeeping_cpu_ms_per_1000": bk_ms if workers else None,
    }


def test_the_bookkeepers_ceiling_lies_between_the_highest_rate_it_kept_up_with_and_the_lowest_it_did_not() -> None:
    rows = [_sat(None, 300_000), _sat(1, 60_000), _sat(2, 110_000), _sat(4, 150_000, shed=900), _sat(8, 160_000, 5)]
    bk = bookkeeper_ceiling(rows)
    assert bk is not None and bk["shedding"]
    assert bk["last_sustained"]["workers"] == 2 and bk["first_behind"]["workers"] == 4
    assert bk["first_behind"]["shed_chunks"] == 900 and bk["first_behind"]["behind"] == "shed"
    assert bk["events_per_bookkeeper_cpu_s"] == pytest.approx(100_000)
    # nothing shed, but still working long after the last event (its backlog fit in the relays' buffers): behind
    lag = bookkeeper_ceiling([_sat(1, 60_000), _sat(8, 90_000, settle=18.8)])
    assert lag is not None and not lag["shedding"]
    assert lag["first_behind"]["workers"] == 8 and lag["first_behind"]["behind"] == "lagging"
    # a phase too short to say anything of a sustained rate is left out, as is a row without the proxy's status
    short = bookkeeper_ceiling([_sat(1, 60_000), _sat(4, 500_000, span=0.1), {**_sat(2, 70_000), "shed_chunks": None}])
    assert short is not None and short["last_sustained"]["chunks_per_s"] == 60_000 and short["first_behind"] is None
    assert bookkeeper_ceiling([_sat(None, 1.0)]) is None  # no specproxy row


def test_scaling_targets_are_two_and_four_workers_against_one() -> None:
    sat = [_sat(None, 300_000), _sat(1, 50_000), _sat(2, 95_000), _sat(4, 170_000), _sat(8, 200_000)]
    got = {t["target"]: t for t in targets([], sat)}
    two = got["specproxy --workers 2 / --workers 1: chunks/s at saturation"]
    four = got["specproxy --workers 4 / --workers 1: chunks/s at saturation"]
    assert (two["value"], two["limit"], two["pass"]) == (1.9, 1.8, True)
    assert (four["value"], four["limit"], four["pass"]) == (3.4, 3.5, False)
    assert not any("--workers 8" in t for t in got)  # no target of its own: its ratio is in the table
    legacy = {t["target"]: t for t in targets([], [_sat(None, 1.0), _sat(1, 50_000), _sat(8, 100_000)])}
    assert legacy["specproxy --workers 8 / --workers 1: chunks/s at saturation"]["limit"] == 1.8


def test_worker_rows_always_start_at_one() -> None:
    assert worker_rows(BenchConfig(worker_rows=(8, 2, 4, 2))) == (1, 2, 4, 8)
    assert worker_rows(BenchConfig(workers=3)) == (1, 3)
    assert worker_rows(BenchConfig(workers=1)) == (1,)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--cpus-relays", "99999"), "--cpus-relays: CPU 99999 not available to this process"),
        (("--cpus-client", "0-x"), "--cpus-client takes CPU numbers and ranges like 0-3,8"),
        (("--workers", "1,two"), "--workers takes N or a list like 1,2,4,8"),
        (("--workers", "0,2"), "--workers must be at least 1"),
        (("--hostile", "--workers", "1,2"), "--hostile takes one --workers N"),
        (("--upstreams", "0"), "--upstreams must be at least 1"),
        (("--burst", "-1"), "--burst takes streams"),
        (("--relay-each",), "--relay-each needs --cpus-relays"),
    ],
)
def test_bad_scaling_options_are_one_line_errors(args: tuple[str, ...], says: str) -> None:
    p = _cli(*args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert says in " ".join(p.stderr.split()), p.stderr  # the usage box may wrap the message
    assert "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_pinned_scaling_run_at_a_tiny_scale() -> None:
    cpus = sorted(available_cpus())
    load, relays = (cpus[:1], cpus[-1:]) if len(cpus) > 1 else (cpus, cpus)
    p = subprocess.run(
        [
            sys.executable, "-m", "specproxy", "bench", "--streams", "3", "--tokens", "60", "--steps-per-s", "50",
            "--workers", "1,2", "--clients", "2", "--upstreams", "2", "--burst", "4", "--burst-tokens", "5",
            "--saturation-streams", "4", "--saturation-tokens", "200", "--no-nginx",
            "--cpus-upstream", format_cpus(load), "--cpus-client", format_cpus(load),
            "--cpus-relays", format_cpus(relays), "--relay-each", "--format", "json",
        ],
        capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["config"]["cpus_relays"] == relays and r["config"]["upstreams"] == 2
    assert f"on CPU{'s' if len(load) > 1 else ''} {format_cpus(load)}" in r["sharing"]
    assert "each specproxy relay process on one of those CPUs" in r["sharing"] and r["config"]["relay_each"]
    assert not any("could not be pinned" in n or "never listed" in n for n in r["notes"]), r["notes"]
    names = ["direct", "specproxy --workers 1", "specproxy --workers 2"]
    (level,) = r["levels"]
    assert [row["relay"] for row in level["rows"]] == names
    assert [row["relay"] for row in r["burst"]] == names and [row["relay"] for row in r["saturation"]] == names
    for row in r["burst"]:
        assert row["events"] == row["expected"] == 4 * 5 and row["ttft_p99_ms"] >= row["ttft_p50_ms"] > 0
    for row in [*level["rows"], *r["saturation"]]:
        assert row["events"] == row["expected"] and not row["errors"]
        assert row["upstream_cores"] is not None and row["client_cores"] is not None
        if row["relay"] != "direct":
            assert row["shed_chunks"] == 0 and row["shed_requests"] == 0 and row["lost_records"] == 0
            assert row["bookkeeping_cores"] is not None and row["relay_only_cores"] is not None
    one, two = r["saturation"][1:]
    assert one["vs_workers_1"] == 1.0 and two["vs_workers_1"] == two["chunks_per_s"] / one["chunks_per_s"]
    assert r["bookkeeper"] is not None and not r["bookkeeper"]["shedding"]
    assert any(t["target"].startswith("specproxy --workers 2 / --workers 1") for t in r["targets"])


@pytest.mark.parametrize("events", [37, 203])
async def test_an_unpaced_stream_in_batches_sends_every_event_once_and_counts_them(events: int) -> None:
    """Batches of 16 (written as repeated cycles of step sizes when they can be): every event once, in order, and
    the counters say what the events carry, token for token."""
    body = {"model": "bench", "messages": [], "max_tokens": events, "stream": True}
    async with (
        python_child("-m", "specproxy.bench.upstream", "--steps-per-s", "0", "--batch", "16", url_on="stdout") as up,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(up.url + "/v1/chat/completions", json=body) as r:
            data = await r.read()
        async with s.get(up.url + "/metrics") as r:
            snap = parse_snapshot(await r.text())
    stamps = StampScan().feed(data)
    assert len(stamps) == events and data.endswith(b"data: [DONE]\n\n")
    assert data.count(b'"finish_reason":"stop"') == 1
    assert stamps == sorted(stamps, key=int)
    tokens = [e.count(b"tok ") for e in data.split(b"\n\n") if b'"t_ns"' in e]
    assert tokens[0] == 1 and all(n in (1, 2, 3) for n in tokens)
    counters = spec_counters(detect_engine(snap), snap.values)
    assert counters.drafts == events - 1  # every event but the prefill
    assert counters.accepted == sum(n - 1 for n in tokens[1:]) and counters.generation_tokens == sum(tokens)
