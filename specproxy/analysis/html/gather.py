"""What the HTML report's charts need of the runs, gathered in one streaming pass (generation requests only).

Per workload and label: decode tok/s and acceptance (a report group without latency gaps). Per report group: TTFT,
inter-token and inter-step distributions (:class:`Quantiles`: exact, or a DDSketch whose CDF is drawn bucket by
bucket). Per label: start and end times as two float arrays (16 bytes a request), from which the requests-in-flight
step function is drawn, at most :data:`MAX_TIMELINE_POINTS` points (the highest level in each time bin beyond).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from specproxy.analysis.figures.groups import Grouping
from specproxy.analysis.figures.records import generates, is_ok, key_value
from specproxy.analysis.figures.sketch import Quantiles
from specproxy.analysis.inputs.scan import ChunkBatch, Item
from specproxy.analysis.report.accum import GroupAcc

MAX_TIMELINE_POINTS = 2000


class _Latency:
    __slots__ = ("itl", "step", "ttft")

    def __init__(self) -> None:
        self.ttft, self.itl, self.step = Quantiles(), Quantiles(), Quantiles()

    def gap_targets(self) -> tuple[Quantiles, Quantiles | None]:
        return self.step, self.itl


class ChartInput:
    """Feed items (:meth:`add`); ``only_generating=False`` when the runs hold no generation request at all."""

    def __init__(self, group_by: Sequence[str], *, only_generating: bool = True) -> None:
        self.only_generating = only_generating
        self.by_wl = Grouping(("workload", "label"), lambda: GroupAcc(gaps=False))
        self.group_by = tuple(group_by)
        self.latency: dict[tuple[str, ...], _Latency] = {}
        self.spans: dict[str, tuple[array[float], array[float]]] = {}
        self.items = 0

    def add(self, item: Item, batch: ChunkBatch) -> None:
        rec = item.rec
        if self.only_generating and not generates(rec):
            return
        self.items += 1
        self.by_wl.get(item.rec).add(item, batch)
        key = tuple(key_value(rec, f) for f in self.group_by)
        lat = self.latency.get(key)
        if lat is None:
            lat = self.latency[key] = _Latency()
        if is_ok(rec):
            if (v := rec["ttft_s"]) is not None:
                lat.ttft.add(v)
            batch.add(item.seg, [lat])
        start, e2e = rec["started_at"], rec["e2e_s"]
        if start is not None and e2e is not None:
            label = key_value(rec, "label")
            spans = self.spans.get(label)
            if spans is None:
                spans = self.spans[label] = (array("d"), array("d"))
            spans[0].append(start)
            spans[1].append(start + e2e)

    def in_flight(self, label: str) -> list[tuple[float, float]]:
        """Requests in flight over time, a step function ``[(seconds since the first start, count)]`` (ends before
        starts at the same instant), thinned to at most MAX_TIMELINE_POINTS points."""
        starts, ends = (np.frombuffer(a, dtype=np.float64) for a in self.spans.get(label, (array("d"), array("d"))))
        if not len(starts):
            return []
        times = np.concatenate([starts, ends])
        deltas = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
        order = np.lexsort((deltas, times))  # ends before starts at the same instant
        times, levels = times[order] - times[order][0], np.cumsum(deltas[order])
        if len(times) + 1 <= MAX_TIMELINE_POINTS:
            return [(0.0, 0.0), *zip(times.tolist(), levels.tolist(), strict=True)]
        bins = MAX_TIMELINE_POINTS // 2
        edges = np.linspace(0.0, float(times[-1]), bins + 1)
        which = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, bins - 1)
        peak = np.full(bins, -1.0)
        np.maximum.at(peak, which, levels)
        last = np.zeros(bins)
        last[which] = levels  # numpy keeps the last write: the level at the bin's end
        out: list[tuple[float, float]] = [(0.0, 0.0)]
        for i in range(bins):
            if peak[i] >= 0:
                out.append((float(edges[i]), float(peak[i])))
                out.append((float(edges[i + 1]), float(last[i])))
        return out
