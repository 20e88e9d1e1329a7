"""``--advise-every``: the k that pays off now per workload, and the figures per band of requests in flight, from a
sliding window of live records (:mod:`specproxy.recorder.live_advice`, :mod:`specproxy.recorder.live_bands`); in
``/specproxy/status`` as ``advice`` and in ``specproxy_recommended_k`` and ``specproxy_band_*``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Self

from prometheus_client.registry import Collector

from specproxy.core.record import Record
from specproxy.proxy.addons.base import Addon, Context, Option, OptionError
from specproxy.proxy.config import ProxyConfig
from specproxy.recorder.live_advice import LiveAdvice, LiveAdviceCollector
from specproxy.recorder.live_bands import Schedule, parse_schedule
from specproxy.recorder.recorder import Recorder

log = logging.getLogger("specproxy.bookkeeper")


@dataclass(frozen=True, slots=True)
class AdviceSettings:
    every_s: float = 60.0  # between refreshes (0: off)
    window_s: float = 600.0  # the live records it is computed from
    schedule: Schedule | None = None  # what the engine was told (--speculative-config), checked per band


class AdviceAddon(Addon):
    name = "advice"
    group = "Live advice"
    options = (
        Option(
            "--advise-every",
            float,
            60.0,
            "Seconds between refreshes of the live advice (the k that pays off now, per workload, in "
            "/specproxy/status and specproxy_recommended_k); 0: off.",
        ),
        Option("--advise-window", float, 600.0, "Seconds of live records the advice is computed from."),
        Option(
            "--speculative-config",
            str | None,
            None,
            "The JSON given to vllm serve --speculative-config (or its num_speculative_tokens_per_batch_size list): "
            "the live advice checks per band of requests in flight that the engine runs the k it schedules.",
        ),
    )

    def __init__(self, settings: AdviceSettings) -> None:
        self.every_s = settings.every_s
        self.live = LiveAdvice(settings.window_s, schedule=settings.schedule)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def configure(cls, values: dict[str, Any], ctx: Context) -> AdviceSettings:
        every, window, spec = values["advise_every"], values["advise_window"], values["speculative_config"]
        if every < 0 or window <= 0:
            raise OptionError("--advise-every cannot be negative, and --advise-window must be positive")
        schedule = None
        if spec is not None:
            if every == 0:
                raise OptionError("--speculative-config needs the live advice (--advise-every > 0)")
            try:
                schedule = parse_schedule(spec)
            except ValueError as e:
                raise OptionError(f"--speculative-config: {e}") from None
        return AdviceSettings(every, window, schedule)  # kept when off too: without settings, the advice is on

    @classmethod
    def settings(cls, cfg: ProxyConfig) -> object | None:
        """On by default, as the options' defaults say, for a configuration built without the command line."""
        return cfg.addons.get(cls.name, AdviceSettings())

    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self | None:
        settings = cls.settings(cfg)
        return cls(settings) if isinstance(settings, AdviceSettings) and settings.every_s > 0 else None

    @classmethod
    def collector(cls, running: Self | None) -> Collector:
        return LiveAdviceCollector(running.live if running is not None else None)

    def observe(self, rec: Record) -> None:
        self.live.observe(rec)

    async def start(self, recorder: Recorder) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        """Refresh every ``every_s``, computed in a thread on a snapshot of the window, which the bookkeeper's loop
        should not wait for."""
        live = self.live
        while True:
            await asyncio.sleep(self.every_s)
            try:
                records, points = live.snapshot(), live.band_points()
                live.update(*await asyncio.to_thread(LiveAdvice.compute_all, records, points, live.schedule))
            except Exception:  # the advice is a view of the records: a failure loses nothing, and is said
                log.exception("refreshing the live advice failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def status(self) -> dict[str, Any]:
        return self.live.status()
