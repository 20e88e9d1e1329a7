"""Small statistics: percentiles and summaries."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# the chunk-timeline figures, defined in core/figures.py, are importable from here too
from specproxy.core.figures import decode_tok_s as decode_tok_s
from specproxy.core.figures import step_and_token_gaps as step_and_token_gaps
from specproxy.core.figures import token_span as token_span


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
