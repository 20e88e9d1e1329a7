"""The README's main command end to end: simulator, proxy, load generator and analysis together, checked against what
the simulator's acceptance profiles and cost model make true."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from specproxy.demo import DemoConfig, run_demo


@pytest.mark.slow
async def test_demo_shows_where_speculation_pays(tmp_path: Path) -> None:
    result = await run_demo(DemoConfig(out_dir=tmp_path))  # the size the command runs at
    rows = {(r.workload, r.label): r for r in result.comparison.rows}
    assert {w for w, _ in rows} == {"ja_chat", "code_agent"}  # /v1/models probes are not in the table
    for w in ("ja_chat", "code_agent"):
        assert rows[(w, "Base")].is_baseline and rows[(w, "Base")].acceptance_rate is None
        for label in ("MTP-n1", "MTP-n3", "MTP-n5"):
            assert rows[(w, label)].errors == 0 and rows[(w, label)].requests == DemoConfig().requests
    # published shape: chat gains at k=1 and loses at k=5; code gains a lot at k=3
    ja = {label: rows[("ja_chat", label)].speedup for label in ("MTP-n1", "MTP-n3", "MTP-n5")}
    code = {label: rows[("code_agent", label)].speedup for label in ("MTP-n1", "MTP-n3", "MTP-n5")}
    assert ja["MTP-n1"] > 1.05 and ja["MTP-n1"] > ja["MTP-n3"] > ja["MTP-n5"]
    assert ja["MTP-n5"] < 1.0
    assert code["MTP-n3"] > 1.5 and code["MTP-n3"] > code["MTP-n1"]
    # acceptance falls with k, and code accepts far more than Japanese chat
    for w in ("ja_chat", "code_agent"):
        rates = [rows[(w, label)].acceptance_rate for label in ("MTP-n1", "MTP-n3", "MTP-n5")]
        assert rates[0] > rates[1] > rates[2]
    assert rows[("code_agent", "MTP-n3")].acceptance_rate > rows[("ja_chat", "MTP-n3")].acceptance_rate + 0.25
    advice = {a.workload: a for a in result.advice.workloads}
    assert advice["ja_chat"].recommended_k == 1
    assert advice["code_agent"].recommended_k in (2, 3, 4)  # the profile's optimum is 3, with 2 and 4 within 3%
    assert "ja_chat" in result.text and "recommended k" in result.text
    # sized so that the advice rests on enough requests and draft tokens, and says it is a demonstration
    assert not [w for a in result.advice.workloads for w in a.warnings if "too few" in w]
    assert "too few" not in result.text and "A demonstration on the built-in simulator" in result.text
    kept = sorted(p.name for p in await asyncio.to_thread(lambda: list(tmp_path.iterdir())))
    assert kept == [f"{c}.jsonl" for c in ("Base", "MTP-n1", "MTP-n3", "MTP-n5")]


def test_demo_bad_argument_is_one_line() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "specproxy", "demo", "--requests", "0"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "--requests" in p.stderr and "Traceback" not in p.stderr
