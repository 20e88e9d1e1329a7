"""`specproxy advise`: expected tokens per step, the cost model (given, fitted, default), the recommended k for known
acceptance profiles, and the warnings."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from specproxy.analysis.advise.gather import AdviseInput, build_advice
from specproxy.analysis.advise.measured import measured_rows, with_measurements
from specproxy.analysis.advise.model import WARN_BROKEN_HEAD, CostModel, cost_model, fit_cost, predict, recommend
from specproxy.analysis.advise.render import advise_json, advise_tables
from specproxy.analysis.figures.acceptance import conditional_rates, expected_tokens_per_step
from specproxy.analysis.inputs.scan import ChunkBatch, item_of
from specproxy.analysis.tables import render_text
from specproxy.commands.analysis import register
from specproxy.core.record import Record
from tests.analysisutil import accepted_from_profile, baseline_records, make_record, profile_records, write_run

CHAT = (0.4, 0.33, 0.3, 0.28, 0.26)  # the simulator's ja_chat profile
CODE = (0.8, 0.75, 0.72, 0.7, 0.68)  # the simulator's code profile


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_expected_tokens_per_step() -> None:
    assert expected_tokens_per_step([0.5], 0) == 1.0
    assert expected_tokens_per_step([0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)  # extrapolated with 0.5
    assert expected_tokens_per_step([0.8, 0.75, 0.72], 3) == pytest.approx(1 + 0.8 + 0.6 + 0.432)
    assert expected_tokens_per_step([], 5) == 1.0


def test_factory_profile_is_exact() -> None:
    acc = accepted_from_profile([0.8, 0.75, 0.72], 3, 1000)
    assert sum(1 for a in acc if a >= 1) == 800
    assert sum(1 for a in acc if a >= 2) == 600
    assert sum(1 for a in acc if a >= 3) == 432


def test_conditional_rates_pool_each_position_over_runs_that_drafted_that_deep() -> None:
    k3 = profile_records([0.8, 0.75, 0.72], 3, requests=5, steps_per_request=200)
    # A k=1 run with a different first-position rate must move p0 but not dilute p1 and p2.
    k1 = profile_records([0.6], 1, requests=5, steps_per_request=200, label="MTP-n1")
    assert conditional_rates(k3) == pytest.approx((0.8, 0.75, 0.72))
    p = conditional_rates(k3 + k1)
    assert p[0] == pytest.approx(0.7)
    assert p[1:] == pytest.approx((0.75, 0.72))


@pytest.mark.parametrize(
    ("profile", "cost", "best"),
    [
        ((0.4, 0.33, 0.3), 0.15, 1),  # chat-like: only the first draft pays
        ((0.4, 0.33, 0.3), 0.2, 1),
        ((0.8, 0.75, 0.72, 0.7, 0.68), 0.2, 3),  # code-like: the simulator's own numbers say k=3
        ((0.05, 0.05), 0.2, 0),  # nothing beats not speculating
    ],
)
def test_recommended_k_for_known_profiles(profile: tuple[float, ...], cost: float, best: int) -> None:
    preds = predict(profile, CostModel(cost, 0.01, "given", ()), 8)
    assert recommend(preds) == best
    assert preds[0].speedup == 1.0
    assert preds[1].speedup == pytest.approx((1 + profile[0]) / (1 + cost))
    assert preds[1].tok_s == pytest.approx((1 + profile[0]) / (0.01 * (1 + cost)))
    assert [p.extrapolated for p in preds] == [k > len(profile) for k in range(9)]


def test_code_profile_recommends_at_least_three_at_cost_015() -> None:
    preds = predict((0.8, 0.75, 0.72), CostModel(0.15, None, "given", ()), 8)
    assert recommend(preds) >= 3
    assert preds[3].tok_s is None  # no base step known: speedups only


def test_cost_fit_from_runs_at_several_k() -> None:
    assert fit_cost([(0, 0.01), (1, 0.012), (3, 0.016)]) == pytest.approx((0.01, 0.2))
    assert fit_cost([(3, 0.016)]) is None
    m = cost_model([(3, 0.016)])
    assert (m.source, m.draft_cost) == ("default", 0.15)
    assert m.base_step_s == pytest.approx(0.016 / 1.45)
    m = cost_model([(0, 0.01), (3, 0.016)], draft_cost=0.3)
    assert (m.source, m.draft_cost, m.base_step_s) == ("given", 0.3, 0.01)


def test_advice_from_simulated_runs_with_a_baseline_run() -> None:
    # Step times follow the simulator's model: 10 ms base step, each draft token costs 20% of it.
    runs = profile_records(CHAT, 3, workload="ja_chat", steps_per_request=80) + profile_records(
        CODE, 3, workload="code", steps_per_request=80
    )
    base = baseline_records(step_s=0.01)
    advice = build_advice(runs, base)
    assert advice.cost.source == "fitted"
    assert advice.cost.draft_cost == pytest.approx(0.2)
    assert advice.cost.base_step_s == pytest.approx(0.01)
    by = {w.workload: w for w in advice.workloads}
    assert by["ja_chat"].recommended_k == 1
    assert by["code"].recommended_k == 3
    assert by["code"].measured_k == 3
    assert by["code"].conditional == pytest.approx(CODE[:3], abs=0.005)
    assert any("repeat the last conditional rate" in n for n in by["code"].notes)
    assert by["code"].warnings == ()  # 25 requests, 6000 draft tokens, chunks are steps


def test_warnings() -> None:
    broken = [make_record(f"z{i}", accepted=[0] * 50, k=3) for i in range(25)]
    w = build_advice(broken).workloads[0]
    assert any(WARN_BROKEN_HEAD in x for x in w.warnings)
    assert w.recommended_k == 0

    thinking = [
        make_record("t1", accepted=[1] * 5, k=1, request={"chat_template_kwargs": {"enable_thinking": True}}),
        make_record("t2", accepted=[1] * 5, k=1, response_text="<think>hmm, let me see</think>Hello"),
        make_record("t3", accepted=[1] * 5, k=1, response_text="<think>\n\n</think>\n\nHello"),
        make_record("t4", accepted=[1] * 5, k=1, chunks_are_steps=False, flags=["multi_event_reads"]),
        make_record("t5", accepted=[1] * 5, k=1, source="counters", flags=["partial_drafting", "counters_unsettled"]),
    ]
    text = " | ".join(build_advice(thinking[:4]).workloads[0].warnings)
    assert "counters_unsettled" not in text
    text = " | ".join(build_advice(thinking).workloads[0].warnings)
    assert "1 of 5 requests' acceptance is the counters' share" in text and "counters_unsettled" in text
    assert "thinking was on in 1 requests" in text
    assert "1 responses contain <think> reasoning" in text
    assert "1 of 5 streamed requests have chunks that don't map to engine steps" in text
    assert "only 5 requests and 25 draft tokens: too few" in text

    plain = build_advice(baseline_records(requests=3)).workloads[0]
    assert plain.recommended_k is None and plain.predictions == ()
    assert plain.warnings[0].startswith("no speculative decoding")


def run_files(tmp_path: Path) -> tuple[Path, Path]:
    spec: list[Record] = profile_records(CODE, 3, workload="code", steps_per_request=80)
    return write_run(tmp_path / "n3.jsonl", spec), write_run(tmp_path / "base.jsonl", baseline_records())


def test_advise_cli(tmp_path: Path) -> None:
    spec, base = run_files(tmp_path)
    code, out, err = invoke("advise", str(spec), "--baseline-run", str(base))
    assert code == 0, err
    assert out.startswith("cost model: one draft token costs 0.200 of a base step (fitted")
    assert "code: recommended k = 3" in out
    assert "* 3" in out and "4 (extrapolated)" in out

    code, out, _ = invoke("advise", str(spec), "--draft-cost", "0.4", "--max-k", "4", "-f", "json")
    assert code == 0
    doc = orjson.loads(out)
    assert doc["kind"] == "specproxy.advise" and doc["cost_model"]["source"] == "given"
    wl = doc["workloads"][0]
    assert [p["k"] for p in wl["predictions"]] == [0, 1, 2, 3, 4]
    assert wl["recommended_k"] == 2  # 2.4 / 1.8 beats 1.8 / 1.4 and 2.832 / 2.2

    code, md, _ = invoke("advise", str(spec), "-f", "md", "--base-step-ms", "10")
    assert code == 0 and "| k | tokens/step | step cost | speedup | 95% CI | verdict | tok/s |" in md


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--draft-cost", "-1"], "--draft-cost must be between 0 and 10"),
        (["--max-k", "0"], "--max-k must be between 1 and 64"),
        (["--base-step-ms", "0"], "--base-step-ms must be positive"),
        (["--workload", "poetry"], "workload poetry not in the runs; workloads: code"),
        (["--baseline-run", "/nonexistent/base.jsonl"], "no such record file"),
        (["-f", "csv"], "--format must be one of table, md, json"),
    ],
)
def test_advise_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    spec, _ = run_files(tmp_path)
    code, out, err = invoke("advise", str(spec), *args)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_step_times_come_from_the_engine_figures_when_chunks_merge() -> None:
    """On a busy host two steps' events arrive in one read: the chunk gaps alternate 0 and two steps, and their
    median says nothing of the step. The step time from decode tok/s and the drafts accepted does not move."""
    runs = profile_records(CODE, 3, workload="code", steps_per_request=60)
    base = baseline_records(step_s=0.01, steps=60)
    for rec in [*runs, *base]:
        chunks = rec["chunks"]
        rec["chunks"] = [(chunks[i - 1][0] if i % 2 == 0 and i > 1 else t, n) for i, (t, n) in enumerate(chunks)]
    gather, batch = AdviseInput(), ChunkBatch()
    for rec in base:
        gather.add(item_of(rec), batch, baseline=True)
    batch.flush()
    assert gather.points() == [(0, pytest.approx(0.01))]
    advice = build_advice(runs, base)
    assert advice.cost.source == "fitted"
    assert advice.cost.base_step_s == pytest.approx(0.01)
    assert advice.cost.draft_cost == pytest.approx(0.2)


def test_the_advice_defers_to_a_measured_k_it_contradicts() -> None:
    """A run at k = 3 measured no faster than the baseline; a prediction on a wrong draft cost says 2x. The
    measurement stands: the row says the prediction is off, and nothing measured faster gets recommended."""
    runs = profile_records(CODE, 3, workload="code", steps_per_request=60, step_s=0.0283)  # 2.83 tokens a step
    base = baseline_records(step_s=0.01, steps=60, workload="code")
    advice = build_advice(runs, base, draft_cost=0.05)
    (w,) = advice.workloads
    assert w.recommended_k is not None and w.recommended_k >= 3  # what the model alone says
    rows = measured_rows(runs, base)
    held = with_measurements(advice, rows)
    (w,) = held.workloads
    m = w.measured_at(3)
    assert m is not None and not m.agrees and m.verdict != "faster"
    assert w.recommended_k == 0 and w.recommended_from == "measurement"
    assert any("k = 3: predicted" in n and "the measurement stands" in n for n in w.notes)
    text = render_text(advise_tables(held))
    assert "(prediction off)" in text and "recommended k = 0 (don't speculate), from the measured runs" in text
    doc = advise_json(held)
    (pred3,) = [p for p in doc["workloads"][0]["predictions"] if p["k"] == 3]
    assert pred3["measured"]["agrees"] is False and doc["workloads"][0]["recommended_from"] == "measurement"


def test_a_prediction_the_measurement_bears_out_keeps_the_model() -> None:
    runs = profile_records(CODE, 3, workload="code", steps_per_request=60)
    base = baseline_records(step_s=0.01, steps=60, workload="code")
    held = with_measurements(build_advice(runs, base), measured_rows(runs, base))
    (w,) = held.workloads
    m = w.measured_at(3)
    assert m is not None and m.agrees and m.verdict == "faster"
    assert w.recommended_from == "prediction" and w.recommended_k == 3


def test_a_prediction_equal_to_its_measurement_agrees_to_the_last_bit() -> None:
    from specproxy.analysis.advise.measured import _overlap
    from specproxy.analysis.figures.confidence import Interval

    x = 0.1 + 0.2  # 0.30000000000000004: the same figure reached another way
    assert _overlap(0.3, None, Interval(x, x)) and _overlap(x, None, Interval(0.3, 0.3))
    assert not _overlap(0.3, None, Interval(0.31, 0.32))
