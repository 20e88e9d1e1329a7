"""How many requests were in flight while a request decoded: the batch size its decode steps ran at. Pure.

Records already hold what this needs: each request's start (``started_at``, one wall-clock anchor), its first token
(``ttft_s``) and its end (``e2e_s``). Over the records of one server (a proxy in front of it sees all of its
traffic; a load run is all of the traffic it sent), the requests in flight at an instant are those started and not
yet ended; a request's *decode in-flight* is the time-weighted mean of that count from its first token to its end,
itself included. It is exact when the records are the server's whole traffic, and an undercount when other clients
share the server unseen (several proxies, traffic that bypasses the proxy): say so where it matters.

No field is added to the records for this: they already carry it, and files written before today work too.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from specproxy.core.record import Record


class InFlight:
    """The step function of requests in flight over a set of records, with its running integral, so the mean count
    over any interval is two binary searches."""

    def __init__(self, records: Iterable[Record]) -> None:
        events: list[tuple[float, int]] = []
        for r in records:
            start, e2e = r["started_at"], r["e2e_s"]
            if start is not None and e2e is not None and e2e >= 0:
                events.append((start, 1))
                events.append((start + e2e, -1))
        events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
        self._t: list[float] = []
        self._level: list[int] = []  # the count from _t[i] until _t[i + 1]
        self._area: list[float] = []  # integral of the count from _t[0] to _t[i]
        level, area = 0, 0.0
        for t, d in events:
            if self._t:
                area += self._level[-1] * (t - self._t[-1])
            level += d
            self._t.append(t)
            self._level.append(level)
            self._area.append(area)

    def _integral(self, t: float) -> float:
        i = bisect.bisect_right(self._t, t) - 1
        if i < 0:
            return 0.0
        return self._area[i] + self._level[i] * (t - self._t[i])

    def mean(self, t0: float, t1: float) -> float | None:
        """Mean count over [t0, t1]; at an instant (t0 == t1), the count then."""
        if not self._t or t1 < t0:
            return None
        if t1 == t0:
            i = bisect.bisect_right(self._t, t0) - 1
            return float(self._level[i]) if i >= 0 else 0.0
        return (self._integral(t1) - self._integral(t0)) / (t1 - t0)


def decode_window(rec: Record) -> tuple[float, float] | None:
    """(first token, end) in the records' wall-clock seconds; None without a start, a first token or an end."""
    start, ttft, e2e = rec["started_at"], rec["ttft_s"], rec["e2e_s"]
    if start is None or ttft is None or e2e is None or e2e < ttft:
        return None
    return start + ttft, start + e2e


def decode_in_flight(records: Sequence[Record]) -> dict[str, float]:
    """Mean requests in flight (itself included) during each request's decode, by ``request_id``; pass the records
    of one server (one configuration) at a time."""
    flight = InFlight(records)
    out: dict[str, float] = {}
    for r in records:
        window = decode_window(r)
        if window is not None and (m := flight.mean(*window)) is not None:
            out[r["request_id"]] = m
    return out
