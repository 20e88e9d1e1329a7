"""Saturation's rate over the window in which every relay process has streams. Pure: the clients' results, which
relay process held each stream and CPU samples in, figures out.

Over the whole phase a relay's chunks/s ends with a tail: the kernel spreads connections over ``--workers N`` relays
by hash, not evenly, so some relays finish their streams early and sit idle while the busiest one still relays. That
tail measures the hash's imbalance, not what the relays can carry. The window runs from the moment the last stream's
request is sent to the moment the first relay process has relayed the last event of all its streams: in it every
relay holds all the streams it will get and has work. (It starts at the last request, not the last first event: a
saturated relay starves its newest streams, whose first events can come after other streams have ended.) Each
client counts the events of each read into 1 ms bins (by ``CLOCK_MONOTONIC``, one clock per machine) and gives each
stream's local port and last event; the bench reads from ``/proc`` which relay process holds each port's connection;
only bins wholly inside the window count.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

BIN_NS = 1_000_000  # the clients' bins: events read per millisecond
MIN_WINDOW_S = 0.2  # a shorter window (streams too short for the stagger of their starts) says too little


def window(parts: Sequence[dict[str, Any]], owners: Mapping[int, int] | None = None) -> tuple[int, int] | None:
    """The window, in ns, in which every relay process had streams: from the moment the last stream's request was
    sent (a saturated relay starves its newest streams, so their first events can come near the phase's end) to
    the earliest moment some relay process had relayed the last event of all its streams (``owners``: the client's
    port of each stream, the relay process that held it; streams of no known process count as one more). Without
    owners: to the earliest last event of any stream. None when a client kept no bins (a paced phase) or a stream
    read no event (``all_flowing_ns``: when every stream had its first event, None if one never did)."""
    if not parts or any(p.get("bins") is None or p.get("all_flowing_ns") is None for p in parts):
        return None
    start = max(int(p["all_started_ns"]) for p in parts)
    if owners is None:
        end = min(int(p["first_end_ns"]) for p in parts)
    else:
        last: dict[int, int] = {}
        for p in parts:
            for port, t in p["ends"]:
                who = owners.get(int(port), 0)
                last[who] = max(last.get(who, 0), int(t))
        end = min(last.values(), default=0)
    return (start, end) if end > start else None


def events_in(parts: Sequence[dict[str, Any]], start_ns: int, end_ns: int) -> tuple[int, float]:
    """Events the clients read in the whole bins between ``start_ns`` and ``end_ns``, and the seconds those bins
    span."""
    first = -(-start_ns // BIN_NS)  # the first bin that starts at or after the window's start
    last = end_ns // BIN_NS  # bins before this one end by the window's end
    if last <= first:
        return 0, 0.0
    events = 0
    for p in parts:
        base = int(p["bins"]["first"])
        counts = p["bins"]["counts"]
        lo, hi = max(first - base, 0), min(last - base, len(counts))
        if hi > lo:
            events += sum(counts[lo:hi])
    return events, (last - first) * BIN_NS / 1e9


def at(samples: Sequence[tuple[int, float]], t_ns: int) -> float | None:
    """A cumulative reading (CPU-seconds) at ``t_ns``, linear between the samples either side; None outside them."""
    if not samples or t_ns < samples[0][0] or t_ns > samples[-1][0]:
        return None
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= t_ns <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)
    return samples[-1][1]


def cores(samples: Sequence[tuple[int, float]], start_ns: int, end_ns: int) -> float | None:
    """Cores in use over the window (CPU-seconds per second) from cumulative samples; None when they do not cover
    it."""
    a, b = at(samples, start_ns), at(samples, end_ns)
    return None if a is None or b is None or end_ns <= start_ns else (b - a) / ((end_ns - start_ns) / 1e9)


def saturation_window(
    parts: Sequence[dict[str, Any]],
    cpu: Mapping[str, Sequence[tuple[int, float]]],
    owners: Mapping[int, int] | None = None,
) -> dict[str, Any] | None:
    """The window's figures: its bounds and length, the events read in it, chunks/s, and cores in use over it of
    each series in ``cpu`` (cumulative CPU-seconds sampled over the phase: ``relay``, ``relay <pid>``, ``upstream``
    ...); None when there is no window of at least ``MIN_WINDOW_S``."""
    w = window(parts, owners)
    if w is None:
        return None
    events, span_s = events_in(parts, *w)
    if span_s < MIN_WINDOW_S:
        return None
    first, last = -(-w[0] // BIN_NS) * BIN_NS, w[1] // BIN_NS * BIN_NS
    return {
        "start_ns": first,
        "end_ns": last,
        "s": span_s,
        "events": events,
        "chunks_per_s": events / span_s,
        "streams_by_relay": sorted(Counter(owners.values()).values()) if owners else None,
        "cores": {name: cores(s, first, last) for name, s in cpu.items()},
    }
