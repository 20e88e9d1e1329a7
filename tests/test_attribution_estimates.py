"""specproxy.attribution.estimates: a request's figure from the server or from its chunks."""

from __future__ import annotations

import pytest

from specproxy.attribution.counts import SpecCounts
from specproxy.attribution.estimates import (
    SpecEstimate,
    from_chunks,
    from_llama_timings,
    from_server,
    per_position_from_steps,
    tokens_per_step_histogram,
)


def test_chunks_are_steps_prefill_first() -> None:
    # prefill brought 1 token; three decode steps brought 3, 1 and 4 tokens: accepted 2, 0 and 3
    est = from_chunks([1, 3, 1, 4], k=3)
    assert est is not None
    assert est.counts == SpecCounts(accepted=5, drafts=3, draft_tokens=9, per_position=(2.0, 2.0, 1.0))
    assert est.acceptance_rate == pytest.approx(5 / 9)
    assert est.counts.mean_acceptance_length == pytest.approx(1 + 5 / 3)


def test_chunks_without_k_know_drafts_but_not_draft_tokens() -> None:
    est = from_chunks([1, 3, 1, 4], k=None)
    assert est is not None
    assert est.draft_tokens is None and est.acceptance_rate is None
    assert est.counts.drafts == 3 and est.counts.accepted == 5
    assert est.counts.per_position == (2.0, 2.0, 1.0)  # as deep as the deepest step went
    assert est.as_dict()["draft_tokens"] is None


def test_chunks_edge_cases() -> None:
    assert from_chunks([], k=3) is None
    only_prefill = from_chunks([7], k=3)
    assert only_prefill is not None and only_prefill.counts.drafts == 0
    assert only_prefill.counts.mean_acceptance_length is None


def test_per_position_counts_a_position_only_after_the_previous() -> None:
    assert per_position_from_steps([0, 1, 3, 2], k=3) == (3.0, 2.0, 1.0)
    assert per_position_from_steps([5], k=2) == (1.0, 1.0)  # beyond k is not a position


def test_server_detailed_and_summary_forms() -> None:
    detailed = {
        "num_accepted_draft_tokens": 4,
        "num_spec_steps": 3,
        "num_draft_tokens": 9,
        "num_spec_tokens": 3,
        "per_step_accepted": [3, 0, 1],
    }
    est = from_server(detailed)
    assert est is not None
    assert est.counts == SpecCounts(4, 3, 9, (2.0, 1.0, 1.0)) and est.k == 3.0
    summary = {"num_accepted_draft_tokens": 4, "num_spec_steps": 3, "num_draft_tokens": 9,
               "acceptance_histogram": [1, 1, 0, 1]}  # fmt: skip
    est = from_server(summary)
    assert est is not None
    assert est.counts.per_position == (2.0, 1.0, 1.0) and est.k is None
    assert from_server({"num_spec_steps": 3}) is None
    assert from_server({"num_accepted_draft_tokens": "x", "num_spec_steps": 3, "num_draft_tokens": 9}) is None


def test_llama_timings_have_no_step_count() -> None:
    est = from_llama_timings({"draft_n": 10, "draft_n_accepted": 7})
    assert est is not None
    assert est.counts == SpecCounts(accepted=7, drafts=0, draft_tokens=10)
    assert est.acceptance_rate == pytest.approx(0.7) and est.counts.mean_acceptance_length is None
    assert from_llama_timings({"draft_n": 0, "draft_n_accepted": 0}) is None
    assert from_llama_timings({"draft_n": "10"}) is None


def test_as_dict_writes_whole_numbers_as_integers_and_shares_rounded() -> None:
    d = SpecEstimate(SpecCounts(2.0000000000001, 3, 9, (1 / 3,)), k=3.0, exact=False).as_dict()
    assert d["accepted"] == 2 and isinstance(d["accepted"], int)
    assert d["per_position"] == [0.3333] and d["k"] == 3 and d["exact"] is False
    assert d["mean_acceptance_length"] == pytest.approx(1 + 2 / 3)


def test_approximate_keeps_the_figures() -> None:
    est = SpecEstimate(SpecCounts(1, 1, 3))
    assert est.approximate().exact is False and est.approximate().counts == est.counts
    assert est.approximate().approximate() == est.approximate()


def test_tokens_per_step_histogram_skips_prefill_and_empty_chunks() -> None:
    assert tokens_per_step_histogram([5, 3, 1, 0, 4, 1]) == {"3": 1, "1": 2, "4": 1}


def test_server_figures_no_engine_can_produce_are_not_taken() -> None:
    ok = {"num_accepted_draft_tokens": 4, "num_spec_steps": 3, "num_draft_tokens": 9, "num_spec_tokens": 3}
    assert from_server(ok) is not None
    for bad in (
        {"num_accepted_draft_tokens": 10},  # more accepted than drafted
        {"num_accepted_draft_tokens": -1},  # negative
        {"num_spec_steps": float("nan")},  # not finite
        {"num_draft_tokens": float("inf")},
        {"num_draft_tokens": 12},  # more drafted than k per step
        {"num_spec_tokens": 2},  # the same: k 2 over 3 steps drafts at most 6
    ):
        assert from_server({**ok, **bad}) is None, bad
    # older SGLang: draft tokens unknown (None), so no accepted-over-drafted check, only the signs
    assert from_server({"num_accepted_draft_tokens": 4, "num_spec_steps": 3, "num_draft_tokens": None,
                        "engine": "sglang"}) is not None  # fmt: skip
