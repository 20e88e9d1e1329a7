"""Small statistics: percentiles, summaries, and per-step versus per-token latency from a chunk timeline.

Under speculative decoding one streamed chunk is one engine step carrying 1 + accepted tokens, so the gap between two
chunks is an inter-*step* latency. The inter-*token* latency spreads each gap over the tokens it delivered: a gap of g
seconds that brought n tokens contributes n samples of g / n. Reporting one value per chunk as "ITL" overstates it
(sglang #12064); both distributions are kept.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); ``q`` in [0, 100]. None for no values."""
    if not values:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50.0)


@dataclass(frozen=True, slots=True)
class Summary:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "count": self.count,
            "mean": self.mean,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "min": self.min,
            "max": self.max,
        }


def summarize(values: Iterable[float]) -> Summary:
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return Summary(0, None, None, None, None, None, None)
    return Summary(
        count=len(xs),
        mean=sum(xs) / len(xs),
        p50=percentile(xs, 50),
        p90=percentile(xs, 90),
        p99=percentile(xs, 99),
        min=xs[0],
        max=xs[-1],
    )


def step_gaps(chunks: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """From ``[(offset_s, tokens), ...]`` of one stream: each gap between token-bearing chunks, with the tokens the
    later chunk brought (so the gap per token is ``gap / n``, ``n`` times)."""
    steps = [(t, n) for t, n in chunks if n > 0]
    return [(max(0.0, t1 - t0), n1) for (t0, _), (t1, n1) in itertools.pairwise(steps)]


def step_and_token_gaps(chunks: Sequence[tuple[float, int]]) -> tuple[list[float], list[float]]:
    """From ``[(offset_s, tokens), ...]`` of one stream: (inter-step gaps, inter-token gaps).

    Only chunks that carried tokens are steps; the first of them is the prefill token and opens the first gap.
    """
    gaps = step_gaps(chunks)
    token_gaps: list[float] = []
    for gap, n in gaps:
        token_gaps.extend([gap / n] * n)
    return [gap for gap, _ in gaps], token_gaps


def token_span(chunks: Sequence[tuple[float, int]]) -> float:
    """Seconds from the first token-bearing chunk to the last (0 when fewer than two): the decode span."""
    times = [t for t, n in chunks if n > 0]
    return times[-1] - times[0] if len(times) > 1 else 0.0


def decode_tok_s(chunks: Sequence[tuple[float, int]]) -> float | None:
    """(completion tokens - 1) / (last token time - first token time): the decode rate the published tables use.

    The first token is the prefill's; it is excluded together with the time before it.
    """
    span = token_span(chunks)
    if span <= 0:
        return None
    return (sum(n for _, n in chunks if n > 0) - 1) / span
