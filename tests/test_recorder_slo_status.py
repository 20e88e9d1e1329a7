"""The live SLO figures of /specproxy/status (specproxy.recorder.slo_status): per workload, attainment and goodput
counted one record at a time, the same figures ``report --slo`` computes from the records."""

from __future__ import annotations

import pytest

from specproxy.analysis.figures.slo import goodput, parse_slo
from specproxy.core.record import Record
from specproxy.recorder.slo_status import SloTracker
from tests.analysisutil import T0, make_record


def _rec(rid: str, workload: str, start: float, ttft: float, steps: int = 9, outcome: str = "ok") -> Record:
    return make_record(rid, workload=workload, started_at=T0 + start, ttft_s=ttft, plain_steps=steps, outcome=outcome)


def test_attainment_and_goodput_per_workload() -> None:
    tracker = SloTracker(parse_slo(["ttft=100ms"]))  # type: ignore[arg-type]
    recs = [
        _rec("a", "chat", 0.0, 0.05),  # met, 10 tokens
        _rec("b", "chat", 1.0, 0.5),  # too slow
        _rec("c", "chat", 2.0, 0.05, outcome="error"),  # not ok: not met
        _rec("d", "code", 0.5, 0.05, steps=19),  # met, 20 tokens
    ]
    for r in recs:
        tracker.observe(r)
    st = tracker.status()
    assert st["targets"] == "ttft<=100ms"
    assert list(st["workloads"]) == ["chat", "code"]
    chat = st["workloads"]["chat"]
    end_c = T0 + 2.0 + (recs[2]["e2e_s"] or 0)
    span = end_c - T0
    assert (chat["judged"], chat["met"], chat["attainment"]) == (3, 1, pytest.approx(1 / 3))
    assert chat["goodput_req_s"] == pytest.approx(1 / span)
    assert chat["goodput_tok_s"] == pytest.approx(10 / span)
    code = st["workloads"]["code"]
    assert (code["judged"], code["met"], code["attainment"]) == (1, 1, 1.0)
    assert code["goodput_tok_s"] == pytest.approx(20 / (recs[3]["e2e_s"] or 0))


def test_the_live_figures_are_the_reports() -> None:
    slo = parse_slo(["ttft=100ms", "code:e2e=1s"])
    assert slo is not None
    recs = [_rec(f"r{i}", "chat" if i % 3 else "code", i * 0.3, 0.03 * (i % 5), steps=5 + i) for i in range(30)]
    tracker = SloTracker(slo)
    for r in recs:
        tracker.observe(r)
    for workload, live in tracker.status()["workloads"].items():
        g = goodput([r for r in recs if r["workload"] == workload], slo)
        assert (live["attainment"], live["goodput_req_s"], live["goodput_tok_s"]) == pytest.approx(
            (g.attainment, g.requests_per_s, g.tokens_per_s)
        )


def test_a_workload_without_targets_and_a_non_generation_request_are_not_counted() -> None:
    tracker = SloTracker(parse_slo(["chat:ttft=1s"]))  # type: ignore[arg-type]
    tracker.observe(_rec("a", "other", 0.0, 0.05))
    models = _rec("m", "chat", 0.0, 0.05)
    models["path"], models["completion_tokens"] = "/v1/models", 0
    tracker.observe(models)
    assert tracker.status()["workloads"] == {}


def test_one_record_without_a_span_has_no_goodput() -> None:
    tracker = SloTracker(parse_slo(["ttft=1s"]))  # type: ignore[arg-type]
    r = _rec("a", "chat", 0.0, 0.05)
    r["e2e_s"] = None
    tracker.observe(r)
    chat = tracker.status()["workloads"]["chat"]
    # met (its only target is the TTFT), but with no end-to-end time it spans no time to divide by
    assert chat == {"judged": 1, "met": 1, "attainment": 1.0, "goodput_req_s": None, "goodput_tok_s": None}
