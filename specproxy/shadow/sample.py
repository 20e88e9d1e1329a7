"""Which live requests get a shadow, and whether a request decodes greedily.

A share of inference requests, drawn from a seeded generator in the order requests arrive, so the same traffic in the
same order gets the same shadows; optionally only some workloads. Greedy decoding (temperature 0, or top_k 1) makes a
speculative configuration's text the base model's, so only greedy pairs can be checked for being lossless.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Any


class Sampler:
    def __init__(self, share: float, *, seed: int = 0, workloads: Collection[str] = ()) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"a shadow share is between 0 and 1, got {share}")
        self.share = share
        self.workloads = frozenset(workloads)
        self._rng = random.Random(seed)

    def take(self, workload: str) -> bool:
        """Whether this request (the next to arrive) gets a shadow. Every request of a sampled workload draws once,
        whatever the answer, so one workload's traffic does not move another's draws."""
        if self.workloads and workload not in self.workloads:
            return False
        return self._rng.random() < self.share


def is_greedy(body: Any) -> bool:
    """A request whose body asks for greedy decoding: ``temperature`` 0, or ``top_k`` 1. An absent temperature is the
    server's default (vLLM's is 1, or the model's generation config): not known to be greedy."""
    if not isinstance(body, dict):
        return False
    t, top_k = body.get("temperature"), body.get("top_k")
    return (isinstance(t, int | float) and not isinstance(t, bool) and t == 0) or (
        isinstance(top_k, int) and not isinstance(top_k, bool) and top_k == 1
    )
