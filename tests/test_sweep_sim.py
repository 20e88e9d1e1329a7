"""``specproxy sweep`` against the simulator's known truth: one real sweep (two simulators started as commands, one
without speculation and one with k = 2, a compute roof that puts the crossover at a known batch size), read three
ways: the crossover per workload, the draft cost per batch size, and the HTML and JSON pages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from specproxy.analysis.sweep.batchcost import build_batch_advice
from specproxy.analysis.sweep.model import build_sweep
from specproxy.commands.sweep import analyse, render
from specproxy.core.record import read_records
from specproxy.sim import SimConfig, costs

COMPUTE = 0.001  # knee at batch 5 without speculation, near 2 with k = 2: speculation crosses over early
SPEED = 2.0
K = 2
LEVELS = (1, 2, 4, 8)
PROFILE = {"code_agent": "code", "ja_chat": "ja_chat"}  # which simulator profile each built-in workload draws
# Acceptance with margins: with k = 2 the truth's speedup is 1.36, 1.28, 0.89, 0.70 (chat) and 1.71, 1.61, 1.12, 0.89
# (code) at 1, 2, 4, 8 streams, so each crossover is at least 11% clear of 1.00 on both sides.
ACCEPT = {"code": (0.8, 0.75, 0.72), "ja_chat": (0.6, 0.5, 0.45)}
TRUTH = SimConfig(compute_s_per_token=COMPUTE, speed=SPEED)


def _sim(profiles: Path, extra: str) -> str:
    return (
        f"{sys.executable} -m specproxy sim --listen 127.0.0.1:{{port}} --speed {SPEED:g} "
        f"--compute-s-per-token {COMPUTE} --profiles {profiles} {extra}"
    )


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("sweep")
    profiles = d / "profiles.json"
    profiles.write_bytes(orjson.dumps({name: {"accept": list(a)} for name, a in ACCEPT.items()}))
    p = cli(
        "sweep",
        "--baseline",
        "Base=" + _sim(profiles, "--spec-method none"),
        "--candidate",
        f"MTP-n{K}=" + _sim(profiles, f"--spec-method mtp -k {K}"),
        "--concurrency",
        ",".join(map(str, LEVELS)),
        "--requests",
        "4",
        "--requests-per-stream",
        "2",
        "--max-tokens",
        "128",
        "--wait-ready",
        "30",
        "--out",
        "sweep.jsonl",
        cwd=d,
    )
    assert p.returncode == 0, p.stderr
    return d / "sweep.jsonl", p.stdout


def _index(stop: float | None) -> int:
    """A level's place in the sweep; a crossover beyond the last level is one place past it."""
    return LEVELS.index(int(stop)) if stop is not None else len(LEVELS)


def _truth_stop(workload: str) -> int | None:
    """The first sweep level at which the simulator's own speedup is no longer above 1."""
    accept = ACCEPT[PROFILE[workload]]
    return next((lv for lv in LEVELS if costs.speedup(TRUTH, lv, K, accept) <= 1.0), None)


def test_the_simulator_has_a_knee_that_comes_sooner_the_more_a_step_verifies() -> None:
    knees = [costs.knee_batch(TRUTH, k) for k in (0, 1, 2, 3)]
    assert all(k is not None for k in knees)
    assert knees == sorted(knees, reverse=True)  # more tokens verified per step: compute-bound at a smaller batch
    # memory-bound below the knee: a draft costs the same at batch 1 and 2; beyond, it costs more with every stream
    knee_k1 = costs.knee_batch(TRUTH, 1)
    assert knee_k1 is not None and knee_k1 > 2
    assert costs.draft_cost(TRUTH, 1, 1) == pytest.approx(costs.draft_cost(TRUTH, 2, 1), rel=0.05)
    assert costs.draft_cost(TRUTH, 4, K) < costs.draft_cost(TRUTH, 8, K) < costs.draft_cost(TRUTH, 16, K)
    assert costs.knee_batch(SimConfig(), K) is None  # no compute roof by default


def test_sweep_finds_the_simulators_crossover_within_one_level(sweep: tuple[Path, str]) -> None:
    path, stdout = sweep
    result = build_sweep(list(read_records(path)))
    assert result.baseline == "Base" and result.levels == tuple(float(v) for v in LEVELS)
    for workload in PROFILE:
        truth = _truth_stop(workload)
        assert truth is not None and truth > 1  # the truth has a crossover inside the sweep, after its first level
        found = next(c for c in result.crossovers if c.workload == workload)
        assert abs(_index(found.stops_at) - LEVELS.index(truth)) <= 1, (workload, found, truth, stdout)
    # the workload that accepts less stops paying at a lower load, as the truth says
    code, ja = (next(c for c in result.crossovers if c.workload == w) for w in ("code_agent", "ja_chat"))
    assert _truth_stop("ja_chat") == 4 and _truth_stop("code_agent") == 8  # the truth the margins above describe
    assert _index(ja.stops_at) <= _index(code.stops_at)
    assert "beats Base up to" in stdout and "num_speculative_tokens_per_batch_size" in stdout


def test_the_draft_cost_per_batch_size_is_the_simulators_within_10_percent(sweep: tuple[Path, str]) -> None:
    path, _ = sweep
    advice = build_batch_advice(list(read_records(path)))
    fitted = [b for b in advice.buckets if b.draft_cost is not None]
    assert len(fitted) == len(LEVELS) and advice.enough
    for b in fitted:
        truth = costs.draft_cost(TRUTH, b.batch, K)
        assert b.draft_cost == pytest.approx(truth, rel=0.10), (b.lo, b.hi, b.batch, b.draft_cost, truth)
    # and so the k it advises falls as the load rises
    ks = [r.k for r in advice.schedule]
    assert ks == sorted(ks, reverse=True) and ks[0] >= 1 and ks[-1] == 0


def test_the_sweep_page_has_its_plots_and_its_json_the_answer(sweep: tuple[Path, str]) -> None:
    path, _ = sweep
    html = cli("sweep", "--from", str(path), "-f", "html", cwd=path.parent)
    assert html.returncode == 0, html.stderr
    for chart in ("sweep_tok_s_0", "sweep_speedup_0", "sweep_acceptance_0", "draft_cost"):
        assert f'data-chart="{chart}"' in html.stdout
    assert html.stdout.count('class="mark"') > 20 and "beats Base" in html.stdout
    records = list(read_records(path))
    doc = orjson.loads(render(*analyse(records, None, None, 8), "json", "", [str(path)]))
    assert doc["kind"] == "specproxy.sweep" and doc["levels"] == list(map(float, LEVELS))
    cand = [r for r in doc["rows"] if r["label"] != "Base" and r["workload"] != "(all)"]
    assert cand and all(r["speedup_ci"] and r["acceptance_ci"] and r["paired_requests"] > 0 for r in cand)
    assert all(r["speedup_ci"]["lo"] <= r["speedup"] <= r["speedup_ci"]["hi"] for r in cand)
    schedule = doc["batch"]["vllm_num_speculative_tokens_per_batch_size"]
    assert schedule[0][0] == 1 and schedule[-1][1] == 256 and schedule[-1][2] == 0
