"""Records written promptly, corrected later: a record whose counters' share rests on a per-workload model still being
fitted is written when its request ends, flagged ``correction_pending``, and a later correction line carries the
fields that changed once the model was stable. Readers (``read_records``, the analysis commands) apply the
corrections; a record whose correction never came (the proxy was killed) reads as first written.

The reader is checked on lines built here; the writer through a real proxy in front of the simulator (ngram, whose
drafting model a few overlapping requests cannot pin down), in this process and as ``specproxy proxy`` killed with
SIGKILL while its records wait for their corrections.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from specproxy.analysis.inputs.runs import read_run
from specproxy.analysis.report.accum import build_report
from specproxy.core import record as record_mod
from specproxy.core.record import (
    CORRECTION_PENDING,
    SCHEMA_VERSION,
    Correction,
    RecordError,
    as_record,
    correction_line,
    parse_line,
    read_records,
)
from tests.proxyutil import proxy_process, running_proxy
from tests.simutil import chat_body, running_sim, sim_process
from tests.test_proxy_sim_attribution import CODE_PROMPTS, JA_PROMPTS, _send, _wait_ready


def _rec(rid: str, accepted: float, *, pending: bool, run_id: str = "r1") -> dict[str, Any]:
    spec = {
        "source": "counters",
        "accepted": accepted,
        "drafts": 10.0,
        "draft_tokens": 30.0,
        "k": 3.0,
        "acceptance_rate": accepted / 30.0,
        "mean_acceptance_length": 1 + accepted / 10.0,
        "per_position": [],
        "tokens_per_step": {},
        "server_source": None,
        "estimates": {"server": None, "chunks": None, "counters": None},
    }
    flags = ["counters_unsettled"] + ([CORRECTION_PENDING] if pending else [])
    return dict(
        as_record({"request_id": rid, "run_id": run_id, "workload": "w", "path": "/v1/chat/completions",
                   "outcome": "ok", "stream": True, "chunks": [[0.1, 1], [0.2, 4]], "completion_tokens": 5,
                   "spec": spec, "flags": flags}),
    )  # fmt: skip


def _lines(*objs: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


def test_a_correction_turns_the_early_record_into_the_final_one() -> None:
    early = _rec("a", 3.0, pending=True)
    final = _rec("a", 21.0, pending=False)
    final["flags"] = ["counters_unsettled"]
    line = correction_line(early, final)  # type: ignore[arg-type]
    assert line["correction_of"] == "a" and line["schema_version"] == SCHEMA_VERSION
    assert set(line["fields"]) == {"spec", "flags"}  # only what changed, and the flags always
    c = parse_line(orjson.dumps(line))
    assert isinstance(c, Correction) and c.fields["flags"] == ["counters_unsettled"]
    for bad, why in (
        ({"correction_of": 3, "fields": {}}, "correction_of"),
        ({"correction_of": "a", "fields": []}, "fields"),
        ({"correction_of": "a", "fields": {}, "schema_version": SCHEMA_VERSION + 1}, "newer"),
    ):
        with pytest.raises(RecordError, match=why):
            parse_line(orjson.dumps(bad))


def test_read_records_applies_corrections_across_rotations_and_keeps_the_rest(tmp_path: Path) -> None:
    p = tmp_path / "rec.jsonl"
    a0, b0 = _rec("a", 3.0, pending=True), _rec("b", 6.0, pending=True)
    a1 = {**_rec("a", 21.0, pending=False), "flags": []}
    plain = _rec("c", 12.0, pending=False)
    other_run = _rec("a", 9.0, pending=True, run_id="r2")  # same request id, another run: not corrected by r1's line
    (tmp_path / "rec.jsonl.1").write_bytes(_lines(a0, other_run, b0, plain))
    p.write_bytes(_lines(correction_line(a0, a1), {"correction_of": "zz", "run_id": "r1", "fields": {"flags": []}}))  # type: ignore[arg-type]
    recs = list(read_records(p))
    by = {(r["run_id"], r["request_id"]): r for r in recs}
    assert len(recs) == 4  # the orphan correction adds nothing
    assert by[("r1", "a")]["spec"]["accepted"] == 21.0 and by[("r1", "a")]["flags"] == []
    assert by[("r1", "c")]["spec"]["accepted"] == 12.0
    # never corrected (the writer stopped first): as written, still saying so
    assert CORRECTION_PENDING in by[("r1", "b")]["flags"] and by[("r1", "b")]["spec"]["accepted"] == 6.0
    assert CORRECTION_PENDING in by[("r2", "a")]["flags"] and by[("r2", "a")]["spec"]["accepted"] == 9.0
    # the analysis reader agrees, chunks kept
    items = list(read_run(p))
    assert {(i.rec["run_id"], i.rec["request_id"]): i.rec["spec"]["accepted"] for i in items} == {
        k: r["spec"]["accepted"] for k, r in by.items()
    }
    assert all(i.seg for i in items)
    acc = build_report([i.full() for i in items], ("workload",)).groups[0].acceptance
    assert acc.accepted == 21.0 + 6.0 + 12.0 + 9.0


def test_a_reader_holds_a_bounded_number_of_records_awaiting_corrections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_mod, "MAX_AWAITING", 3)
    p = tmp_path / "rec.jsonl"
    early = [_rec(str(i), 1.0, pending=True) for i in range(6)]
    p.write_bytes(_lines(*early, *(correction_line(e, {**e, "flags": []}) for e in early)))  # type: ignore[arg-type]
    recs = list(read_records(p))
    assert len(recs) == 6
    # the first three went out as written when the fourth to sixth came; the last three were corrected
    assert [CORRECTION_PENDING in r["flags"] for r in recs] == [True] * 3 + [False] * 3


PLAN = [("code_agent", CODE_PROMPTS[i % 4]) if i % 2 else ("ja_chat", JA_PROMPTS[i % 4]) for i in range(6)]


def _raw(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()] if path.exists() else []


async def test_records_are_written_while_their_model_is_fitted_and_corrected_after(tmp_path: Path) -> None:
    """ngram, six overlapping requests: their drafting model is not stable, so each record is in the file once its
    request has ended (not held for up to --attribution-hold), flagged; at shutdown the models are taken as they
    stand and each gets its correction line; read back, every record once, none pending."""
    path = tmp_path / "records.jsonl"
    async with running_sim(spec_method="ngram", speed=5.0, seed=3) as sim, aiohttp.ClientSession() as s:
        async with running_proxy(sim.url, tmp_path, rec_k=3) as px:
            await _wait_ready(px)
            ids: list[str] = []
            for wave in (PLAN[:3], PLAN[3:]):
                ids += await asyncio.gather(*(_send(s, px.url, chat_body(p, max_tokens=24), w) for w, p in wave))
            for _ in range(4000):  # every request has ended; wait for their records to reach the file
                written = {r.get("request_id") for r in _raw(path)}
                if set(ids) <= written:
                    break
                await asyncio.sleep(0.005)
            status = px.recorder.status()
            early = [r for r in _raw(path) if "request_id" in r]
            assert {r["request_id"] for r in early} == set(ids)
            held = [r for r in early if CORRECTION_PENDING in r["flags"]]
            assert held and status["records"]["held"] == len(held)  # still waiting for the model, yet written
            assert status["engine"]["models_stable"]["drafting"] is False
            assert not any("correction_of" in r for r in _raw(path))
        lines = _raw(path)
    corrections = [r for r in lines if "correction_of" in r]
    assert sorted(c["correction_of"] for c in corrections) == sorted(r["request_id"] for r in held)
    assert len(lines) == len(ids) + len(corrections)  # each record once, its correction after it
    for c in corrections:
        first = next(i for i, r in enumerate(lines) if r.get("request_id") == c["correction_of"])
        assert lines.index(c) > first
    recs = list(read_records(path))
    assert sorted(r["request_id"] for r in recs) == sorted(ids)
    assert not any(CORRECTION_PENDING in r["flags"] for r in recs)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


@pytest.mark.parametrize("workers", ["0", "2"])
async def test_a_proxy_killed_while_records_await_corrections_has_written_them(tmp_path: Path, workers: str) -> None:
    """``specproxy proxy`` (in-process bookkeeping, and relays plus a bookkeeper), its every process SIGKILLed while
    its records wait for their corrections: each request's record is in the file, flagged, readable."""
    path = tmp_path / "records.jsonl"
    async with (
        sim_process("--spec-method", "ngram", "--speed", "5", "--seed", "3") as sim_url,
        proxy_process(sim_url, path, "--k", "3", "--workers", workers) as (url, proc),
        aiohttp.ClientSession() as s,
    ):
        ids: list[str] = []
        for wave in (PLAN[:3], PLAN[3:]):
            ids += await asyncio.gather(*(_send(s, url, chat_body(p, max_tokens=24), w) for w, p in wave))
        for _ in range(4000):
            if {r.get("request_id") for r in _raw(path)} >= set(ids):
                break
            await asyncio.sleep(0.005)
        pids = _tree(proc.pid)  # type: ignore[attr-defined]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        await proc.wait()  # type: ignore[attr-defined]
    recs = list(read_records(path))
    assert sorted(r["request_id"] for r in recs) == sorted(ids)
    assert any(CORRECTION_PENDING in r["flags"] for r in recs)  # no correction came: said so
    assert all(r["outcome"] == "ok" for r in recs)
