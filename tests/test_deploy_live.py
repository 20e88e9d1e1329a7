"""The live table of ``specproxy run`` on a terminal, after a real short run against the simulator; the one-line
progress stays for output that is not a terminal."""

from __future__ import annotations

import io
import re
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console
from simutil import running_sim

from specproxy.loadgen.live_table import LiveTable, build_table, time_left
from specproxy.loadgen.plan import BodyOptions
from specproxy.loadgen.progress import ProgressLine, ProgressSnapshot
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.session import _Live, planned_per_workload, run_load
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import RecorderConfig
from specproxy.sim import SimConfig
from specproxy.workloads import load_workload

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _render(
    snap: ProgressSnapshot,
    elapsed_s: float,
    total: int | None,
    duration_s: float | None = None,
    per_workload: dict[str, int] | None = None,
) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=120).print(
        build_table(snap, elapsed_s, total=total, duration_s=duration_s, per_workload=per_workload)
    )
    return ANSI.sub("", out.getvalue())


def _row(text: str, name: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if re.match(rf"\W*{name}\b", ln))
    return re.split(r"\s{2,}", line.strip())


async def test_run_on_a_terminal_draws_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    snaps: list[ProgressSnapshot] = []
    orig_update = _Live.update

    def spy(self: _Live, snap: ProgressSnapshot) -> None:
        snaps.append(snap)
        orig_update(self, snap)

    monkeypatch.setattr(_Live, "update", spy)
    async with running_sim(SimConfig(port=0, speed=2.0)) as sim:
        spec = LoadSpec(
            target=Target(sim.url),
            workloads=(load_workload("ja_chat"), load_workload("code_agent")),
            body=BodyOptions(model="", max_tokens=64),
            recorder=RecorderConfig(metrics_url=sim.url + "/metrics", run_id=uuid.uuid4().hex[:12], finalize_wait_s=2),
            requests=16,
            concurrency=4,
        )
        outcome = await run_load(spec, out=tmp_path / "run.jsonl", progress=None, handle_signals=False)
    assert outcome.exit_code == 0
    # What the terminal got: the table, redrawn, ending with every request done and none in flight.
    shown = ANSI.sub("", term.getvalue())
    assert "workload" in shown and "in flight" in shown and "acceptance" in shown
    assert "16/16 requests" in shown
    # The counts behind it: requests in flight while running (never over the concurrency), none at the end.
    assert snaps and 1 <= max(sum(c["in_flight"] for c in s.values()) for s in snaps) <= 4
    final = snaps[-1]
    assert sum(c["in_flight"] for c in final.values()) == 0
    assert sum(c["done"] for c in final.values()) == 16 == sum(c["ttft_n"] for c in final.values())
    # The table rendered from the final snapshot, cell by cell; without a seed the plan alternates workloads.
    planned = planned_per_workload(spec)
    assert planned == {"ja_chat": 8, "code_agent": 8}
    text = _render(final, 2.0, 16, per_workload=planned)
    for w in ("ja_chat", "code_agent"):
        name, done, in_flight, toks, ttft, acc, errors, left = _row(text, w)
        c = final[w]
        assert (name, done, in_flight, errors, left) == (w, "8/8", "0", "0", "0s")
        assert c["done"] == 8
        assert int(toks) == round(c["tokens"] / 2.0) and int(toks) > 0
        assert ttft.endswith(" ms") and 0 <= float(ttft.split()[0]) < 2000
        assert c["draft_tokens"] > 0 and acc == f"{c['accepted'] / c['draft_tokens']:.1%}"
    assert _row(text, "all")[1] == "16/16"
    assert "0s left" in text


def test_table_while_running_shows_in_flight_errors_and_time_left() -> None:
    snap: ProgressSnapshot = {
        "ja_chat": dict(
            done=6, ok=5, errors=1, tokens=600, accepted=30, draft_tokens=100, in_flight=2, ttft_sum=0.6, ttft_n=6
        ),
    }
    text = _render(snap, 3.0, 24, per_workload={"ja_chat": 24})
    assert _row(text, "ja_chat") == ["ja_chat", "6/24", "2", "200", "100 ms", "30.0%", "1", "9s"]  # 18 to go, 2/s
    assert "6/24 requests" in text and "9s left" in text
    assert _row(_render(snap, 3.0, None, duration_s=60.0), "ja_chat")[-1] == "57s"
    assert _row(_render(snap, 3.0, None), "ja_chat")[1:2] + _row(_render(snap, 3.0, None), "ja_chat")[-1:] == ["6", "-"]
    assert "all" not in [r.split()[0] for r in text.splitlines() if r.split()]  # one workload: no total row
    assert time_left(snap, 10.0, total=None, duration_s=60.0) == 50.0
    assert time_left({}, 1.0, total=10, duration_s=None) is None


def test_plain_line_when_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(_Live(10, None, True).line, ProgressLine)  # --progress in a CI log: the line
    assert not _Live(10, None, None).enabled  # default: nothing off a terminal
    assert _Live(10, None, False).line is None
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    assert isinstance(_Live(10, None, None).line, LiveTable)


def test_planned_counts_per_workload_count_conversation_turns() -> None:
    spec = LoadSpec(
        target=Target("http://127.0.0.1:9"),
        workloads=(load_workload("ja_chat_multi"), load_workload("code_agent")),
        body=BodyOptions(model="m", max_tokens=8),
        recorder=RecorderConfig(run_id="r"),
        requests=10,
        repeat=2,
    )
    assert planned_per_workload(spec) == {"ja_chat_multi": 5 * 4 * 2, "code_agent": 5 * 2}  # 4 turns a conversation
    assert planned_per_workload(LoadSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "requests": None})) is None
