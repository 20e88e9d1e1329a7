"""How sure a figure is: bootstrap intervals over requests. Pure and deterministic (a fixed seed per call).

A speedup is a ratio of two medians of per-request decode tok/s. Its interval resamples each configuration's requests
independently; when the runs replayed the same requests (``replay_of``), the pairs are resampled together instead,
which removes the prompt-to-prompt spread from the interval. Acceptance pools accepted over draft tokens, so its
interval resamples requests and pools again. Large groups are subsampled to :data:`MAX_SAMPLES` requests first: the
interval is then a little wider than the data would allow, never narrower.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from specproxy.core.stats import median, percentile

T = TypeVar("T")

RESAMPLES = 400
MAX_SAMPLES = 4000
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    lo: float
    hi: float

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi


def _subsample(xs: Sequence[float], rng: random.Random) -> list[float]:
    return list(xs) if len(xs) <= MAX_SAMPLES else rng.sample(list(xs), MAX_SAMPLES)


def _interval(stats: list[float]) -> Interval | None:
    if len(stats) < RESAMPLES // 2:  # most resamples had no figure: say nothing
        return None
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = percentile(stats, tail), percentile(stats, 100 - tail)
    return Interval(lo, hi) if lo is not None and hi is not None else None


def ratio_of_medians(base: Sequence[float], other: Sequence[float], *, seed: int = 0) -> Interval | None:
    """Interval of median(other) / median(base), the two resampled independently."""
    if len(base) < 2 or len(other) < 2:
        return None
    rng = random.Random(seed)
    b, o = _subsample(base, rng), _subsample(other, rng)
    stats = []
    for _ in range(RESAMPLES):
        mb, mo = median(rng.choices(b, k=len(b))), median(rng.choices(o, k=len(o)))
        if mb and mo is not None:
            stats.append(mo / mb)
    return _interval(stats)


def median_of_ratios(ratios: Sequence[float], *, seed: int = 0) -> Interval | None:
    """Interval of the median of paired per-request ratios, the pairs resampled together."""
    if len(ratios) < 2:
        return None
    rng = random.Random(seed)
    r = _subsample(ratios, rng)
    stats = [m for _ in range(RESAMPLES) if (m := median(rng.choices(r, k=len(r)))) is not None]
    return _interval(stats)


def pooled_ratio(pairs: Sequence[tuple[float, float]], *, seed: int = 0) -> Interval | None:
    """Interval of sum(numerator) / sum(denominator) over (numerator, denominator) per request (acceptance)."""
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    p = pairs if len(pairs) <= MAX_SAMPLES else rng.sample(list(pairs), MAX_SAMPLES)
    stats = []
    for _ in range(RESAMPLES):
        draw = rng.choices(p, k=len(p))
        den = sum(d for _, d in draw)
        if den > 0:
            stats.append(sum(n for n, _ in draw) / den)
    return _interval(stats)


# Two identical configurations measured one after the other on a shared machine differ by up to about this much (a
# sweep's A/A test: every request of one run 1.6 % faster; on a busy 2-core machine, 3 %). Resampling requests cannot
# see such a drift of the whole run, so only an interval that clears it says faster or slower.
RUN_DRIFT = 0.03


def speedup_verdict(speedup: float | None, ci: Interval | None) -> str:
    """``faster`` when the speedup's whole interval lies above 1 + :data:`RUN_DRIFT`, ``slower`` when below
    1 - RUN_DRIFT, else ``not distinguishable from 1.00x``: the data cannot tell it from a run's drift."""
    if speedup is None or ci is None:
        return "-"
    if ci.lo <= 1.0 + RUN_DRIFT and ci.hi >= 1.0 - RUN_DRIFT:
        return "not distinguishable from 1.00x"
    return "faster" if ci.lo > 1.0 + RUN_DRIFT else "slower"


def bootstrap_many(
    groups: Sequence[Sequence[T]], stat: Callable[[list[list[T]]], Sequence[float | None]], *, seed: int = 0
) -> tuple[Interval | None, ...]:
    """Intervals of several figures computed together from groups of items (e.g. each configuration's requests):
    every resample draws each group afresh, with replacement, and ``stat`` gives every figure from one draw, so the
    figures' intervals come from the same resamples. A group is subsampled to :data:`MAX_SAMPLES` first."""
    rng = random.Random(seed)
    pools = [list(g) if len(g) <= MAX_SAMPLES else rng.sample(list(g), MAX_SAMPLES) for g in groups]
    if not pools or any(len(p) < 2 for p in pools):
        return ()
    draws: list[list[float]] = []
    for _ in range(RESAMPLES):
        figures = stat([rng.choices(p, k=len(p)) for p in pools])
        while len(draws) < len(figures):
            draws.append([])
        for i, v in enumerate(figures):
            if v is not None:
                draws[i].append(v)
    return tuple(_interval(d) for d in draws)
