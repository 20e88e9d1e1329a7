"""Live SLO figures for ``/specproxy/status``: per workload, the share of finished requests meeting every target and
goodput (good requests and their completion tokens per second, from the first request's start to the last end), as
``specproxy report --slo`` computes them from the records. O(1) per record, off the relay path (the recorder calls
:meth:`SloTracker.observe` when it writes a record)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specproxy.analysis.figures.slo import SloSpec
from specproxy.core.record import Record


@dataclass(slots=True)
class _Counts:
    judged: int = 0
    met: int = 0
    good_tokens: int = 0
    first_start: float | None = None
    last_end: float | None = None

    def add(self, rec: Record, met: bool) -> None:
        self.judged += 1
        if met:
            self.met += 1
            self.good_tokens += rec["completion_tokens"] or 0
        start, e2e = rec["started_at"], rec["e2e_s"]
        if start is not None and e2e is not None:
            self.first_start = start if self.first_start is None else min(self.first_start, start)
            self.last_end = start + e2e if self.last_end is None else max(self.last_end, start + e2e)

    def as_json(self) -> dict[str, Any]:
        span = (self.last_end - self.first_start) if self.first_start is not None and self.last_end is not None else 0
        return {
            "judged": self.judged,
            "met": self.met,
            "attainment": self.met / self.judged if self.judged else None,
            "goodput_req_s": self.met / span if span > 0 else None,
            "goodput_tok_s": self.good_tokens / span if span > 0 else None,
        }


class SloTracker:
    def __init__(self, slo: SloSpec) -> None:
        self.slo = slo
        self._per: dict[str, _Counts] = {}

    def observe(self, rec: Record) -> None:
        """Count a finished generation request whose workload has targets (a /v1/models call has none to meet)."""
        target = self.slo.for_workload(rec["workload"])
        if target is None or not (rec["completion_tokens"] or rec["path"].endswith("completions")):
            return
        self._per.setdefault(rec["workload"], _Counts()).add(rec, target.met_by(rec))

    def status(self) -> dict[str, Any]:
        return {
            "targets": self.slo.describe(),
            "workloads": {w: c.as_json() for w, c in sorted(self._per.items())},
        }
