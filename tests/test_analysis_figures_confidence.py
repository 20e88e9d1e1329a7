"""Bootstrap intervals: identical configurations are not distinguishable, a real difference is; pairing narrows."""

from __future__ import annotations

import itertools
import random
from collections import Counter

from specproxy.analysis.compare.model import build_comparison
from specproxy.analysis.figures.confidence import (
    Interval,
    _resampled_median,
    median_of_ratios,
    pooled_ratio,
    ratio_of_medians,
    speedup_verdict,
)
from specproxy.core.record import Record
from specproxy.core.stats import median
from tests.analysisutil import T0, make_record


def _noisy(label: str, n: int, step_s: float, seed: int) -> list[Record]:
    rng = random.Random(seed)
    return [
        make_record(
            f"{label}-{i}",
            plain_steps=40,
            step_s=step_s * rng.uniform(0.8, 1.25),  # request-to-request spread
            label=label,
            started_at=T0 + i,
        )
        for i in range(n)
    ]


def test_identical_configurations_are_not_distinguishable_from_one() -> None:
    c = build_comparison([*_noisy("Base", 30, 0.01, 1), *_noisy("Same", 30, 0.01, 2)], baseline="Base")
    (row,) = [r for r in c.rows if r.label == "Same"]
    assert row.speedup_ci is not None and row.speedup_ci.contains(1.0)
    assert row.verdict == "not distinguishable from 1.00x"


def test_a_real_speedup_is_distinguishable() -> None:
    c = build_comparison([*_noisy("Base", 30, 0.01, 1), *_noisy("Fast", 30, 0.007, 2)], baseline="Base")
    (row,) = [r for r in c.rows if r.label == "Fast"]
    assert row.speedup is not None and row.speedup_ci is not None
    assert 1.0 < row.speedup_ci.lo <= row.speedup <= row.speedup_ci.hi
    assert row.verdict == "faster"


def test_pairing_by_request_removes_the_prompt_spread() -> None:
    rng = random.Random(3)
    base, other = [], []
    for i in range(30):  # each request has its own speed; the candidate is 3 % faster on every one of them
        step = 0.01 * rng.uniform(0.5, 2.0)
        base.append(make_record(f"b{i}", plain_steps=40, step_s=step, label="Base", replay_of=f"o{i}"))
        other.append(make_record(f"c{i}", plain_steps=40, step_s=step / 1.03, label="New", replay_of=f"o{i}"))
    c = build_comparison([*base, *other], baseline="Base")
    (row,) = [r for r in c.rows if r.label == "New"]
    assert row.paired is not None and row.paired.pairs == 30
    assert row.speedup_ci is not None and row.speedup_ci.lo > 1.0  # paired: 3 % shows
    unpaired = ratio_of_medians(
        [1 / r["tpot_s"] for r in base if r["tpot_s"]], [1 / r["tpot_s"] for r in other if r["tpot_s"]]
    )
    assert unpaired is not None and unpaired.contains(1.0)  # unpaired, the spread hides it


def test_intervals_are_deterministic_and_need_data() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ratio_of_medians(xs, xs) == ratio_of_medians(xs, xs)
    assert ratio_of_medians([1.0], xs) is None and median_of_ratios([1.1]) is None and pooled_ratio([(1, 2)]) is None
    ci = pooled_ratio([(1.0, 3.0)] * 20 + [(2.0, 3.0)] * 20)
    assert ci is not None and ci.lo <= 0.5 <= ci.hi
    assert speedup_verdict(0.8, Interval(0.7, 0.9)) == "slower" and speedup_verdict(None, None) == "-"
    # an interval that reaches into a run's drift of 1.00 (3 %) says no more than the machine's noise; only one that
    # clears it says faster or slower
    assert speedup_verdict(1.016, Interval(1.005, 1.018)) == "not distinguishable from 1.00x"
    assert speedup_verdict(0.985, Interval(0.975, 0.995)) == "not distinguishable from 1.00x"
    assert speedup_verdict(1.03, Interval(1.01, 1.05)) == "not distinguishable from 1.00x"
    assert speedup_verdict(0.97, Interval(0.95, 0.99)) == "not distinguishable from 1.00x"
    assert speedup_verdict(1.06, Interval(1.031, 1.09)) == "faster"
    assert speedup_verdict(0.94, Interval(0.91, 0.969)) == "slower"


def test_a_resampled_median_has_the_distribution_of_drawing_the_resample() -> None:
    # Every resample of n from n, enumerated: the exact distribution of its median. The shortcut, which draws the
    # median's order statistics instead of n values, must give the same one, for odd and even n and with ties.
    for xs in ([1.0, 2.0, 2.0, 7.0], [0.5, 1.0, 3.0, 4.0, 9.0]):
        n = len(xs)
        exact: Counter[float] = Counter()
        for draw in itertools.product(xs, repeat=n):
            m = median(draw)
            assert m is not None
            exact[m] += 1
        rng = random.Random(7)
        trials = 40_000
        got = Counter(_resampled_median(xs, rng) for _ in range(trials))
        assert set(got) <= set(exact)
        for value, count in exact.items():
            assert abs(got[value] / trials - count / n**n) < 0.012, (xs, value)


def test_intervals_are_reproducible_from_the_seed_and_change_with_it() -> None:
    rng = random.Random(5)
    base = [rng.lognormvariate(3, 0.3) for _ in range(500)]
    other = [rng.lognormvariate(3.05, 0.3) for _ in range(501)]
    assert ratio_of_medians(base, other, seed=3) == ratio_of_medians(base, other, seed=3)
    assert ratio_of_medians(base, other, seed=3) != ratio_of_medians(base, other, seed=4)
    ci = ratio_of_medians(base, other)
    assert ci is not None and ci.lo < 1.05 < ci.hi and ci.hi - ci.lo < 0.15
