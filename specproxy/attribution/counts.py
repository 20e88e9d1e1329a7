"""The one value type for speculative-decoding counts: accepted tokens, drafts, draft tokens, accepted per position.

vLLM counts the same four things in its ``/metrics`` counters (``spec_decode_num_accepted_tokens``,
``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens_per_pos``) and in its per-request stats; specproxy's
ledger, scraper, recorder and analysis add them up in many places. They add up here, once.

Definitions as vLLM's (vllm/v1/spec_decode/metrics.py): acceptance rate = accepted / draft tokens; mean acceptance
length = 1 + accepted / drafts; per-position rate = accepted_per_pos[i] / drafts. Counts are floats: counter
attribution shares deltas among requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specproxy.core import figures
from specproxy.core.record import Estimate, SpecBlock


@dataclass(frozen=True, slots=True)
class SpecCounts:
    accepted: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    per_position: tuple[float, ...] = ()  # steps that accepted position i (a position counts only if i-1 did)

    def __add__(self, other: SpecCounts) -> SpecCounts:
        return SpecCounts(
            self.accepted + other.accepted,
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            add_positions(self.per_position, other.per_position),
        )

    @property
    def acceptance_rate(self) -> float | None:
        return figures.acceptance_rate(self.accepted, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        return figures.mean_acceptance_length(self.accepted, self.drafts)

    @property
    def position_rates(self) -> tuple[float, ...]:
        """Accepted at position i per draft: the unconditional per-position acceptance curve."""
        if self.drafts <= 0:
            return ()
        return tuple(a / self.drafts for a in self.per_position)


def counts_of_block(block: SpecBlock | Estimate) -> SpecCounts:
    """The counts a record's ``spec`` block (its chosen figure) or one of its ``estimates`` reports."""
    return SpecCounts(
        block["accepted"] or 0.0, block["drafts"] or 0.0, block["draft_tokens"] or 0.0, tuple(block["per_position"])
    )


def add_positions(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    """Element-wise sum of two per-position lists of different lengths (a missing position counts 0)."""
    if len(a) < len(b):
        a, b = b, a
    return tuple(x + b[i] if i < len(b) else x for i, x in enumerate(a))
