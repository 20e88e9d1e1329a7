"""A sliding window of the latest entries, bounded by age, by count and by bytes, whatever the rate they come at.

A window bounded by time alone holds as many entries as the rate brings in that time, and one bounded by count alone
as many bytes as its entries happen to be (a request's path, model and error come from clients and engines). This
one keeps entries per key (a workload), each with its size as the caller measures it, and lets the oldest go:

- past ``max_age_s`` when read (:meth:`Window.entries`);
- of a key past ``max_per_key`` of its own;
- of the key with the most entries past ``max_entries`` or ``max_bytes`` in all, so a busy key cannot push a quiet
  one out of the window.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Window(Generic[T]):
    def __init__(
        self,
        *,
        max_age_s: float,
        max_per_key: int,
        max_entries: int,
        max_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age_s = max_age_s
        self.max_per_key = max(1, max_per_key)
        self.max_entries = max(1, max_entries)
        self.max_bytes = max_bytes
        self._clock = clock
        self._by_key: dict[Hashable, collections.deque[tuple[float, T, int]]] = {}
        self.entries_kept = 0
        self.bytes_kept = 0

    def add(self, key: Hashable, item: T, size: int) -> None:
        q = self._by_key.get(key)
        if q is None:
            q = self._by_key[key] = collections.deque()
        q.append((self._clock(), item, size))
        self.entries_kept += 1
        self.bytes_kept += size
        if len(q) > self.max_per_key:
            self._pop(key, q)
        while self.entries_kept > 1 and (self.entries_kept > self.max_entries or self.bytes_kept > self.max_bytes):
            fullest = max(self._by_key, key=lambda k: len(self._by_key[k]))
            self._pop(fullest, self._by_key[fullest])

    def _pop(self, key: Hashable, q: collections.deque[tuple[float, T, int]]) -> None:
        _, _, size = q.popleft()
        self.entries_kept -= 1
        self.bytes_kept -= size
        if not q:
            del self._by_key[key]

    def entries(self) -> list[T]:
        """Every key's entries within ``max_age_s``, each key's oldest first; the older ones let go."""
        oldest = self._clock() - self.max_age_s
        out: list[T] = []
        for key, q in list(self._by_key.items()):
            while q and q[0][0] < oldest:
                self._pop(key, q)
            out.extend(item for _, item, _ in q)
        return out
