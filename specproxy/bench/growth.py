"""How fast a process's memory grows per request, from samples of (seconds, requests finished, RSS MB).

The soak (:mod:`specproxy.bench.soak`) samples each of the proxy's processes every second. The first fifth of a soak
is warm-up (pools fill, the allocator takes what it keeps); over the last four fifths:

- ``slope_mb_per_1000``: the least-squares slope of RSS against requests finished, MB per thousand requests. It uses
  every sample, so one step of the allocator weighs as what it is, not as an end point.
- ``fifths_mb_per_1000``: the median RSS over the last fifth minus the median over the second fifth, divided by the
  thousands of requests finished between the middles of the two;
- ``half_slope_mb_per_1000``: the slope over the last half only. Memory that fills up to a bound (the allocator's
  pools reaching the high-water mark of the load, a window of records filling) grows on past the first fifth of a
  short soak and then stops: this slope says whether it has stopped. The verdict is on the four fifths' slope.

A process passes when its slope is at most :data:`TARGET_MB_PER_1000`, so small that whatever grows per request has
to be bounded to stay under it over a soak of minutes (what it means per day: docs/bench.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from specproxy.core.stats import median

TARGET_MB_PER_1000 = 0.02

Sample = tuple[float, int, float]  # seconds since the start, requests finished by then, RSS MB


@dataclass(frozen=True, slots=True)
class Growth:
    first_mb: float  # the first sample
    early_mb: float  # the median over the second fifth
    late_mb: float  # the median over the last fifth
    max_mb: float
    growth_mb: float  # late - early
    requests_between: int  # requests finished between the middles of the second fifth and the last
    fifths_mb_per_1000: float | None
    slope_mb_per_1000: float | None  # over the last four fifths
    half_slope_mb_per_1000: float | None  # over the last half: has the growth stopped?
    passed: bool | None  # None: too few samples or requests to say

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """The least-squares slope of ``ys`` against ``xs``; None when the ``xs`` do not vary."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def growth(samples: list[Sample], target: float = TARGET_MB_PER_1000) -> Growth:
    """The growth of one process over a soak (see the module's doc); samples in time order."""
    n = len(samples)
    mbs = [mb for _, _, mb in samples]
    early, late = samples[n // 5 : 2 * n // 5], samples[4 * n // 5 :]
    early_mb = median([mb for _, _, mb in early]) or 0.0
    late_mb = median([mb for _, _, mb in late]) or 0.0
    between = 0
    if early and late:
        between = int(late[len(late) // 2][1] - early[len(early) // 2][1])
    fifths = (late_mb - early_mb) / (between / 1000) if between > 0 else None
    after = samples[n // 5 :]
    fit = slope([r / 1000 for _, r, _ in after], [mb for _, _, mb in after]) if n >= 5 else None
    half = samples[n // 2 :]
    half_fit = slope([r / 1000 for _, r, _ in half], [mb for _, _, mb in half]) if n >= 5 else None
    return Growth(
        first_mb=mbs[0] if mbs else 0.0,
        early_mb=early_mb,
        late_mb=late_mb,
        max_mb=max(mbs, default=0.0),
        growth_mb=late_mb - early_mb,
        requests_between=between,
        fifths_mb_per_1000=fifths,
        slope_mb_per_1000=fit,
        half_slope_mb_per_1000=half_fit,
        passed=None if fit is None else fit <= target,
    )
