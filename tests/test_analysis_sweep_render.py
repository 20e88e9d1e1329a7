"""A sweep's answer and JSON (specproxy.analysis.sweep.render): per level the fastest configuration measurably
faster than the baseline (and, with an SLO, meeting it as often), neighbouring levels with the same answer merged."""

from __future__ import annotations

from specproxy.analysis.figures.confidence import LEVEL, Interval
from specproxy.analysis.figures.slo import Goodput, parse_slo
from specproxy.analysis.sweep.model import Crossover, LevelRow, SweepResult
from specproxy.analysis.sweep.render import answer_lines, best_by_level, ci_json, ci_pct, ci_x, sweep_json

W = "chat"


def _row(label: str, level: float, speedup: float | None, attainment: float | None = None) -> LevelRow:
    ci = None if speedup is None else Interval(speedup - 0.05, speedup + 0.05)
    good = None if attainment is None else Goodput(attainment, None, None)
    return LevelRow(label, W, level, 10, 0, None, 50.0, None, good, None, None, None, speedup, ci, 10)


def _sweep(rows: list[LevelRow], slo: bool = False, crossovers: tuple[Crossover, ...] = ()) -> SweepResult:
    levels = tuple(sorted({r.level for r in rows}))
    labels = tuple(dict.fromkeys(r.label for r in rows))
    spec = parse_slo(["ttft=1s"]) if slo else None
    return SweepResult("concurrency", levels, "base", "no speculation", labels, (W,), tuple(rows), crossovers, spec)


def test_the_fastest_measurably_faster_configuration_per_level_with_neighbours_merged() -> None:
    rows = [_row("base", lv, 1.0) for lv in (1, 2, 4, 8, 16)]
    rows += [_row("k3", 1, 1.8), _row("k3", 2, 1.6), _row("k3", 4, 1.2), _row("k3", 8, 1.0), _row("k3", 16, 0.7)]
    rows += [_row("k5", 1, 1.9), _row("k5", 2, 1.5), _row("k5", 4, 1.01), _row("k5", 8, 0.8), _row("k5", 16, 0.5)]
    assert best_by_level(_sweep(rows), W) == [
        "k5 at 1 streams",
        "k3 at 2-4 streams",
        "base at 8-16 streams",  # k3's 1.00x is not distinguishably faster
    ]


def test_with_an_slo_only_what_meets_it_as_often_as_the_baseline_counts() -> None:
    rows = [_row("base", 1, 1.0, 0.9), _row("k3", 1, 1.5, 0.8), _row("k1", 1, 1.2, 0.95)]
    assert best_by_level(_sweep(rows, slo=True), W) == ["k1 at 1 streams"]
    assert best_by_level(_sweep(rows[:2], slo=True), W) == ["base at 1 streams"]


def test_the_answer_starts_with_the_sweep_and_says_each_crossover_with_its_last_winning_level() -> None:
    rows = [_row("base", 1, 1.0), _row("base", 2, 1.0), _row("k3", 1, 1.4), _row("k3", 2, 0.9)]
    cross = Crossover("k3", W, 1.0, 2.0, rows[3])
    lines = answer_lines(_sweep(rows, crossovers=(cross,)), None)
    assert lines[0] == "Sweep over concurrency 1, 2; baseline base."
    assert lines[1] == "  chat: best measured: k3 at 1 streams; base at 2 streams"
    assert lines[2] == (
        "  chat: k3 beats base up to 1 streams; stops at 2 (0.90x, slower); at 1 streams: 1.40x [1.35-1.45], faster"
    )


def test_intervals_are_said_and_written_the_same_way_everywhere() -> None:
    ci = Interval(0.912, 1.087)
    assert (ci_x(ci), ci_pct(ci), ci_json(ci)) == (
        "0.91-1.09",
        "91.2-108.7%",
        {"lo": 0.912, "hi": 1.087, "level": LEVEL},
    )
    assert (ci_x(None), ci_pct(None), ci_json(None)) == ("-", "-", None)


def test_the_json_marks_the_baseline_and_lists_the_crossovers() -> None:
    rows = [_row("base", 1, 1.0), _row("k3", 1, 1.4)]
    doc = sweep_json(_sweep(rows, crossovers=(Crossover("k3", W, 1.0, None, None),)), None, ["a.jsonl"])
    assert (doc["kind"], doc["inputs"], doc["level_kind"], doc["levels"]) == (
        "specproxy.sweep",
        ["a.jsonl"],
        "concurrency",
        [1],
    )
    assert [r["verdict"] for r in doc["rows"]] == ["baseline", "faster"]
    assert doc["crossovers"] == [{"label": "k3", "workload": W, "beats_up_to": 1.0, "stops_at": None}]
    assert doc["batch"] is None and doc["slo"] is None
