"""Quantiles in bounded memory: exact while a figure has few values, a mergeable DDSketch beyond.

:class:`Quantiles` keeps every value (and its weight) until it holds :data:`EXACT_LIMIT` entries; its percentiles are
then exactly :func:`specproxy.core.stats.percentile`'s (linear interpolation between the two nearest order
statistics). Past that it moves everything into a DDSketch (Masson, Rim and Lee, VLDB 2019): buckets of logarithmic
width, ``(gamma^(i-1), gamma^i]`` with ``gamma = (1 + a) / (1 - a)``, each answered by the value
``2 gamma^i / (gamma + 1)``, which is within the relative accuracy ``a`` (:data:`RELATIVE_ERROR`) of every value
in the bucket. A percentile interpolates between the values at the two nearest ranks as the exact method does, so it
is within ``a`` of the exact figure too (for values of at least :data:`MIN_VALUE`; values below it, zero included,
count as zero). Sketches merge by adding counts, so partitions, files and processes combine without loss.

The store is a fixed dense array covering ``MIN_VALUE`` to ``MAX_VALUE`` (a few thousand buckets), so adding a
batch is one ``numpy.bincount``. Weights are integers (an inter-step gap that brought n tokens is n inter-token
samples); negative values, which no latency has, are kept in a mirrored store so nothing is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

RELATIVE_ERROR = 0.005
EXACT_LIMIT = 100_000  # entries kept exactly per figure and group before the sketch takes over
MIN_VALUE = 1e-9
MAX_VALUE = 1e9
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_INV_LOG_GAMMA = 1.0 / math.log(_GAMMA)
_LO = math.ceil(math.log(MIN_VALUE) * _INV_LOG_GAMMA)
_HI = math.ceil(math.log(MAX_VALUE) * _INV_LOG_GAMMA)
_NB = _HI - _LO + 1
_VALUES = 2.0 * np.power(_GAMMA, np.arange(_LO, _HI + 1, dtype=np.float64)) / (_GAMMA + 1.0)

FloatArray = npt.NDArray[np.float64]


def _bins(x: FloatArray, w: FloatArray | None) -> FloatArray:
    idx = np.ceil(np.log(x) * _INV_LOG_GAMMA).astype(np.int64) - _LO
    np.clip(idx, 0, _NB - 1, out=idx)
    return np.bincount(idx, weights=w, minlength=_NB).astype(np.float64)


class DDSketch:
    """Counts per logarithmic bucket (positive and negative values apart) plus a count of (near-)zeros."""

    __slots__ = ("neg", "pos", "zero")

    def __init__(self) -> None:
        self.pos: FloatArray = np.zeros(_NB, dtype=np.float64)
        self.neg: FloatArray | None = None
        self.zero = 0.0

    @property
    def count(self) -> float:
        return float(self.pos.sum()) + self.zero + (float(self.neg.sum()) if self.neg is not None else 0.0)

    def add(self, x: FloatArray, w: FloatArray | None = None) -> None:
        x = np.asarray(x, dtype=np.float64)
        big = x > MIN_VALUE
        if big.all():
            self.pos += _bins(x, w)
            return
        self.pos += _bins(x[big], None if w is None else w[big])
        small = x < -MIN_VALUE
        mid = ~big & ~small
        self.zero += float(mid.sum() if w is None else w[mid].sum())
        if small.any():
            if self.neg is None:
                self.neg = np.zeros(_NB, dtype=np.float64)
            self.neg += _bins(-x[small], None if w is None else w[small])

    def merge(self, other: DDSketch) -> None:
        self.pos += other.pos
        self.zero += other.zero
        if other.neg is not None:
            self.neg = other.neg.copy() if self.neg is None else self.neg + other.neg

    def value_at(self, rank: float) -> float:
        """The value of the 0-based ``rank``-th smallest entry (within the relative accuracy)."""
        if self.neg is not None:
            neg = self.neg[::-1]  # most negative first
            cum = np.cumsum(neg)
            if rank < cum[-1]:
                return -float(_VALUES[::-1][int(np.searchsorted(cum, rank, side="right"))])
            rank -= float(cum[-1])
        if rank < self.zero:
            return 0.0
        rank -= self.zero
        cum = np.cumsum(self.pos)
        i = min(int(np.searchsorted(cum, rank, side="right")), _NB - 1)
        return float(_VALUES[i])

    def cdf(self) -> list[tuple[float, float]]:
        """(bucket value, count of entries up to it) for every non-empty bucket, in order."""
        out: list[tuple[float, float]] = []
        total = 0.0
        if self.neg is not None:
            for i in range(_NB - 1, -1, -1):
                if self.neg[i]:
                    total += float(self.neg[i])
                    out.append((-float(_VALUES[i]), total))
        if self.zero:
            total += self.zero
            out.append((0.0, total))
        for j in np.flatnonzero(self.pos).tolist():
            total += float(self.pos[j])
            out.append((float(_VALUES[j]), total))
        return out


class Quantiles:
    """One figure's values, weighted: exact up to :data:`EXACT_LIMIT` entries, a :class:`DDSketch` beyond."""

    __slots__ = ("_arrays", "_floats", "_n", "limit", "sketch")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = EXACT_LIMIT if limit is None else limit
        self._floats: list[float] = []  # single values of weight 1
        self._arrays: list[tuple[FloatArray, FloatArray | None]] = []
        self._n = 0
        self.sketch: DDSketch | None = None

    @property
    def exact(self) -> bool:
        return self.sketch is None

    def __len__(self) -> int:
        return self._n

    def add(self, x: float) -> None:
        self._floats.append(x)
        self._n += 1
        if len(self._floats) >= 4096 and (self.sketch is not None or self._n > self.limit):
            self._spill()

    def add_many(self, x: FloatArray, w: FloatArray | None = None) -> None:
        if not len(x):
            return
        self._n += len(x)
        if self.sketch is not None:
            self.sketch.add(x, w)
            return
        self._arrays.append((x, w))
        if self._n > self.limit:
            self._spill()

    def merge(self, other: Quantiles) -> None:
        self._n += other._n
        self._floats.extend(other._floats)
        self._arrays.extend(other._arrays)
        if other.sketch is not None:
            if self.sketch is None:
                self.sketch = DDSketch()
            self.sketch.merge(other.sketch)
        if self.sketch is not None or self._n > self.limit:
            self._spill()

    def _spill(self) -> None:
        if self.sketch is None:
            self.sketch = DDSketch()
        if self._floats:
            self.sketch.add(np.array(self._floats, dtype=np.float64))
            self._floats = []
        for x, w in self._arrays:
            self.sketch.add(x, w)
        self._arrays = []

    def _sorted(self) -> tuple[FloatArray, FloatArray | None]:
        parts = [np.array(self._floats, dtype=np.float64)] + [x for x, _ in self._arrays]
        values = np.concatenate(parts)
        if all(w is None for _, w in self._arrays):
            return np.sort(values), None
        weights = np.concatenate(
            [np.ones(len(self._floats))] + [w if w is not None else np.ones(len(x)) for x, w in self._arrays]
        )
        order = np.argsort(values, kind="stable")
        return values[order], np.cumsum(weights[order])

    def percentile(self, q: float) -> float | None:
        """As :func:`specproxy.core.stats.percentile` over the entries (each repeated by its weight)."""
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile must be within 0..100, got {q}")
        if self.sketch is not None:
            self._spill()
            total = self.sketch.count
            if total <= 0:
                return None
            pos = (total - 1) * q / 100.0
            lo = math.floor(pos)
            hi = min(lo + 1, total - 1)
            x_lo, x_hi = self.sketch.value_at(lo), self.sketch.value_at(hi)
            return x_lo + (x_hi - x_lo) * (pos - lo)
        if not self._n:
            return None
        values, cum = self._sorted()
        n = len(values) if cum is None else int(cum[-1])
        pos = (n - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        if cum is None:
            a, b = float(values[lo]), float(values[hi])
        else:
            a = float(values[int(np.searchsorted(cum, lo, side="right"))])
            b = float(values[int(np.searchsorted(cum, hi, side="right"))])
        return a + (b - a) * (pos - lo)

    def cdf_points(self, scale: float = 1.0, max_points: int = 200) -> list[tuple[float, float]]:
        """At most ``max_points`` (value * scale, fraction of weight <= value): what the HTML report draws."""
        if not self._n:
            return []
        if self.sketch is not None:
            self._spill()
            cdf = self.sketch.cdf()
            total = cdf[-1][1]
            step = max(1, len(cdf) // max_points)
            picked = cdf[::step] if cdf[-1] in cdf[::step] else [*cdf[::step], cdf[-1]]
            return [(v * scale, c / total) for v, c in picked[-max_points:]]
        values, cum = self._sorted()
        if cum is None:
            n = len(values)
            idx: Sequence[int] = (
                sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
                if n > max_points
                else range(n)
            )
            return [(float(values[i]) * scale, (i + 1) / n) for i in idx]
        total = float(cum[-1])
        pick = np.unique(np.linspace(0, len(values) - 1, min(max_points, len(values))).round().astype(np.int64))
        return [(float(values[i]) * scale, float(cum[i]) / total) for i in pick]

    def describe(self) -> dict[str, Any]:
        return {"values": self._n, "exact": self.exact}
