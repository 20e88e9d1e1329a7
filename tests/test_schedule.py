"""Arrival schedules: rates, shapes of the gap distributions, determinism, replay scaling."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from specproxy.core.schedule import arrival_offsets, iter_arrivals, scaled_offsets

N = 20_000


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


def test_poisson_reaches_its_rate_within_two_percent() -> None:
    offsets = arrival_offsets(N, 40.0, "poisson", seed=7)
    assert offsets[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(offsets))
    achieved = (N - 1) / offsets[-1]
    assert abs(achieved - 40.0) / 40.0 < 0.02


def test_poisson_gaps_are_exponential() -> None:
    g = gaps(arrival_offsets(N, 10.0, "poisson", seed=3))
    mean = statistics.fmean(g)
    # An exponential has cv 1 and P(gap < mean) = 1 - 1/e; a constant or a gamma(4) schedule fails both.
    assert abs(statistics.pstdev(g) / mean - 1.0) < 0.03
    below = sum(1 for x in g if x < mean) / len(g)
    assert abs(below - (1 - math.exp(-1))) < 0.01
    # Kolmogorov-Smirnov distance against the exponential CDF, at 1% significance (1.63 / sqrt(n)).
    xs = sorted(g)
    n = len(xs)
    d = 0.0
    for i, x in enumerate(xs):
        cdf = 1 - math.exp(-10.0 * x)
        d = max(d, (i + 1) / n - cdf, cdf - i / n)
    assert d < 1.63 / math.sqrt(n)


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_keeps_the_mean_and_sets_burstiness(shape: float) -> None:
    g = gaps(arrival_offsets(N, 20.0, "gamma", burstiness=shape, seed=11))
    mean = statistics.fmean(g)
    assert abs(mean - 1 / 20.0) / (1 / 20.0) < 0.03
    cv = statistics.pstdev(g) / mean
    assert abs(cv - 1 / math.sqrt(shape)) / (1 / math.sqrt(shape)) < 0.06  # gamma: cv = 1 / sqrt(shape)


def test_constant_is_exact_without_drift() -> None:
    offsets = arrival_offsets(100_001, 3.0, "constant")
    assert offsets[:4] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert offsets[-1] == pytest.approx(100_000 / 3.0, abs=1e-9)


def test_same_seed_same_schedule_and_different_seed_differs() -> None:
    a = arrival_offsets(50, 5.0, "poisson", seed=1)
    assert a == arrival_offsets(50, 5.0, "poisson", seed=1)
    assert a != arrival_offsets(50, 5.0, "poisson", seed=2)
    assert list(itertools.islice(iter_arrivals(5.0, "poisson", seed=1), 50)) == a


@pytest.mark.parametrize(
    ("rate", "kind", "burst", "message"),
    [(0.0, "poisson", 1.0, "rate"), (1.0, "uniform", 1.0, "poisson, gamma, constant"), (1.0, "gamma", 0, "burst")],
)
def test_bad_parameters_say_why(rate: float, kind: str, burst: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arrival_offsets(3, rate, kind, burst)


def test_scaled_offsets_divide_recorded_gaps() -> None:
    assert scaled_offsets([100.0, 100.5, 102.0], 2.0) == [0.0, 0.25, 1.0]
    assert scaled_offsets([], 1.0) == []
    with pytest.raises(ValueError):
        scaled_offsets([1.0], 0.0)
