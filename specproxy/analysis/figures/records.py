"""What one record is, for every figure: finished ``ok``, a generation request, its group key's value, its decode rate.

The predicates and per-record values each command filters and measures with, defined once. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specproxy.core.record import Record
from specproxy.core.stats import decode_tok_s

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


def request_tok_s(rec: Record) -> float | None:
    """The record's decode tok/s, or the same figure computed from its chunks (older records)."""
    v = rec["decode_tok_s"]
    return v if v is not None else decode_tok_s(rec["chunks"])


def request_tpot_s(rec: Record) -> float | None:
    v = rec["tpot_s"]
    if v is not None:
        return v
    rate = decode_tok_s(rec["chunks"])
    return 1.0 / rate if rate else None


def values(records: Iterable[Record], get: Callable[[Record], float | None]) -> list[float]:
    return [v for v in map(get, records) if v is not None]
