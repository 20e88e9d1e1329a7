"""``specproxy replay`` against the simulator: order, timing, links to the originals, requests it cannot re-send."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import orjson
from simutil import running_sim

from specproxy.core.record import read_records
from specproxy.loadgen.replay import plan_replay
from specproxy.loadgen.session import RunOutcome, replay
from specproxy.loadgen.summary import format_summary
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import RecorderConfig
from specproxy.sim import SimConfig

SIM = SimConfig(port=0, speed=50.0)
GAPS_S = [0.0, 0.3, 0.05, 0.45, 0.2, 0.0, 0.4]  # includes two requests at the same instant


def recording(path: Path, *, t0: float = 1_700_000_000.0) -> list[dict[str, Any]]:
    """A hand-made recording: bodies with distinct prompts, start times with known gaps, two workloads."""
    records = []
    t = t0
    for i, gap in enumerate(GAPS_S):
        t += gap
        records.append({
            "schema_version": 1, "request_id": f"orig-{i}", "started_at": t, "workload": "ja" if i % 2 else "code",
            "method": "POST", "path": "/v1/chat/completions", "outcome": "ok",
            "request": {"model": "sim-model", "messages": [{"role": "user", "content": f"request number {i}"}],
                        "max_tokens": 8, "stream": True,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        })  # fmt: skip
    no_body = {**records[2], "request_id": "orig-nobody", "request": None}
    get = {**records[3], "request_id": "orig-get", "method": "GET", "path": "/v1/models", "request": None}
    records[3:3] = [no_body, get]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in reversed(records)))  # file order != start order
    return records


async def run(target: str, rec: Path, out: Path, *, speed: float | None, cap: int | None = None) -> RunOutcome:
    plan = plan_replay(read_records(rec), speed=speed)
    cfg = RecorderConfig(record_path=str(out), metrics_url=target + "/metrics", run_id=uuid.uuid4().hex[:12])
    return await replay(plan, target=Target(target), recorder_cfg=cfg, cap=cap, progress=False, handle_signals=False)


async def test_replay_keeps_order_and_scaled_timing_and_links_originals(tmp_path: Path) -> None:
    rec, out = tmp_path / "orig.jsonl", tmp_path / "replay.jsonl"
    original = recording(rec)
    async with running_sim(SIM) as sim:
        outcome = await run(sim.url, rec, out, speed=2.0)
    # Expected order: by start time, ties in the file's order (the file lists them in reverse).
    sendable = sorted((r for r in reversed(original) if r["request"]), key=lambda r: r["started_at"])
    by_original = {r["replay_of"]: r for r in read_records(out)}
    replayed = [by_original[o["request_id"]] for o in sendable]
    assert len(by_original) == len(sendable) == 7
    assert all(b["started_at"] >= a["started_at"] for a, b in itertools.pairwise(replayed))  # sent in order
    for r, o in zip(replayed, sendable, strict=True):
        assert r["workload"] == o["workload"] and r["request"] == o["request"]
        assert r["outcome"] == "ok" and r["request_id"] != r["replay_of"]
    # Each send lands on its scaled offset, give or take how late the replay says it was: a loaded host delays
    # sends (the summary's send lag), but the schedule stays absolute, so one late send does not shift the rest.
    lag = outcome.summary.send_lag_s
    assert lag is not None and lag.count == 7
    t0, o0 = replayed[0]["started_at"], sendable[0]["started_at"]
    for r, o in zip(replayed, sendable, strict=True):
        assert abs((r["started_at"] - t0) - (o["started_at"] - o0) / 2.0) < 0.1 + lag.max
    gaps = [b["started_at"] - a["started_at"] for a, b in itertools.pairwise(replayed)]
    assert max(gaps) > 0.15  # the 0.45 s gap, halved: the replay really waited
    text = format_summary(outcome.summary)
    assert "1 of 9 recorded requests had no body (recorded with --capture none): not replayed" in text
    assert "1 of 9 recorded requests were not POSTs" in text
    assert outcome.exit_code == 0


async def test_max_speed_is_bounded_by_the_cap_and_two_replays_pair_up(tmp_path: Path) -> None:
    rec = tmp_path / "orig.jsonl"
    recording(rec)
    async with running_sim(SIM) as fast, running_sim(SIM, spec_method="none") as plain:
        a = await run(fast.url, rec, tmp_path / "a.jsonl", speed=None, cap=2)
        b = await run(plain.url, rec, tmp_path / "b.jsonl", speed=None, cap=2)
        truths = list(fast.state.truth.values())
    assert a.summary.requests == b.summary.requests == 7
    spans = sorted([(t.submitted_at_s, 1) for t in truths] + [(t.finished_at_s, -1) for t in truths])
    level = peak = 0
    for _, d in spans:
        level += d
        peak = max(peak, level)
    assert peak == 2
    # The same originals on both sides: per-request pairs for a speedup.
    ra = {r["replay_of"]: r for r in read_records(tmp_path / "a.jsonl")}
    rb = {r["replay_of"]: r for r in read_records(tmp_path / "b.jsonl")}
    assert set(ra) == set(rb) and len(ra) == 7
    assert all(r["spec"] and r["spec"]["accepted"] is not None for r in ra.values())
    assert all(not (r["spec"] or {}).get("source") for r in rb.values())  # no speculation on the plain server
