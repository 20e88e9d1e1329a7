"""``--slo``: live attainment and goodput per workload in ``/specproxy/status``
(:mod:`specproxy.recorder.slo_status`)."""

from __future__ import annotations

from typing import Any, Self

from specproxy.analysis.figures.slo import SloSpec, parse_slo
from specproxy.core.record import Record
from specproxy.proxy.addons.base import Addon, Context, Option, SetupError
from specproxy.proxy.config import ProxyConfig
from specproxy.recorder.slo_status import SloTracker


class SloAddon(Addon):
    name = "slo"
    group = "Service-level objectives"
    options = (
        Option(
            "--slo",
            list[str] | None,
            None,
            "ttft=500ms,tpot=50ms,e2e=30s (WORKLOAD:... too): live attainment and goodput in status.",
        ),
    )

    def __init__(self, tracker: SloTracker) -> None:
        self.tracker = tracker

    @classmethod
    def configure(cls, values: dict[str, Any], ctx: Context) -> SloSpec | None:
        try:
            return parse_slo(values["slo"] or [])
        except ValueError as e:
            raise SetupError(str(e)) from None

    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self | None:
        spec = cls.settings(cfg)
        return cls(SloTracker(spec)) if isinstance(spec, SloSpec) else None

    def observe(self, rec: Record) -> None:
        self.tracker.observe(rec)

    def status(self) -> dict[str, Any]:
        return self.tracker.status()
