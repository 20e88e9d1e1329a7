"""The path's buffering verdict: whether something between the engine and the proxy holds the stream back
(:mod:`specproxy.analysis.figures.buffering`), from the last records, in ``/specproxy/status`` as ``path``. Always on;
no options."""

from __future__ import annotations

from typing import Any, Self

from specproxy.analysis.figures.buffering import BufferingTracker
from specproxy.core.record import Record
from specproxy.proxy.addons.base import Addon
from specproxy.proxy.config import ProxyConfig


class BufferingAddon(Addon):
    name = "path"
    group = "Path"

    def __init__(self) -> None:
        self.tracker = BufferingTracker()

    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self:
        return cls()

    def observe(self, rec: Record) -> None:
        self.tracker.observe(rec)

    def status(self) -> dict[str, Any]:
        return {"buffering": self.tracker.status()}
