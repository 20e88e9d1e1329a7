"""Service-level objectives, goodput, and which latency percentiles a report computes. Pure.

An SLO is a set of targets on a request's TTFT, TPOT (per output token, ``tpot_s`` of the record) and end-to-end
time; any subset, for every workload or for one (``--slo ttft=500ms,tpot=50ms`` and ``--slo code_agent:e2e=30s``,
the workload's own targets replacing the default ones). A request *meets* it when it finished ``ok`` and every target
holds (a target on a figure the request lacks is not met). As vLLM's ``bench serve --goodput`` defines it, goodput is
the requests that meet the SLO per second of the run (from the first start to the last end), and their completion
tokens per second.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from specproxy.analysis.figures.records import RunSpan
from specproxy.core.record import Record

TARGETS = ("ttft", "tpot", "e2e")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(us|ms|s|m)?\s*$", re.IGNORECASE)
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met_by(self, rec: Record) -> bool:
        if rec["outcome"] != "ok":
            return False
        for target, value in ((self.ttft_s, rec["ttft_s"]), (self.tpot_s, rec["tpot_s"]), (self.e2e_s, rec["e2e_s"])):
            if target is not None and (value is None or value > target):
                return False
        return True

    def describe(self) -> str:
        targets = zip(TARGETS, (self.ttft_s, self.tpot_s, self.e2e_s), strict=True)
        return ",".join(f"{name}<={_fmt_s(v)}" for name, v in targets if v is not None)


@dataclass(frozen=True, slots=True)
class SloSpec:
    default: Slo | None = None
    per_workload: Mapping[str, Slo] = field(default_factory=dict)

    def for_workload(self, workload: str) -> Slo | None:
        return self.per_workload.get(workload, self.default)

    def met_by(self, rec: Record) -> bool:
        slo = self.for_workload(rec["workload"])
        return slo is not None and slo.met_by(rec)

    def describe(self) -> str:
        parts = [self.default.describe()] if self.default is not None else []
        parts += [f"{w}:{s.describe()}" for w, s in self.per_workload.items()]
        return "; ".join(parts)


def parse_duration_s(text: str) -> float:
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration like 500ms, 0.5s or 2m")
    value = float(m.group(1)) * _UNIT_S[(m.group(2) or "s").lower()]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} must be a positive duration")
    return value


def parse_slo(values: Sequence[str]) -> SloSpec | None:
    """``--slo`` values: ``ttft=500ms,tpot=50ms,e2e=30s`` (any subset), or ``WORKLOAD:...`` for one workload.
    Raises ValueError with a message that names the bad part."""
    default: Slo | None = None
    per: dict[str, Slo] = {}
    for value in values:
        workload, sep, rest = value.partition(":")
        if not sep or "=" in workload:
            workload, rest = "", value
        targets: dict[str, float] = {}
        for part in rest.split(","):
            name, eq, amount = part.strip().partition("=")
            name = name.strip().lower()
            if not eq or name not in TARGETS:
                raise ValueError(f"--slo {value!r}: expected TARGET=DURATION with TARGET one of {', '.join(TARGETS)}")
            if name in targets:
                raise ValueError(f"--slo {value!r}: {name} given twice")
            try:
                targets[name] = parse_duration_s(amount)
            except ValueError as e:
                raise ValueError(f"--slo {value!r}: {e}") from None
        slo = Slo(targets.get("ttft"), targets.get("tpot"), targets.get("e2e"))
        if workload:
            per[workload.strip()] = slo
        else:
            default = slo
    return SloSpec(default, per) if default is not None or per else None


@dataclass(frozen=True, slots=True)
class Goodput:
    attainment: float | None  # share of requests meeting the SLO
    requests_per_s: float | None
    tokens_per_s: float | None


class GoodputCount:
    """The requests judged against an SLO and those meeting it, added one record at a time; :meth:`result` over the
    span they ran in (:class:`specproxy.analysis.figures.records.RunSpan`)."""

    __slots__ = ("good", "good_tokens", "judged")

    def __init__(self) -> None:
        self.judged = self.good = 0
        self.good_tokens = 0

    def add(self, rec: Record, slo: SloSpec) -> None:
        if slo.for_workload(rec["workload"]) is not None:
            self.judged += 1
            if slo.met_by(rec):
                self.good += 1
                self.good_tokens += rec["completion_tokens"] or 0

    def merge(self, other: GoodputCount) -> None:
        self.judged += other.judged
        self.good += other.good
        self.good_tokens += other.good_tokens

    def result(self, span_s: float) -> Goodput:
        if not self.judged:
            return Goodput(None, None, None)
        return Goodput(
            attainment=self.good / self.judged,
            requests_per_s=self.good / span_s if span_s > 0 else None,
            tokens_per_s=self.good_tokens / span_s if span_s > 0 else None,
        )


def goodput(records: Iterable[Record], slo: SloSpec) -> Goodput:
    """Over ``records`` (one partition): the share meeting the SLO, and goodput over the run's wall-clock span.
    Only requests that have an SLO (their workload's, or the default) count."""
    count, run = GoodputCount(), RunSpan()
    for rec in records:
        count.add(rec, slo)
        run.add(rec)
    return count.result(run.span_s())


# -- which latency percentiles a report computes -------------------------------------------------------------------
LATENCY_METRICS = ("ttft", "itl", "step", "tpot", "e2e")
# today's default set: what tables and JSON have always shown
DEFAULT_PERCENTILES: Mapping[str, tuple[float, ...]] = {
    "ttft": (50, 90, 99),
    "itl": (50, 99),
    "step": (50, 99),
    "tpot": (50, 90),
    "e2e": (50, 90, 99),
}


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``--percentiles 50,90,99,99.9``: each in (0, 100], no repeats, in the order given."""
    out: list[float] = []
    for part in text.split(","):
        try:
            p = float(part)
        except ValueError:
            raise ValueError(f"--percentiles takes numbers like 50,90,99.9; got {part.strip()!r}") from None
        if not 0 < p <= 100 or not math.isfinite(p):
            raise ValueError(f"--percentiles: {part.strip()} is not in (0, 100]")
        if p in out:
            raise ValueError(f"--percentiles: {part.strip()} given twice")
        out.append(p)
    return tuple(out)


def percentile_name(metric: str, p: float) -> str:
    """``ttft_s_p50``, ``e2e_s_p99.9``: the figure's name in tables, JSON and CSV."""
    return f"{metric}_s_p{p:g}"


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """What a report computes beyond its fixed figures: latency percentiles per metric, and an SLO."""

    percentiles: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: dict(DEFAULT_PERCENTILES))
    slo: SloSpec | None = None

    @classmethod
    def with_percentiles(cls, ps: Iterable[float] | None, slo: SloSpec | None = None) -> FigureSpec:
        if ps is None:
            return cls(slo=slo)
        chosen = tuple(ps)
        return cls({m: chosen for m in LATENCY_METRICS}, slo)

    def latency(self, metric: str) -> tuple[str, ...]:
        return tuple(percentile_name(metric, p) for p in self.percentiles.get(metric, ()))

    @property
    def names(self) -> tuple[str, ...]:
        out = ["decode_tok_s_p50", "output_tok_s"]
        for metric in LATENCY_METRICS:
            out += self.latency(metric)
        out += ["acceptance_rate", "mean_acceptance_length", "prompt_cached_share"]
        if self.slo is not None:
            out += ["slo_attainment", "goodput_req_s", "goodput_tok_s"]
        return tuple(out)


def _fmt_s(v: float) -> str:
    return f"{v * 1000:g}ms" if v < 1 else f"{v:g}s"
