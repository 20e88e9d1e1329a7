"""The soak's growth per request (:mod:`specproxy.bench.growth`): the slope and the fifths say what a process gains
per 1,000 requests after warm-up, and the verdict holds it to the target."""

from __future__ import annotations

import pytest

from specproxy.bench.growth import TARGET_MB_PER_1000, growth, slope


def _soak(mb_at: list[float], per_s: int = 100) -> list[tuple[float, int, float]]:
    return [(float(t), t * per_s, mb) for t, mb in enumerate(mb_at)]


def test_a_steady_leak_is_its_rate_per_1000_requests() -> None:
    # 100 requests a second, 0.05 MB a second after a warm-up jump: 0.5 MB per 1,000 requests
    mbs = [50.0 + 10 * min(t, 20) / 20 + (0.05 * (t - 20) if t > 20 else 0) for t in range(200)]
    g = growth(_soak(mbs))
    assert g.slope_mb_per_1000 == pytest.approx(0.5, rel=0.05)
    assert g.fifths_mb_per_1000 == pytest.approx(0.5, rel=0.05)
    assert g.passed is False


def test_warm_up_does_not_count_and_flat_passes() -> None:
    # all the growth in the first fifth, then flat with a page of noise
    mbs = [40.0 + 30 * t / 40 if t < 40 else 70.0 + (0.004 if t % 2 else 0.0) for t in range(200)]
    g = growth(_soak(mbs))
    assert g.slope_mb_per_1000 is not None and abs(g.slope_mb_per_1000) < TARGET_MB_PER_1000
    assert g.growth_mb == pytest.approx(0.0, abs=0.01)
    assert g.first_mb == 40.0 and g.max_mb == pytest.approx(70.004)
    assert g.passed is True


def test_growth_that_stops_shows_in_the_last_half() -> None:
    # growing at 0.5 MB per 1,000 requests until the middle, flat after: a bound reached late
    mbs = [50.0 + 0.05 * min(t, 100) for t in range(200)]
    g = growth(_soak(mbs))
    assert g.slope_mb_per_1000 is not None and g.slope_mb_per_1000 > TARGET_MB_PER_1000
    assert g.half_slope_mb_per_1000 is not None and abs(g.half_slope_mb_per_1000) < 1e-9


def test_too_few_samples_or_no_requests_say_nothing() -> None:
    assert growth(_soak([10.0, 11.0, 12.0])).passed is None
    assert growth(_soak([10.0] * 10, per_s=0)).passed is None  # no requests finished: no rate
    assert growth([]).slope_mb_per_1000 is None
    assert slope([1.0, 1.0], [2.0, 3.0]) is None
