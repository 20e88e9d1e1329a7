"""Where a matrix run is and how long it has left: configuration i/n, its phase (starting, warm-up, a workload and
repeat, stopping), requests done, and an estimate of the time left.

The estimate uses what this run has seen: the mean time a server took from start to healthy, and the mean time per
request while sending; every configuration left costs one start and its requests. Before the first request has
finished there is no estimate. Clock readings are passed in (``now``), so the arithmetic is testable.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Tracker:
    def __init__(self, configs: int, requests_per_config: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.configs = configs
        self.per_config = requests_per_config  # warm-up and measured requests of one configuration
        self.clock = clock
        self.index = 0  # 1-based index of the configuration being measured
        self.label = ""
        self.phase_text = ""
        self._starts: list[float] = []
        self._start_t: float | None = None
        self._send_t: float | None = None
        self._send_s_done = 0.0  # sending time of configurations already finished
        self._requests_done = 0  # of configurations already finished
        self._warm = 0
        self._measured = 0

    def next_config(self, label: str) -> None:
        now = self.clock()
        if self._send_t is not None:
            self._send_s_done += now - self._send_t
            self._requests_done += self._warm + self._measured
        self.index += 1
        self.label = label
        self.phase_text = ""
        self._start_t, self._send_t = now, None
        self._warm = self._measured = 0

    def phase(self, text: str) -> None:
        self.phase_text = text

    def started(self) -> None:
        now = self.clock()
        if self._start_t is not None:
            self._starts.append(now - self._start_t)
        self._send_t = now

    def add_done(self, warm: int) -> None:
        self._warm += warm

    def measured_done(self, n: int) -> None:
        self._measured = n

    def seconds_left(self) -> float | None:
        now = self.clock()
        sending = self._send_s_done + (now - self._send_t if self._send_t is not None else 0.0)
        done = self._requests_done + self._warm + self._measured
        if done == 0 or sending <= 0:
            return None
        per_request = sending / done
        mean_start = sum(self._starts) / len(self._starts) if self._starts else 0.0
        left_here = max(0, self.per_config - self._warm - self._measured) * per_request
        if self._send_t is None and self._start_t is not None:  # still starting: the mean start, less what passed
            left_here += max(0.0, mean_start - (now - self._start_t))
        later = max(0, self.configs - self.index)
        return left_here + later * (mean_start + self.per_config * per_request)

    def line(self) -> str:
        left = self.seconds_left()
        eta = "estimating time left" if left is None else f"about {_duration(left)} left"
        done = min(self.per_config, self._warm + self._measured)
        phase = f": {self.phase_text}" if self.phase_text else ""
        return f"[{self.index}/{self.configs}] {self.label}{phase}, {done}/{self.per_config} requests; {eta}"


def _duration(s: float) -> str:
    if s < 90:
        return f"{max(1, round(s))} s"
    if s < 5400:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"
