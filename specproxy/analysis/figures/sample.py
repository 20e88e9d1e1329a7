"""Bounded samples of per-request values, for the figures that need the values themselves (bootstrap intervals,
paired per-request speedups). Deterministic.

:class:`Reservoir` keeps a uniform sample of at most ``size`` items (Vitter's algorithm R with a fixed seed): every
item while there are no more than ``size``, so small groups keep everything and their intervals are what they were;
:data:`specproxy.analysis.figures.confidence.MAX_SAMPLES` is its size there, as the bootstrap subsamples to that anyway.

:class:`KeySample` keeps values per request key for keys whose hash falls under a threshold that halves whenever the
sample outgrows its capacity. The threshold depends on the key only, so two configurations' samples keep the same
requests, and pairs of a request replayed against both still line up (a sample of pairs, not pairs of samples).
"""

from __future__ import annotations

import random
import zlib
from typing import Generic, TypeVar

T = TypeVar("T")
KEY_CAPACITY = 200_000


class Reservoir(Generic[T]):
    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.seen = 0
        self.items: list[T] = []
        self._rng = random.Random(seed)

    def add(self, item: T) -> None:
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(item)
            return
        j = self._rng.randrange(self.seen)
        if j < self.size:
            self.items[j] = item

    @property
    def sampled(self) -> bool:
        return self.seen > len(self.items)


def key_hash(key: str) -> int:
    return zlib.crc32(key.encode("utf-8", "surrogatepass"))


class KeySample:
    """Values per key for the keys whose 32-bit hash is below ``threshold``."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = KEY_CAPACITY if capacity is None else capacity
        self.threshold = 1 << 32
        self.values: dict[str, list[float]] = {}

    def add(self, key: str, value: float) -> None:
        if self.threshold < (1 << 32) and key_hash(key) >= self.threshold:
            return
        self.values.setdefault(key, []).append(value)
        while len(self.values) > self.capacity:
            self.threshold //= 2
            self.values = {k: v for k, v in self.values.items() if key_hash(k) < self.threshold}

    @property
    def sampled(self) -> bool:
        return self.threshold < (1 << 32)
