"""What one record is, for every figure: finished ``ok``, a generation request, its group key's value, its decode rate.

The predicates and per-record values each command filters and measures with, defined once; the formulas they
apply are in :mod:`specproxy.core.figures`. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from specproxy.core import figures
from specproxy.core.record import Record

NONE_KEY = "(none)"


def key_value(rec: Record, field: str) -> str:
    v = rec.get(field)  # one of GROUP_FIELDS, or request_id
    return NONE_KEY if v is None else str(v)


def is_ok(rec: Record) -> bool:
    return rec["outcome"] == "ok"


PER_TOKEN_FLAG = "chunks_not_steps_engine"  # the engine streams one event per token (attribution/choice.py)

# paths that generate, in every dialect the recorder reads (core/dialects)
GENERATION_PATHS = (
    "completions",
    "/api/chat",
    "/api/generate",
    "/v1/messages",
    "/v1/responses",
    "/completion",
    "/generate",
)


def generates(rec: Record) -> bool:
    """A generation request (chat or completions), as opposed to a client's /v1/models or /health call, which a
    proxy records too but which has no tok/s or acceptance."""
    return bool(rec["completion_tokens"]) or rec["path"].endswith(GENERATION_PATHS)


def request_rates(rec: Record, chunks: Callable[[], Sequence[tuple[float, int]]]) -> tuple[float | None, float | None]:
    """The record's (decode tok/s, TPOT): its own figures, else computed from its chunks (older records). ``chunks``
    is called only when a figure is missing, so a streaming reader types a timeline only for such records."""
    tok_s, tpot_s = rec["decode_tok_s"], rec["tpot_s"]
    if tok_s is None or tpot_s is None:
        rate = figures.decode_tok_s(chunks())
        if tok_s is None:
            tok_s = rate
        if tpot_s is None:
            tpot_s = figures.tpot_of_rate(rate)
    return tok_s, tpot_s


def request_tok_s(rec: Record) -> float | None:
    return request_rates(rec, lambda: rec["chunks"])[0]


def values(records: Iterable[Record], get: Callable[[Record], float | None]) -> list[float]:
    return [v for v in map(get, records) if v is not None]


class RunSpan:
    """The wall-clock span of some requests (first start to last end) and their completion tokens, added one record
    at a time: what output tok/s and goodput divide by."""

    __slots__ = ("first_start", "last_end", "spans", "tokens")

    def __init__(self) -> None:
        self.first_start, self.last_end, self.spans = math.inf, -math.inf, 0
        self.tokens = 0.0

    def add(self, rec: Record) -> None:
        s, e = rec["started_at"], rec["e2e_s"]
        if s is not None and e is not None:
            self.spans += 1
            self.first_start = min(self.first_start, s)
            self.last_end = max(self.last_end, s + e)
        self.tokens += rec["completion_tokens"] or 0.0

    def merge(self, other: RunSpan) -> None:
        self.first_start = min(self.first_start, other.first_start)
        self.last_end = max(self.last_end, other.last_end)
        self.spans += other.spans
        self.tokens += other.tokens

    def span_s(self) -> float:
        return self.last_end - self.first_start if self.spans else 0.0

    def output_tok_s(self) -> float | None:
        """Completion tokens over the span; None without a span."""
        return figures.output_tok_s(self.tokens, self.span_s())


def output_tok_s(records: Iterable[Record]) -> float | None:
    """Sum of completion tokens over the wall-clock span from the first start to the last end."""
    run = RunSpan()
    for rec in records:
        run.add(rec)
    return run.output_tok_s()
