"""How sure a figure is: bootstrap intervals over requests. Pure and deterministic (a fixed seed per call).

A speedup is a ratio of two medians of per-request decode tok/s. Its interval resamples each configuration's requests
independently; when the runs replayed the same requests (``replay_of``), the pairs are resampled together instead,
which removes the prompt-to-prompt spread from the interval. Acceptance pools accepted over draft tokens, so its
interval resamples requests and pools again. Large groups are subsampled to :data:`MAX_SAMPLES` requests first: the
interval is then a little wider than the data would allow, never narrower.

A resample's median is drawn without drawing the resample: n draws with replacement are n uniform indices into the
sorted values, and the k-th smallest of n uniforms on [0, 1) follows Beta(k, n - k + 1), the next one above it the
smallest of the n - k left. So the median's two order statistics are drawn directly, with exactly the distribution
that drawing, sorting and picking would give, in two draws instead of n and a sort.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TypeVar

from specproxy.core.record import Record
from specproxy.core.stats import percentile

T = TypeVar("T")

RESAMPLES = 400
MAX_SAMPLES = 4000
LEVEL = 0.95
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


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


def _resampled_median(xs: list[float], rng: random.Random) -> float:
    """The median (as :func:`~specproxy.core.stats.median` gives it) of ``len(xs)`` draws with replacement from the
    sorted ``xs``, drawn from the order statistics' distribution (module docstring)."""
    n = len(xs)
    k = (n - 1) // 2 + 1  # the lower middle draw, counted from 1
    u = rng.betavariate(k, n - k + 1)
    lo = xs[min(n - 1, math.floor(u * n))]
    if n % 2:
        return lo
    u_next = u + (1.0 - u) * rng.betavariate(1, n - k)  # the smallest of the n - k draws above u
    hi = xs[min(n - 1, math.floor(u_next * n))]
    return lo + (hi - lo) * 0.5


def ratio_of_medians(base: Sequence[float], other: Sequence[float], *, seed: int = 0) -> Interval | None:
    """Interval of median(other) / median(base), the two resampled independently."""
    if len(base) < 2 or len(other) < 2:
        return None
    rng = random.Random(seed)
    b, o = sorted(_subsample(base, rng)), sorted(_subsample(other, rng))
    stats = []
    for _ in range(RESAMPLES):
        mb, mo = _resampled_median(b, rng), _resampled_median(o, rng)
        if mb:
            stats.append(mo / mb)
    return _interval(stats)


def median_of_ratios(ratios: Sequence[float], *, seed: int = 0) -> Interval | None:
    """Interval of the median of paired per-request ratios, the pairs resampled together."""
    if len(ratios) < 2:
        return None
    rng = random.Random(seed)
    r = sorted(_subsample(ratios, rng))
    return _interval([_resampled_median(r, rng) for _ in range(RESAMPLES)])


def pooled_ratio(pairs: Sequence[tuple[float, float]], *, seed: int = 0) -> Interval | None:
    """Interval of sum(numerator) / sum(denominator) over (numerator, denominator) per request (acceptance)."""
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    p = pairs if len(pairs) <= MAX_SAMPLES else rng.sample(list(pairs), MAX_SAMPLES)
    stats = []
    for _ in range(RESAMPLES):
        draw = rng.choices(p, k=len(p))  # a sum needs every draw; summing through itemgetter is all that is saved
        den = sum(map(_SECOND, draw))
        if den > 0:
            stats.append(sum(map(_FIRST, draw)) / den)
    return _interval(stats)


# Two identical configurations measured one after the other on a shared machine differ by up to about this much (a
# sweep's A/A test, on a busy machine). Resampling requests cannot see such a drift of the whole run, so only an
# interval that clears it says faster or slower.
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


def acceptance_interval(records: Sequence[Record]) -> Interval | None:
    """Pooled acceptance (accepted over draft tokens) of the records with a per-request figure, with its interval;
    None when they drafted nothing."""
    pairs = [
        (spec["accepted"] or 0.0, spec["draft_tokens"] or 0.0)
        for r in records
        if (spec := r["spec"]) is not None and spec["source"] is not None
    ]
    return pooled_ratio(pairs) if any(d for _, d in pairs) else None
