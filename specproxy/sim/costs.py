"""The simulator's known truth about cost under load: what a decode step costs at a batch size, what one draft token
costs there, and the speedup speculation gives there. Pure: the same roofline as :func:`engine.step_time_s`
(documented in config.py), read back so tests can compare what the analysis measured with what the simulator did.

A steady decode step at batch ``b`` with ``k`` drafts per sequence verifies ``b * (1 + k)`` positions. It is
memory-bound (weights plus per-sequence reads) until ``compute_s_per_token * b * (1 + k)`` exceeds the memory time:
the knee is at ``b* = weights_s / (compute_s_per_token * (1 + k) - per_seq_s)``, smaller the more tokens a step
verifies. Below the knee a draft token costs ``per_draft_token_s``; beyond it, also ``compute_s_per_token * b``:
the cost of a draft grows with the batch, which is why speculation stops paying under load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specproxy.sim.config import SimConfig
from specproxy.sim.engine import step_time_s


def decode_step_s(cfg: SimConfig, batch: float, k: int) -> float:
    """Wall seconds of one decode step (no prefill in it) at ``batch`` sequences each drafting ``k`` tokens.
    A fractional batch (a mean in-flight count) interpolates linearly between its neighbours."""
    lo = max(1, math.floor(batch))
    frac = max(0.0, batch - lo)

    def at(b: int) -> float:
        return step_time_s(cfg, b, k, 0, b * (1 + k)) / cfg.speed

    return at(lo) * (1 - frac) + at(lo + 1) * frac if frac else at(lo)


def draft_cost(cfg: SimConfig, batch: float, k: int) -> float:
    """Cost of one draft token as a fraction of a step without speculation at the same batch, averaged over ``k``
    drafts: ``(step(b, k) - step(b, 0)) / (k * step(b, 0))``, the quantity ``specproxy advise`` fits."""
    if k < 1:
        raise ValueError("draft cost needs k >= 1")
    base = decode_step_s(cfg, batch, 0)
    return (decode_step_s(cfg, batch, k) - base) / (k * base)


def knee_batch(cfg: SimConfig, k: int) -> float | None:
    """The batch size beyond which a step with ``k`` drafts per sequence is compute-bound (None: never)."""
    per_seq_compute = cfg.compute_s_per_token * (1 + k) - cfg.per_seq_s
    if cfg.compute_s_per_token <= 0 or per_seq_compute <= 0:
        return None
    return (cfg.model_bytes / cfg.bandwidth_bytes_s) / per_seq_compute


def expected_tokens(accept: Sequence[float], k: int) -> float:
    """Tokens a step emits on average with conditional acceptance ``accept`` per position (beyond the list, the
    profile's rule: the last value minus 0.02 per extra position, never below 0.05)."""
    total, reach = 1.0, 1.0
    for i in range(k):
        p = accept[i] if i < len(accept) else max(0.05, accept[-1] - 0.02 * (i - len(accept) + 1))
        reach *= p
        total += reach
    return total


def speedup(cfg: SimConfig, batch: float, k: int, accept: Sequence[float]) -> float:
    """Decode speed with ``k`` drafts over decode speed without, at ``batch``, for a workload accepting ``accept``."""
    return expected_tokens(accept, k) * decode_step_s(cfg, batch, 0) / decode_step_s(cfg, batch, k)


def crossover_batch(cfg: SimConfig, k: int, accept: Sequence[float], max_batch: int = 4096) -> int | None:
    """The smallest whole batch at which ``k`` drafts stop beating no speculation (None: not up to ``max_batch``)."""
    for b in range(1, max_batch + 1):
        if speedup(cfg, b, k, accept) <= 1.0:
            return b
    return None
