"""specproxy.attribution.counts: the one value type the counts add up in."""

from __future__ import annotations

import pytest

from specproxy.attribution.counts import SpecCounts, add_positions


def test_counts_add_field_by_field_and_pad_positions() -> None:
    total = SpecCounts(1, 2, 6, (1.0,)) + SpecCounts(4, 5, 15, (2.0, 3.0))
    assert total == SpecCounts(5, 7, 21, (3.0, 3.0))
    assert SpecCounts() + total == total == total + SpecCounts()


def test_rates_follow_vllm_definitions() -> None:
    c = SpecCounts(accepted=6, drafts=4, draft_tokens=12, per_position=(3.0, 2.0, 1.0))
    assert c.acceptance_rate == pytest.approx(0.5)  # accepted / draft tokens
    assert c.mean_acceptance_length == pytest.approx(2.5)  # 1 + accepted / drafts
    assert c.position_rates == pytest.approx((0.75, 0.5, 0.25))  # accepted at i / drafts


def test_no_drafts_means_no_rates() -> None:
    c = SpecCounts()
    assert c.acceptance_rate is None and c.mean_acceptance_length is None and c.position_rates == ()


def test_add_positions_either_longer() -> None:
    assert add_positions((1.0, 2.0), (0.5,)) == (1.5, 2.0)
    assert add_positions((0.5,), (1.0, 2.0)) == (1.5, 2.0)
    assert add_positions((), ()) == ()
