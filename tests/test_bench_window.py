"""Saturation's rate over the window in which every relay process has streams (specproxy.bench.window), and each
saturation row against ``--workers 1`` over that window and over the whole phase
(specproxy.bench.verdicts.compare_saturation). Pure: made-up client results and CPU samples."""

from __future__ import annotations

from typing import Any

import pytest

from specproxy.bench.verdicts import compare_saturation, splice_notes, targets
from specproxy.bench.window import BIN_NS, events_in, saturation_window, window

MS = BIN_NS


def _part(first_bin: int, counts: list[int], started_ms: float, first_end_ms: float) -> dict[str, Any]:
    return {
        "bins": {"first": first_bin, "counts": counts},
        "all_flowing_ns": int(started_ms * MS) + 5 * MS,
        "all_started_ns": int(started_ms * MS),
        "first_end_ns": int(first_end_ms * MS),
    }


def test_the_window_runs_from_the_last_first_event_to_the_first_last_event_over_every_client() -> None:
    a = _part(0, [1] * 100, 10.5, 90.0)
    b = _part(5, [2] * 100, 20.2, 80.4)
    assert window([a, b]) == (int(20.2 * MS), int(80.4 * MS))
    # only whole bins inside it count: 21..79 ms, 59 bins; a's 1 a bin and b's 2 a bin
    assert events_in([a, b], *window([a, b]) or (0, 0)) == (59 * 3, pytest.approx(0.059))


def test_no_window_when_a_stream_ended_before_the_last_began_or_a_client_kept_no_bins() -> None:
    assert window([_part(0, [1] * 10, 50.0, 40.0)]) is None
    assert window([_part(0, [1] * 10, 1.0, 9.0), {"bins": None, "all_flowing_ns": None, "first_end_ns": 5}]) is None
    assert window([]) is None


def test_the_tail_after_the_first_stream_ends_does_not_count() -> None:
    """A relay given fewer streams ends early; the busiest one's tail runs alone at a lower rate."""
    counts = [100] * 1000 + [30] * 1000  # every stream for 1 s, then the tail
    part = _part(0, counts, 0.0, 1000.0)
    got = saturation_window([part], {"relay": [(0, 0.0), (1000 * MS, 4.0), (2000 * MS, 5.0)]})
    assert got is not None
    assert got["chunks_per_s"] == pytest.approx(100_000) and got["s"] == pytest.approx(1.0)
    assert got["cores"]["relay"] == pytest.approx(4.0)  # 4 CPU-seconds over the window's second
    assert sum(counts) / 2.0 == 65_000  # what the whole phase would say


def test_cores_are_interpolated_between_samples_and_unknown_outside_them() -> None:
    part = _part(0, [10] * 400, 100.0, 300.0)
    got = saturation_window([part], {"relay": [(0, 0.0), (400 * MS, 0.4)], "upstream": [(150 * MS, 0.0)]})
    assert got is not None and got["cores"]["relay"] == pytest.approx(1.0)
    assert got["cores"]["upstream"] is None


def test_a_window_shorter_than_the_minimum_is_none() -> None:
    assert saturation_window([_part(0, [1] * 100, 10.0, 60.0)], {}) is None


def _row(workers: int | None, window_rate: float, phase_rate: float, has_window: bool = True) -> dict[str, Any]:
    return {
        "relay": f"specproxy --workers {workers}" if workers else "direct",
        "workers": workers,
        "chunks_per_s": window_rate if has_window else phase_rate,
        "chunks_per_s_phase": phase_rate,
        "window": {"s": 1.0} if has_window else None,
        "cpu_ms_per_1000": None,
        "relay_only_cpu_ms_per_1000": None,
    }


def test_ratios_over_the_window_and_over_the_phase_and_the_targets_take_the_window() -> None:
    sat = [_row(None, 3e6, 2e6), _row(1, 3e6, 2.5e6), _row(2, 5.7e6, 4e6), _row(4, 11e6, 7e6)]
    assert compare_saturation(sat) is None
    assert [r["vs_workers_1"] for r in sat] == [None, 1.0, 1.9, pytest.approx(11 / 3)]
    assert [r["vs_workers_1_phase"] for r in sat] == [None, 1.0, 1.6, 2.8]
    got = {t["target"]: t["value"] for t in targets([], sat)}
    assert got["specproxy --workers 4 / --workers 1: chunks/s at saturation"] == pytest.approx(11 / 3)


def test_a_splice_floor_the_load_held_back_is_named_in_a_note() -> None:
    """The splice in 1, 2 and 4 processes: a row whose processes idled (a quarter of a core in all, as on the 16-core
    machine, where the client took each upstream write as it came) is no floor for scaling, and says so."""
    sat = [
        {"relay": "floor: uvloop TCP splice", "splices": 1, "relay_cores": 0.97},
        {"relay": "floor: uvloop TCP splice x2", "splices": 2, "relay_cores": 1.9},
        {"relay": "floor: uvloop TCP splice x4", "splices": 4, "relay_cores": 0.26},
        {"relay": "specproxy --workers 4", "workers": 4, "relay_cores": 0.26},  # not a splice: judged elsewhere
        {"relay": "floor: uvloop TCP splice x8", "splices": 8, "relay_cores": None},  # no figure: nothing said
    ]
    (note,) = splice_notes(sat)
    assert note.startswith("floor: uvloop TCP splice x4: its 4 processes used 0.26 cores") and "--floors" in note
    assert splice_notes(sat[:2]) == []


def test_a_row_without_a_window_is_named_in_a_note() -> None:
    sat = [_row(None, 0, 2e6, has_window=False), _row(1, 3e6, 2.5e6)]
    note = compare_saturation(sat)
    assert note is not None and "for direct (" in note and "--saturation-tokens" in note


def test_with_owners_the_window_ends_when_the_first_relay_has_relayed_all_its_streams() -> None:
    """Relay 1 holds streams of ports 1 and 2 (ending at 300 and 900 ms), relay 2 port 3 (600 ms): the window ends
    at 600 ms, though a stream ended at 300; a stream of no known relay counts as one more relay."""
    part = {**_part(0, [1] * 1000, 100.0, 300.0), "ends": [(1, 300 * MS), (2, 900 * MS), (3, 600 * MS)]}
    assert window([part], {1: 11, 2: 11, 3: 22}) == (100 * MS, 600 * MS)
    assert window([part], {1: 11, 2: 11}) == (100 * MS, 600 * MS)
    assert window([part], {1: 11, 3: 22}) == (100 * MS, 300 * MS)
    got = saturation_window([part], {}, {1: 11, 2: 11, 3: 22})
    assert got is not None and got["s"] == pytest.approx(0.5) and got["streams_by_relay"] == [1, 2]
