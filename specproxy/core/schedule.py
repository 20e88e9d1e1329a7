"""Arrival schedules for open-loop load: absolute send offsets (seconds from the start of a run), never gaps to sleep.

A runner sleeps until ``start + offset`` on a monotonic clock, so a late send does not push every later one back, and
its send lag (actual send minus target) can be measured. Pure: the random source is seeded here, nothing reads a
clock.

Kinds (``burstiness`` only matters for ``gamma``):

- ``poisson``: exponential gaps with mean ``1 / rate`` (a Poisson process);
- ``gamma``: gamma-distributed gaps with shape ``burstiness`` and mean ``1 / rate``; shape 1 is Poisson, below 1
  burstier (clumps and lulls), above 1 more regular;
- ``constant``: ``i / rate``.

The first request goes at offset 0.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice

ARRIVALS = ("poisson", "gamma", "constant")


def check_schedule(rate: float, kind: str, burstiness: float) -> None:
    """Raise ValueError with a one-line reason when the parameters make no schedule."""
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrival kind {kind!r}; choose from {', '.join(ARRIVALS)}")
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")


def iter_arrivals(rate: float, kind: str = "poisson", burstiness: float = 1.0, seed: int | None = 0) -> Iterator[float]:
    """Endless absolute offsets for ``rate`` requests per second; the same seed gives the same schedule."""
    check_schedule(rate, kind, burstiness)
    rng = random.Random(seed)
    mean_gap = 1.0 / rate
    t = 0.0
    i = 0
    while True:
        if kind == "constant":
            yield i * mean_gap  # multiplied, not summed: no rounding drift over long runs
            i += 1
            continue
        yield t
        if kind == "poisson":
            t += rng.expovariate(rate)
        else:
            t += rng.gammavariate(burstiness, mean_gap / burstiness)  # mean = shape * scale = 1 / rate


def arrival_offsets(
    n: int, rate: float, kind: str = "poisson", burstiness: float = 1.0, seed: int | None = 0
) -> list[float]:
    """The first ``n`` offsets of :func:`iter_arrivals`."""
    if n < 0:
        raise ValueError(f"n must not be negative, got {n}")
    return list(islice(iter_arrivals(rate, kind, burstiness, seed), n))


def scaled_offsets(times_s: list[float], speed: float) -> list[float]:
    """Offsets from recorded start times (any epoch), their gaps divided by ``speed``; for replays."""
    if not speed > 0:
        raise ValueError(f"speed must be positive, got {speed}")
    if not times_s:
        return []
    t0 = min(times_s)
    return [(t - t0) / speed for t in times_s]
