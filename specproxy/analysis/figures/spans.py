"""Where drafts land, pooled over records: acceptance per span type and per output-position bucket (the records'
``spans``, docs/records.md), and mean acceptance length pooled (token-weighted) beside its per-request mean.

Per span type or bucket, the figure comes from the records that measured it (basis ``steps``: chunks were steps)
when any did, else from those that only shared their request's figure over their spans (basis ``shared``, which
says nothing about the span itself: each span of a request gets the request's mean). The two are never mixed.
Pooling sums first and divides once, as :mod:`.acceptance` does. The per-request mean weighs each request once: a
long reply weighs as much as a short one, where the pooled figure follows the tokens (the two differ when acceptance
changes with reply length). Pure: records in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specproxy.attribution.spans import POSITION_EDGES
from specproxy.core import figures
from specproxy.core.record import Record, SpanCell
from specproxy.core.spans import SPAN_TYPES


@dataclass(frozen=True, slots=True)
class SpanFigure:
    """One span type or position bucket of a group."""

    requests: int  # records with decode tokens there
    tokens: float  # decode tokens there (every record)
    token_share: float | None  # of the group's decode tokens in records with spans
    basis: str  # "steps" (measured) or "shared"
    steps: float
    accepted: float
    draft_tokens: float | None  # of the records that knew theirs (k known); None when none did
    accepted_known: float  # accepted in those records: acceptance rate = accepted_known / draft_tokens
    left_out: int  # records of the other basis left out of the figure (shared ones, where some measured)

    @property
    def acceptance_rate(self) -> float | None:
        return figures.acceptance_rate(self.accepted_known, self.draft_tokens or 0.0)

    @property
    def mean_acceptance_length(self) -> float | None:
        return figures.mean_acceptance_length(self.accepted, self.steps)  # a span's decode steps are its drafts


@dataclass(frozen=True, slots=True)
class SpanFigures:
    types: Mapping[str, SpanFigure]  # in SPAN_TYPES order
    positions: Mapping[str, SpanFigure]  # by bucket's lower edge, ascending
    mal_pooled: float | None  # 1 + sum accepted / sum drafts over records with drafts
    mal_per_request: float | None  # mean over those records of each one's 1 + accepted / drafts
    mal_requests: int


class _Cell:
    __slots__ = ("accepted", "accepted_known", "draft_known", "draft_tokens", "requests", "steps")

    def __init__(self) -> None:
        self.requests = 0
        self.steps = self.accepted = self.draft_tokens = 0.0
        self.accepted_known = 0.0  # accepted in the cells whose draft tokens are known: the rate's numerator
        self.draft_known = False

    def add(self, c: SpanCell) -> None:
        self.requests += 1
        self.steps += c["steps"]
        self.accepted += c["accepted"]
        if c["draft_tokens"] is not None:
            self.draft_known = True
            self.draft_tokens += c["draft_tokens"]
            self.accepted_known += c["accepted"]


class SpanPool:
    """Fed one record at a time (:meth:`add`), in bounded memory: a few sums per span type and bucket."""

    def __init__(self) -> None:
        # per table ("types", "positions"), per key: tokens, requests, and a cell per basis
        self.tokens: dict[str, dict[str, float]] = {"types": {}, "positions": {}}
        self.cells: dict[str, dict[tuple[str, str], _Cell]] = {"types": {}, "positions": {}}
        self.pooled = [0.0, 0.0]  # accepted, drafts
        self.mal_sum = 0.0
        self.mal_n = 0

    def add(self, rec: Record) -> None:
        spec = rec["spec"]
        if spec is not None and spec["source"] is not None and (drafts := spec["drafts"]):
            accepted = spec["accepted"] or 0.0
            self.pooled[0] += accepted
            self.pooled[1] += drafts
            if (mal := figures.mean_acceptance_length(accepted, drafts)) is not None:
                self.mal_sum += mal
                self.mal_n += 1
        block = rec["spans"]
        if block is None:
            return
        basis = block["basis"]
        for table, cells in (("types", block["types"]), ("positions", block["positions"])):
            tokens, by = self.tokens[table], self.cells[table]
            for key, c in cells.items():
                tokens[key] = tokens.get(key, 0.0) + c["tokens"]
                cell = by.get((key, basis))
                if cell is None:
                    cell = by[(key, basis)] = _Cell()
                cell.add(c)

    def result(self) -> SpanFigures | None:
        if not self.mal_n and not self.tokens["types"]:
            return None
        out: dict[str, dict[str, SpanFigure]] = {}
        for table in ("types", "positions"):
            tokens, by = self.tokens[table], self.cells[table]
            total = sum(tokens.values())
            figs: dict[str, SpanFigure] = {}
            for key in _ordered(table, tokens):
                measured, shared = by.get((key, "steps")), by.get((key, "shared"))
                use, basis, other = (measured, "steps", shared) if measured is not None else (shared, "shared", None)
                if use is None:
                    continue
                figs[key] = SpanFigure(
                    requests=(measured.requests if measured else 0) + (shared.requests if shared else 0),
                    tokens=tokens[key],
                    token_share=tokens[key] / total if total > 0 else None,
                    basis=basis,
                    steps=use.steps,
                    accepted=use.accepted,
                    draft_tokens=use.draft_tokens if use.draft_known else None,
                    accepted_known=use.accepted_known,
                    left_out=other.requests if other is not None else 0,
                )
            out[table] = figs
        accepted, drafts = self.pooled
        return SpanFigures(
            types=out["types"],
            positions=out["positions"],
            mal_pooled=figures.mean_acceptance_length(accepted, drafts),
            mal_per_request=self.mal_sum / self.mal_n if self.mal_n else None,
            mal_requests=self.mal_n,
        )


def _ordered(table: str, tokens: Mapping[str, float]) -> list[str]:
    if table == "types":
        known = [t for t in SPAN_TYPES if t in tokens]
        return known + sorted(set(tokens) - set(known))
    return sorted(tokens, key=lambda k: int(k) if k.isdigit() else 1 << 62)


def position_label(edge: str) -> str:
    """A bucket's lower edge as its range of token indexes: ``"32"`` -> ``"32-127"``, the last open (``"2048+"``)."""
    lo = int(edge) if edge.isdigit() else 0
    higher = [e for e in POSITION_EDGES if e > lo]
    return f"{lo}-{higher[0] - 1}" if higher else f"{lo}+"
