"""The simulator's cost under load read back (specproxy.sim.costs): the roofline's knee, a draft token's cost below
and beyond it, the expected tokens per step, and the batch at which speculation stops paying."""

from __future__ import annotations

import pytest

from specproxy.sim.config import SimConfig
from specproxy.sim.costs import crossover_batch, decode_step_s, draft_cost, expected_tokens, knee_batch, speedup

# weights 0.005 s a step, 0.1 ms per sequence; 50 us per verified position: at k = 3 the knee is at
# 0.005 / (50e-6 * 4 - 1e-4) = 50 sequences
CFG = SimConfig(model_bytes=4_000_000_000, bandwidth_bytes_s=0.8e12, per_seq_s=1e-4, compute_s_per_token=5e-5)
WEIGHTS_S = 0.005


def test_the_knee_is_where_verifying_outgrows_the_memory_time() -> None:
    assert knee_batch(CFG, 3) == pytest.approx(50.0)
    assert knee_batch(CFG, 7) == pytest.approx(WEIGHTS_S / (5e-5 * 8 - 1e-4))  # more drafts: an earlier knee
    assert knee_batch(SimConfig(), 3) is None  # no compute roof by default
    assert knee_batch(SimConfig(per_seq_s=1e-4, compute_s_per_token=2e-5), 3) is None  # 8e-5 <= per_seq: never


def test_below_the_knee_a_draft_costs_its_proposing_time_and_beyond_it_also_the_compute() -> None:
    k, per_draft = 3, CFG.per_draft_token_s
    b = 20  # below the knee (50)
    plain = WEIGHTS_S + CFG.fixed_overhead_s + CFG.per_seq_s * b
    assert decode_step_s(CFG, b, 0) == pytest.approx(plain)
    assert decode_step_s(CFG, b, k) - decode_step_s(CFG, b, 0) == pytest.approx(per_draft * k)
    assert draft_cost(CFG, b, k) == pytest.approx(per_draft / plain)
    b = 100  # beyond it: the verified positions' compute exceeds the memory time
    over = 5e-5 * b * (1 + k) - (WEIGHTS_S + CFG.per_seq_s * b)
    assert decode_step_s(CFG, b, k) - decode_step_s(CFG, b, 0) == pytest.approx(per_draft * k + over)
    assert draft_cost(CFG, 100, k) > draft_cost(CFG, 20, k)


def test_a_fractional_batch_interpolates_and_speed_divides() -> None:
    assert decode_step_s(CFG, 60.25, 3) == pytest.approx(
        0.75 * decode_step_s(CFG, 60, 3) + 0.25 * decode_step_s(CFG, 61, 3)
    )
    assert decode_step_s(CFG, 0.3, 1) == decode_step_s(CFG, 1, 1)  # below one sequence: one
    fast = SimConfig(speed=10.0, per_seq_s=1e-4, compute_s_per_token=5e-5)
    assert decode_step_s(fast, 60, 3) == pytest.approx(decode_step_s(CFG, 60, 3) / 10)


def test_draft_cost_needs_a_draft() -> None:
    with pytest.raises(ValueError, match="k >= 1"):
        draft_cost(CFG, 4, 0)


def test_expected_tokens_follow_the_conditional_acceptance_and_the_profile_rule_beyond_it() -> None:
    assert expected_tokens([1.0], 4) == pytest.approx(1 + 1.0 + 0.98 + 0.98 * 0.96 + 0.98 * 0.96 * 0.94)
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)
    assert expected_tokens([0.5], 3) == pytest.approx(1 + 0.5 + 0.5 * 0.48 + 0.5 * 0.48 * 0.46)
    assert expected_tokens([0.06], 3) == pytest.approx(1 + 0.06 + 0.06 * 0.05 + 0.06 * 0.05 * 0.05)  # floor 0.05
    assert expected_tokens([0.9], 0) == 1.0


def test_speculation_stops_paying_at_the_crossover_batch() -> None:
    accept = [0.7, 0.6]
    # with CFG a step with drafts ends at most twice as slow as one without (per_seq_s / (4 x compute)): it pays
    assert crossover_batch(CFG, 3, accept) is None
    heavy = SimConfig(per_seq_s=1e-4, compute_s_per_token=1e-4)
    b = crossover_batch(heavy, 3, accept)
    assert b is not None and b > 1
    assert speedup(heavy, b, 3, accept) <= 1.0 < speedup(heavy, b - 1, 3, accept)
    assert speedup(heavy, 1, 3, accept) > speedup(heavy, 50, 3, accept) > speedup(heavy, 200, 3, accept)
    assert crossover_batch(SimConfig(), 3, accept, max_batch=64) is None  # no compute roof: it always pays here
