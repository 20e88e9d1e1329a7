"""What a report is: per group, its counts, its scalar figures (each the median over repeats with the min-max spread),
and its pooled acceptance. The shape every rendering reads (:mod:`.render`, the HTML page, ``run``'s summary). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specproxy.analysis.figures.acceptance import Acceptance
from specproxy.analysis.figures.slo import FigureSpec
from specproxy.analysis.figures.spans import SpanFigures
from specproxy.core.stats import median

# Scalar figures by default, in the order tables show them (``--percentiles`` and ``--slo`` change the set: see
# :class:`specproxy.analysis.figures.slo.FigureSpec`). Units are in the names: `_s` seconds, `_tok_s` tokens per second.
DEFAULT_SPEC = FigureSpec()

FIGURES = DEFAULT_SPEC.names


@dataclass(frozen=True, slots=True)
class Figure:
    """One scalar: the value (median over repeats when repeated), its min-max over repeats, and how many repeats
    gave a value (1 without repeats, where min == max == value)."""

    value: float | None
    min: float | None
    max: float | None
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {"value": self.value, "min": self.min, "max": self.max, "n": self.n}


@dataclass(frozen=True, slots=True)
class GroupReport:
    key: tuple[tuple[str, str], ...]
    requests: int
    outcomes: Mapping[str, int]
    repeats: int
    figures: Mapping[str, Figure]
    acceptance: Acceptance
    token_sources: Mapping[str, int]
    chunks_not_steps: int
    truncated: int
    decode_off_engine: int = 0  # records flagged decode_rate_off_engine: their chunks arrived late
    spans: SpanFigures | None = None  # where drafts land (span types, output positions), MAL pooled and per request

    @property
    def errors(self) -> int:
        return self.requests - self.outcomes.get("ok", 0)

    def get(self, field: str) -> str | None:
        return dict(self.key).get(field)

    def figure(self, name: str) -> float | None:
        fig = self.figures.get(name)
        return fig.value if fig is not None else None


@dataclass(frozen=True, slots=True)
class Report:
    group_by: tuple[str, ...]
    groups: tuple[GroupReport, ...]
    requests: int
    spec: FigureSpec = DEFAULT_SPEC
    quantiles_exact: bool = True  # False: some percentiles come from a sketch (specproxy.analysis.figures.sketch)

    @property
    def figure_names(self) -> tuple[str, ...]:
        return self.spec.names


def combine(per_partition: Sequence[Mapping[str, float | None]], names: Sequence[str] = FIGURES) -> dict[str, Figure]:
    out: dict[str, Figure] = {}
    for name in names:
        xs = [v for p in per_partition if (v := p.get(name)) is not None]
        out[name] = Figure(median(xs), min(xs), max(xs), len(xs)) if xs else Figure(None, None, None, 0)
    return out


def describe_key(key: Sequence[tuple[str, Any]]) -> str:
    return " / ".join(str(v) for _, v in key)
