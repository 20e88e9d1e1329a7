"""``specproxy run`` against the simulator over real sockets: pacing, warm-up, repeats, shards, the proxy's view."""

from __future__ import annotations

import asyncio
import itertools
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from simutil import running_sim

from specproxy.core.record import read_records
from specproxy.core.schedule import arrival_offsets
from specproxy.loadgen.plan import BodyOptions, Shard
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.session import RunOutcome, run_load
from specproxy.loadgen.summary import format_summary
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import RecorderConfig
from specproxy.sim import SimConfig
from specproxy.workloads import load_workload
from tests.proxyutil import running_proxy

SIM = SimConfig(port=0, speed=50.0)


def make_spec(target: str, *, workloads: tuple[str, ...] = ("ja_chat",), max_tokens: int = 8, **kw: Any) -> LoadSpec:
    return LoadSpec(
        target=Target(target),
        workloads=tuple(load_workload(w) for w in workloads),
        body=BodyOptions(model="", max_tokens=max_tokens),
        recorder=RecorderConfig(metrics_url=target + "/metrics", run_id=uuid.uuid4().hex[:12], finalize_wait_s=2.0),
        **kw,
    )


async def go(spec: LoadSpec, out: Path, **kw: Any) -> RunOutcome:
    return await run_load(spec, out=out, progress=False, handle_signals=False, **kw)


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])  # ends sort before starts at a tie
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


async def test_closed_loop_holds_n_in_flight_and_never_more(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim:
        outcome = await go(make_spec(sim.url, concurrency=4, requests=40, max_tokens=24), out)
        truths = list(sim.state.truth.values())
    assert outcome.exit_code == 0 and outcome.summary.requests == 40
    assert len(truths) == 40
    server_spans = [(t.submitted_at_s, t.finished_at_s) for t in truths]
    assert all(a is not None and b is not None for a, b in server_spans)
    assert max_overlap(server_spans) == 4  # type: ignore[arg-type]
    records = list(read_records(out))
    client_spans = [(r["started_at"], r["started_at"] + r["e2e_s"]) for r in records]
    assert max_overlap(client_spans) == 4
    assert {r["outcome"] for r in records} == {"ok"} and {r["repeat"] for r in records} == {0}


async def test_open_loop_sends_on_the_schedule_and_reports_lag(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    n, rate = 50, 40.0
    async with running_sim(SIM) as sim:
        outcome = await go(make_spec(sim.url, rate=rate, requests=n, seed=5), out)
    starts = sorted(r["started_at"] for r in read_records(out))
    planned = arrival_offsets(n, rate, "poisson", seed=5)
    assert len(starts) == n
    # Sent on absolute targets: every send within a bound of its planned offset, so the rate is the schedule's.
    drift = sorted(abs((s - starts[0]) - p) for s, p in zip(starts, planned, strict=True))
    assert drift[n // 2] < 0.05 and drift[-1] < 0.25  # bounds loose enough for a busy 2-core machine
    achieved = (n - 1) / (starts[-1] - starts[0])
    assert abs(achieved / ((n - 1) / planned[-1]) - 1) < 0.1
    lag = outcome.summary.send_lag_s
    assert lag is not None and lag.count == n and lag.p50 is not None and lag.p50 < 0.05
    assert "send lag" in format_summary(outcome.summary)


async def test_duration_bounds_an_open_loop_run(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim:
        outcome = await go(make_spec(sim.url, rate=100.0, requests=None, duration_s=0.5, arrival="constant"), out)
    assert outcome.summary.requests == 50  # offsets 0, 0.01, ... 0.49


async def test_warmup_is_sent_but_not_recorded(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim:
        outcome = await go(make_spec(sim.url, concurrency=2, requests=5, warmup=3), out)
        served = len(sim.state.truth)
    assert served == 8
    assert len(list(read_records(out))) == 5
    assert outcome.summary.warmup_sent == 3 and outcome.summary.warmup_failed == 0
    assert "warm-up: 3 requests sent, not recorded" in format_summary(outcome.summary)


async def test_repeat_runs_the_same_plan_n_times_and_reports_medians(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim:
        outcome = await go(make_spec(sim.url, workloads=("ja_chat", "code_agent"), concurrency=2, requests=6,
                                     repeat=3, seed=1), out)  # fmt: skip
    records = list(read_records(out))
    assert Counter(r["repeat"] for r in records) == {0: 6, 1: 6, 2: 6}
    per_repeat = {
        rep: sorted(orjson.dumps(r["request"]["messages"]) for r in records if r["repeat"] == rep) for rep in range(3)
    }
    assert per_repeat[0] == per_repeat[1] == per_repeat[2]  # the same plan every time
    assert len({r["run_id"] for r in records}) == 1
    for w in outcome.summary.workloads:
        decode = w.figures["decode_tok_s_p50"]
        assert w.repeats == 3 and decode.n == 3
        assert decode.min is not None and decode.max is not None
        assert decode.min <= (decode.value or 0) <= decode.max
    text = format_summary(outcome.summary)
    assert "medians over 3 repeats" in text and "code_agent" in text and "ja_chat" in text


async def test_run_and_proxy_records_agree(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim, running_proxy(sim.url, tmp_path) as proxy:
        outcome = await go(make_spec(proxy.url, workloads=("ja_chat", "code_agent"), concurrency=3, requests=12,
                                     max_tokens=32), out)  # fmt: skip
        await proxy.flush()
        proxied: dict[Any, Any] = {r["upstream_id"]: r for r in proxy.records() if r.get("upstream_id")}
    assert outcome.exit_code == 0
    ran = list(read_records(out))
    assert len(ran) == 12 and len(proxied) == 12
    for r in ran:
        p = proxied[r["upstream_id"]]
        assert p["workload"] == r["workload"]  # the run's workload header reached the proxy
        assert p["completion_tokens"] == r["completion_tokens"]
        assert p["request"] == r["request"]
        # Both sides read the same chunks: the same steps and accepted tokens. (Which estimate each side then
        # prefers can differ under overlap: the counter attribution depends on when each side's scrapes land.)
        pc, rc = p["spec"]["estimates"]["chunks"], r["spec"]["estimates"]["chunks"]
        assert (pc["accepted"], pc["drafts"]) == (rc["accepted"], rc["drafts"])
        assert rc["accepted"] > 0
        assert p["chunks"] and [n for _, n in p["chunks"]] == [n for _, n in r["chunks"]]


async def test_shards_together_are_the_whole_run(tmp_path: Path) -> None:
    whole, shards = tmp_path / "whole.jsonl", tmp_path / "shards"
    kw: dict[str, Any] = {"workloads": ("ja_chat", "code_agent"), "concurrency": 2, "requests": 11, "seed": 9}
    async with running_sim(SIM) as sim:
        await go(make_spec(sim.url, **kw), whole)
        base = make_spec(sim.url, **kw)
        for i in range(2):
            await go(LoadSpec(**{**_fields(base), "shard": Shard(i, 2), "concurrency": 2}), shards / f"s{i}.jsonl")

    def key(r: dict[str, Any]) -> tuple[str, bytes]:
        return r["workload"], orjson.dumps(r["request"]["messages"])

    one = Counter(key(r) for r in read_records(whole))
    merged = list(read_records(shards))  # a directory of shard files reads as one run
    assert Counter(key(r) for r in merged) == one
    assert sum(one.values()) == 11
    assert len({r["run_id"] for r in merged}) == 1


def leftovers(directory: Path) -> list[Path]:
    return list(directory.glob("*.worker*"))


def _fields(spec: LoadSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


async def test_workers_split_the_plan_and_merge_records(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim:
        spec = make_spec(sim.url, workloads=("ja_chat", "code_agent"), concurrency=4, requests=16, seed=2)
        outcome = await go(spec, out, workers=2, learn_k_from=sim.url + "/metrics")
    records = list(read_records(out))
    assert len(records) == 16 and outcome.summary.requests == 16
    assert leftovers(tmp_path) == []  # parts appended to OUT and removed
    assert {r["run_id"] for r in records} == {spec.recorder.run_id}
    assert all(r["outcome"] == "ok" for r in records)


def test_max_overlap_counts_touching_spans_once() -> None:
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1
    assert max_overlap(list(itertools.repeat((0.0, 1.0), 3))) == 3


async def test_run_summary_is_the_report_for_the_same_file(tmp_path: Path) -> None:
    """The figures `specproxy run` prints at the end are `specproxy report --by workload` on its record file."""
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM) as sim:
        spec = make_spec(sim.url, workloads=("ja_chat", "code_agent"), requests=8, max_tokens=16, repeat=2)
        outcome = await go(spec, out)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "report", str(out), "--by", "workload", "--format", "json",
        stdout=asyncio.subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    stdout, _ = await proc.communicate()
    assert proc.returncode == 0
    report = {g["key"]["workload"]: g for g in orjson.loads(stdout)["groups"]}
    summary = {g.get("workload"): g for g in outcome.summary.workloads}
    assert list(summary) == ["ja_chat", "code_agent"] == list(report)
    for w, g in summary.items():
        assert g.repeats == report[w]["repeats"] == 2 and g.requests == report[w]["requests"]
        assert {name: fig.as_dict() for name, fig in g.figures.items()} == report[w]["figures"]
        assert g.figure("decode_tok_s_p50") and g.figure("acceptance_rate") is not None
    printed = format_summary(outcome.summary)
    for w, g in report.items():
        decode = g["figures"]["decode_tok_s_p50"]["value"]
        assert f"{decode:.1f}" in next(line for line in printed.splitlines() if line.startswith(w))
