"""The end of a matrix: per group of configurations, the comparison table per workload (``specproxy compare``'s) and
the advice on k (``specproxy advise``'s), then what failed. Pure: records in, text out.

A group is a set of configurations compared with each other, each group with its own baseline (the configuration
without speculation, as ``compare`` chooses it): FP16, FP8 and AWQ are three groups, each with its baseline and its
MTP configurations. Configurations without a group form one group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specproxy.analysis.advise import render as render_advise
from specproxy.analysis.advise.gather import build_advice
from specproxy.analysis.advise.measured import measured_rows, with_measurements
from specproxy.analysis.advise.model import Advice
from specproxy.analysis.compare import render as render_compare
from specproxy.analysis.compare.model import Comparison, build_comparison, speculates
from specproxy.analysis.tables import render_text
from specproxy.core.record import Record
from specproxy.matrix.spec import MatrixSpec


@dataclass(frozen=True, slots=True)
class GroupResult:
    name: str
    comparison: Comparison
    advice: Advice | None
    missing: tuple[str, ...] = ()  # the group's configurations without records (failed, or not measured yet)


@dataclass(frozen=True, slots=True)
class Failure:
    label: str
    error: str
    tail: tuple[str, ...]
    log: str


def groups_of(spec: MatrixSpec) -> dict[str, list[str]]:
    """Group name -> labels, in the order of first appearance."""
    out: dict[str, list[str]] = {}
    for c in spec.configurations:
        for g in c.groups:
            out.setdefault(g, []).append(c.label)
    return out


def analyse(spec: MatrixSpec, records: Mapping[str, Sequence[Record]]) -> list[GroupResult]:
    out: list[GroupResult] = []
    for name, labels in groups_of(spec).items():
        present = [label for label in labels if records.get(label)]
        if not present:
            continue
        recs = [r for label in present for r in records[label]]
        try:
            comparison = build_comparison(recs)
        except ValueError:
            continue  # no generation request in any of them
        spec_recs = [r for label in present if label != comparison.baseline for r in records[label]]
        base = records[comparison.baseline]
        advice = None
        if spec_recs and speculates(spec_recs):
            advice = build_advice(spec_recs, [] if speculates(base) else base)
            advice = with_measurements(advice, measured_rows(spec_recs, base))
        missing = tuple(label for label in labels if label not in present)
        out.append(GroupResult(name, comparison, advice, missing))
    return out


def failure_lines(failures: Sequence[Failure]) -> list[str]:
    lines: list[str] = []
    for f in failures:
        lines.append(f"{f.label}: failed: {f.error}" + (f" (log: {f.log})" if f.log else ""))
        lines.extend(f"  | {t}" for t in f.tail)
    return lines


def matrix_text(
    spec: MatrixSpec,
    groups: Sequence[GroupResult],
    failures: Sequence[Failure],
    *,
    measured: int,
    skipped: int,
    results: str,
) -> str:
    parts: list[str] = [
        f"specproxy matrix: {len(spec.configurations)} configurations ({measured} measured now, {skipped} from "
        f"earlier runs, {len(failures)} failed); {spec.requests} requests per workload x {spec.repeats} repeats, "
        f"warm-up {spec.warmup}, concurrency {spec.concurrency}; tok/s: median decode tok/s per request, "
        "median over repeats",
    ]
    for g in groups:
        parts.append("")
        if g.name:
            parts.append(f"== {g.name} ==")
        if g.missing:
            parts.append(
                f"not in this table (not measured): {', '.join(g.missing)}; speedups are over {g.comparison.baseline}"
            )
        parts.append(render_text(render_compare.compare_tables(g.comparison)))
        if g.advice is not None:
            parts.append("")
            parts.append(render_advise.cost_text(g.advice))
            parts.append(render_text(render_advise.advise_tables(g.advice)))
    if not groups:
        parts.append("")
        parts.append("no configuration was measured")
    if failures:
        parts.append("")
        parts.extend(failure_lines(failures))
    parts.append("")
    parts.append(f"records, logs and manifest: {results}")
    return "\n".join(parts)
