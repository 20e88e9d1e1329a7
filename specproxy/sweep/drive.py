"""Drive one server at a series of load levels: closed-loop concurrencies or open-loop rates, a list or ``auto``.

:func:`sweep_target` is the core: a target and its levels in, one :class:`LevelRun` (the level's records) per level
out, every record appended to one file with ``run_id`` ``<sweep id>@c<N>`` (or ``@r<X>``), the tag the analysis reads
the level from. Each level replays the same plan (same workloads, seed and order), so configurations swept alike
pair request by request.

``auto`` starts at one stream (or ``start`` requests/s) and doubles until the throughput stops growing (less than
``growth`` over the best level before), the SLO breaks (fewer than ``min_attainment`` of a level's requests meet it),
most requests fail, or ``max_value`` is reached. Later configurations of a comparison run at the first one's levels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specproxy.analysis.figures.records import generates, is_ok, output_tok_s
from specproxy.analysis.figures.slo import SloSpec, goodput
from specproxy.analysis.sweep.model import level_tag
from specproxy.core.record import Record, read_records
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.session import run_load

KINDS = ("concurrency", "rate")
DEFAULT_MAX_CONCURRENCY = 256
DEFAULT_GROWTH = 0.05
DEFAULT_MIN_ATTAINMENT = 0.9


@dataclass(frozen=True, slots=True)
class Levels:
    kind: str  # "concurrency" or "rate"
    values: tuple[float, ...] | None  # None: auto
    start: float = 1.0
    max_value: float = DEFAULT_MAX_CONCURRENCY
    growth: float = DEFAULT_GROWTH
    min_attainment: float = DEFAULT_MIN_ATTAINMENT

    @property
    def auto(self) -> bool:
        return self.values is None


def parse_levels(text: str, kind: str, *, start: float = 1.0, max_value: float = DEFAULT_MAX_CONCURRENCY) -> Levels:
    """``1,2,4,8`` or ``auto``. Concurrencies are whole and at least 1; rates positive; a list rises strictly.
    Raises ValueError naming the option."""
    option = f"--{kind}"
    if kind not in KINDS:
        raise ValueError(f"level kind must be one of {', '.join(KINDS)}")
    if text.strip().lower() == "auto":
        return Levels(kind, None, start=start, max_value=max_value)
    out: list[float] = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"{option} takes a list like 1,2,4,8 or 'auto'; got {part.strip()!r}") from None
        if not math.isfinite(v) or v <= 0 or (kind == "concurrency" and v != int(v)):
            what = "whole numbers >= 1" if kind == "concurrency" else "positive numbers"
            raise ValueError(f"{option} levels must be {what}; got {part.strip()!r}")
        if out and v <= out[-1]:
            raise ValueError(f"{option} levels must rise: {part.strip()} after {out[-1]:g}")
        out.append(v)
    if len(out) > 64:
        raise ValueError(f"{option}: at most 64 levels")
    return Levels(kind, tuple(out), start=start, max_value=max_value)


@dataclass(frozen=True, slots=True)
class LevelRun:
    kind: str
    value: float
    run_id: str
    records: list[Record]
    output_tok_s: float | None
    attainment: float | None
    failed: int
    signal: int | None = None
    stop_reason: str | None = None  # why an automatic sweep stopped after this level


@dataclass(frozen=True, slots=True)
class PerLevel:
    """How many measured requests a level sends: at least ``requests``, and ``per_stream`` per stream in flight (a
    closed loop at 64 streams needs more than 64 requests to reach its steady state)."""

    requests: int = 32
    per_stream: int = 4

    def at(self, kind: str, value: float) -> int:
        return max(self.requests, math.ceil(self.per_stream * value)) if kind == "concurrency" else self.requests


def _at_level(spec: LoadSpec, kind: str, value: float, n: int, run_id: str) -> LoadSpec:
    recorder = replace(spec.recorder, run_id=run_id)
    if kind == "concurrency":
        return replace(spec, concurrency=int(value), rate=None, requests=n, duration_s=None, recorder=recorder)
    return replace(spec, concurrency=spec.concurrency, rate=value, requests=n, duration_s=None, recorder=recorder)


def _read(out: Path, run_id: str, label: str | None) -> list[Record]:
    """This level's records of this configuration (every configuration of a sweep shares the level's run_id)."""
    if not out.exists():
        return []
    return [r for r in read_records(out) if r["run_id"] == run_id and r["label"] == label]


def _stop_reason(levels: Levels, run: LevelRun, best: float | None, nxt: float) -> str | None:
    if run.signal is not None:
        return "interrupted"
    n = len(run.records)
    if n and run.failed * 2 > n:
        return f"{run.failed} of {n} requests failed"
    if run.attainment is not None and run.attainment < levels.min_attainment:
        return f"SLO met by {run.attainment:.0%} of requests (< {levels.min_attainment:.0%})"
    if best is not None and run.output_tok_s is not None and run.output_tok_s < best * (1 + levels.growth):
        return f"throughput stopped growing ({run.output_tok_s:.1f} tok/s, best before {best:.1f})"
    if nxt > levels.max_value:
        return f"reached the largest level allowed ({levels.max_value:g})"
    return None


async def sweep_target(
    spec: LoadSpec,
    levels: Levels,
    *,
    out: Path,
    sweep_id: str,
    per_level: PerLevel = PerLevel(),
    slo: SloSpec | None = None,
    model: str | None = None,
    on_level: Callable[[LevelRun], None] | None = None,
) -> list[LevelRun]:
    """Run ``spec`` (its target, workloads, body, recorder label) at each level; return each level's records.

    Stops early on a signal (the level's run stops cleanly and its records are kept)."""
    runs: list[LevelRun] = []
    values: Sequence[float] = levels.values or ()
    value = levels.start if levels.auto else values[0]
    best: float | None = None
    i = 0
    while True:
        run_id = f"{sweep_id}@{level_tag(levels.kind, value)}"
        n = per_level.at(levels.kind, value)
        outcome = await run_load(_at_level(spec, levels.kind, value, n, run_id), out=out, model=model, progress=False)
        recs = [r for r in _read(out, run_id, spec.recorder.label) if generates(r)]
        gp = goodput(recs, slo) if slo is not None else None
        run = LevelRun(
            kind=levels.kind,
            value=value,
            run_id=run_id,
            records=recs,
            output_tok_s=output_tok_s(recs),
            attainment=gp.attainment if gp is not None else None,
            failed=sum(1 for r in recs if not is_ok(r)),
            signal=outcome.signal,
        )
        i += 1
        nxt = value * 2 if levels.auto else (values[i] if i < len(values) else math.inf)
        reason = _stop_reason(levels, run, best, nxt) if levels.auto or run.signal is not None else None
        run = replace(run, stop_reason=reason)
        runs.append(run)
        if on_level is not None:
            on_level(run)
        if reason is not None or not math.isfinite(nxt):
            return runs
        if run.output_tok_s is not None:
            best = max(best or 0.0, run.output_tok_s)
        value = nxt
