"""Each figure specproxy reports, defined once: its name, unit and meaning, and the function that computes it.

The recorder computes a request's figures as its response streams (``core/timeline.py``); the analysis computes
them again for records that lack them, and pools acceptance over many records; both call the functions here.
``docs/records.md`` and ``docs/report-json.md`` say the same meanings (``tests/test_core_figures.py`` checks them).

Under speculative decoding one streamed chunk is one engine step carrying 1 + accepted tokens, so the gap between two
chunks is an inter-*step* latency. The inter-*token* latency spreads each gap over the tokens it delivered: a gap of g
seconds that brought n tokens contributes n samples of g / n. Reporting one value per chunk as "ITL" overstates it
(sglang #12064); both distributions are kept.

Pure: numbers in, numbers out; None where a figure is undefined. A chunk timeline is ``[(offset_s, tokens), ...]``
of one stream, in arrival order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Chunks = Sequence[tuple[float, int]]


def ttft_s(start_ns: int, first_token_ns: int | None) -> float | None:
    """Seconds from the request's start to its first token-bearing event; None when no token came."""
    return (first_token_ns - start_ns) / 1e9 if first_token_ns is not None else None


def step_gaps(chunks: Chunks) -> list[tuple[float, int]]:
    """Each gap between token-bearing chunks, with the tokens the later chunk brought (so the gap per token is
    ``gap / n``, ``n`` times). The first token-bearing chunk is the prefill token and opens the first gap."""
    steps = [(t, n) for t, n in chunks if n > 0]
    return [(max(0.0, t1 - t0), n1) for (t0, _), (t1, n1) in itertools.pairwise(steps)]


def token_gaps(gaps: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """Step gaps spread over their tokens: ``(gap / n, n)``, one inter-token latency that ``n`` tokens share."""
    return [(gap / n, n) for gap, n in gaps]


def step_s(chunks: Chunks) -> list[float]:
    """Inter-step latencies: the gaps between token-bearing chunks."""
    return [gap for gap, _ in step_gaps(chunks)]


def itl_s(chunks: Chunks) -> list[float]:
    """Inter-token latencies: each step gap's ``gap / n``, ``n`` times."""
    return [v for v, n in token_gaps(step_gaps(chunks)) for _ in range(n)]


def step_and_token_gaps(chunks: Chunks) -> tuple[list[float], list[float]]:
    """(inter-step latencies, inter-token latencies) of one stream."""
    return step_s(chunks), itl_s(chunks)


def token_span(chunks: Chunks) -> float:
    """Seconds from the first token-bearing chunk to the last (0 when fewer than two): the decode span."""
    times = [t for t, n in chunks if n > 0]
    return times[-1] - times[0] if len(times) > 1 else 0.0


def decode_tok_s(chunks: Chunks) -> float | None:
    """(tokens - 1) / decode span, from the chunks: the decode rate the published tables use. The first token is
    the prefill's; it is left out together with the time before it. None when the span is zero."""
    span = token_span(chunks)
    if span <= 0:
        return None
    return (sum(n for _, n in chunks if n > 0) - 1) / span


def tpot_s(span_s: float | None, completion_tokens: int | None) -> float | None:
    """Decode span over the tokens after the first; None with fewer than two tokens or no span."""
    if span_s is None or not completion_tokens or completion_tokens <= 1 or span_s <= 0:
        return None
    return span_s / (completion_tokens - 1)


def tpot_of_rate(decode_rate: float | None) -> float | None:
    """TPOT from a decode rate alone (records written without ``tpot_s``): its reciprocal."""
    return 1.0 / decode_rate if decode_rate else None


def output_tok_s(tokens: float, span_s: float) -> float | None:
    """Completion tokens over a wall-clock span; None without a span."""
    return tokens / span_s if span_s > 0 else None


def acceptance_rate(accepted: float, draft_tokens: float) -> float | None:
    """Accepted draft tokens over proposed draft tokens (vLLM's definition); None without draft tokens."""
    return accepted / draft_tokens if draft_tokens > 0 else None


def mean_acceptance_length(accepted: float, drafts: float) -> float | None:
    """Tokens per speculative step: 1 + accepted / drafts (vLLM's definition); None without drafts."""
    return 1.0 + accepted / drafts if drafts > 0 else None


@dataclass(frozen=True, slots=True)
class Figure:
    name: str  # as records, JSON and tables name it; a report's percentiles add ``_p50``, ``_p99`` ...
    title: str  # in words
    unit: str
    meaning: str  # how it is computed, as the docs say it
    compute: Callable[..., object]


FIGURES: tuple[Figure, ...] = (
    Figure(
        "decode_tok_s",
        "decode rate",
        "tok/s",
        "(completion tokens - 1) / (last token time - first token time)",
        decode_tok_s,
    ),
    Figure(
        "output_tok_s",
        "output throughput",
        "tok/s",
        "sum of completion tokens / (last request end - first request start), wall clock",
        output_tok_s,
    ),
    Figure("ttft_s", "time to first token", "s", "first token-bearing event minus request start", ttft_s),
    Figure(
        "itl_s",
        "inter-token latency",
        "s",
        "each gap between chunks spread over the tokens it brought (n samples of gap / n)",
        itl_s,
    ),
    Figure(
        "step_s",
        "inter-step latency",
        "s",
        "the gap between token-bearing chunks (one engine step when chunks are steps)",
        step_s,
    ),
    Figure(
        "tpot_s",
        "time per output token",
        "s",
        "(last token time - first token time) / (completion tokens - 1)",
        tpot_s,
    ),
    Figure("acceptance_rate", "acceptance rate", "fraction", "accepted / draft tokens", acceptance_rate),
    Figure(
        "mean_acceptance_length",
        "mean acceptance length",
        "tokens per step",
        "1 + accepted / drafts",
        mean_acceptance_length,
    ),
)
