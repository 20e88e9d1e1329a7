"""The live advice: the k that pays off now per workload, from a sliding window of live records (pure: a clock is
given). As the proxy shows it: tests/test_proxy_live_advice.py."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry, generate_latest

from specproxy.recorder.live_advice import LiveAdvice, LiveAdviceCollector
from tests.analysisutil import profile_records


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_each_workload_gets_the_k_its_acceptance_pays_for() -> None:
    clock = Clock()
    live = LiveAdvice(window_s=600, clock=clock)
    for rec in profile_records([0.9, 0.85, 0.8], 3, workload="code", requests=30):
        live.observe(rec)
    for rec in profile_records([0.25, 0.1, 0.05], 3, workload="chat", requests=30):
        live.observe(rec)
    out = LiveAdvice.compute(live.snapshot())
    assert out["code"]["recommended_k"] == 3 and out["code"]["running_k"] == 3
    assert out["code"]["speedup"] > 1.5 and out["code"]["verdict"] == "faster"
    assert out["chat"]["recommended_k"] < 3  # its later positions cost more than they bring
    assert set(out["code"]["speedups"]) == {"0", "1", "2", "3"}  # never past the k that runs: not measured
    live.update(out)
    st = live.status()
    assert st["refreshes"] == 1 and st["workloads"]["code"]["changes"] == 0 and st["age_s"] == 0


def test_the_window_lets_old_records_go_and_counts_changes() -> None:
    clock = Clock()
    live = LiveAdvice(window_s=60, clock=clock)
    for rec in profile_records([0.9, 0.85, 0.8], 3, workload="w", requests=30):
        live.observe(rec)
    live.update(LiveAdvice.compute(live.snapshot()))
    assert live.current["w"]["recommended_k"] == 3
    clock.t = 120.0  # the good minutes have passed; the traffic turned to replies drafts do not match
    assert live.snapshot() == []
    for rec in profile_records([0.1, 0.05, 0.02], 3, workload="w", requests=30):
        live.observe(rec)
    live.update(LiveAdvice.compute(live.snapshot()))
    assert live.current["w"]["recommended_k"] < 3 and live.changes["w"] == 1
    assert LiveAdvice.compute([]) == {}


def test_records_without_drafts_or_that_failed_are_not_kept() -> None:
    live = LiveAdvice()
    rec = profile_records([0.9], 1, requests=1)[0]
    live.observe({**rec, "outcome": "upstream_error"})  # type: ignore[typeddict-item]
    live.observe({**rec, "spec": None})  # type: ignore[typeddict-item]
    assert live.snapshot() == []
    live.observe(rec)
    (kept,) = live.snapshot()
    assert kept["chunks"] == [] and kept["spec"] == rec["spec"]  # kept light


def test_the_metrics() -> None:
    reg = CollectorRegistry()
    reg.register(LiveAdviceCollector(None))
    assert b"specproxy_recommended_k" in generate_latest(reg)  # families there, empty, with the advice off
    live = LiveAdvice()
    for rec in profile_records([0.9, 0.85, 0.8], 3, workload="code", requests=30):
        live.observe(rec)
    live.update(LiveAdvice.compute(live.snapshot()))
    reg = CollectorRegistry()
    reg.register(LiveAdviceCollector(live))
    text = generate_latest(reg).decode()
    assert 'specproxy_recommended_k{workload="code"} 3.0' in text
    assert 'specproxy_recommended_speedup{k="3",workload="code"}' in text
    assert 'specproxy_recommendation_changes_total{workload="code"} 0.0' in text


def test_a_kept_record_costs_the_same_whatever_its_prompt_and_reply_and_advises_the_same() -> None:
    """The window holds up to MAX_PER_WORKLOAD records a workload for minutes: what it keeps of one must not grow
    with the request body or the response text (each up to --capture-max-bytes), and the advice, its thinking
    warnings included, is the one the whole records give."""
    live = LiveAdvice(max_per_workload=50)
    whole = []
    for i, rec in enumerate(profile_records([0.9, 0.85, 0.8], 3, workload="w", requests=150)):
        thinking = i % 3 == 0
        body = {"messages": [{"role": "user", "content": "x" * 100_000}]}
        if thinking:
            body["chat_template_kwargs"] = {"enable_thinking": True}
        text = ("<think>why</think>" if i % 5 == 0 else "") + "y" * 100_000
        big = {**rec, "request": body, "response_text": text}
        whole.append(big)
        live.observe(big)  # type: ignore[arg-type]
    kept = live.snapshot()
    assert len(kept) == 50  # the newest, at most max_per_workload
    assert max(len(orjson.dumps(r)) for r in kept) < 4_000  # bytes, against 200 KB a whole record
    assert LiveAdvice.compute(kept) == LiveAdvice.compute(whole[-50:])  # type: ignore[arg-type]
    assert any("thinking was on" in w for w in LiveAdvice.compute(kept)["w"]["warnings"])
