"""Hand-built SVG charts (specproxy.analysis.html.svg): round ticks that cover the data, one ``class="mark"``
element per drawn value, escaped text, well-formed markup, and "no data" for nothing to draw."""

from __future__ import annotations

import itertools
import math
import xml.etree.ElementTree as ET

import pytest

from specproxy.analysis.html.svg import PALETTE, bar_chart, line_chart, nice_ticks

NS = "{http://www.w3.org/2000/svg}"


def _marks(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)  # well-formed, or this raises
    return [e for e in root.iter() if e.get("class") == "mark"]


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.0, 9.0, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
        (0.0, 23.0, [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]),
        (3.0, 3.0, [2.0, 2.5, 3.0, 3.5, 4.0]),  # one value: a neighbourhood of its own magnitude
        (0.0, 0.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (math.nan, 5.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # not finite: 0 to 1
    ],
)
def test_nice_ticks(lo: float, hi: float, expected: list[float]) -> None:
    assert nice_ticks(lo, hi) == pytest.approx(expected)


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 0.37), (1.0, 1234.0), (-5.0, 17.0), (0.001, 0.002), (250.0, 260.0)])
def test_ticks_cover_the_range_with_steps_of_one_two_or_five(lo: float, hi: float) -> None:
    t = nice_ticks(lo, hi)
    assert len(t) >= 2 and t[0] <= lo and t[-1] >= hi
    step = t[1] - t[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert min(abs(mantissa - m) for m in (1.0, 2.0, 5.0, 10.0)) < 1e-9
    assert all(b - a == pytest.approx(step) for a, b in itertools.pairwise(t))


def test_a_bar_chart_draws_one_bar_per_value_and_skips_missing_ones() -> None:
    svg = bar_chart("speed", "Speed <k>", ["a", "b", "c"], [("k=0", [1.0, None, 3.0]), ("k=3", [2.0, 2.5])], "tok/s")
    marks = _marks(svg)
    assert [m.tag for m in marks] == [f"{NS}rect"] * 4
    assert [m.findtext(f"{NS}title") for m in marks] == ["k=0 / a: 1.0", "k=3 / a: 2.0", "k=3 / b: 2.5", "k=0 / c: 3.0"]
    root = ET.fromstring(svg)
    assert root.get("data-chart") == "speed" and root.findtext(f"{NS}title") == "Speed <k>"
    assert "Speed &lt;k&gt;" in svg


def test_bar_colours_follow_the_given_palette_indices() -> None:
    svg = bar_chart("c", "t", ["a"], [("x", [1.0]), ("y", [2.0])], "v", colors=[3, 10])
    assert [m.get("fill") for m in _marks(svg)] == [PALETTE[3], PALETTE[10 % len(PALETTE)]]


def test_nothing_to_draw_is_said() -> None:
    for svg in (
        bar_chart("e", "t", [], [("x", [1.0])], "v"),
        bar_chart("e", "t", ["a"], [("x", [None])], "v"),
        line_chart("e", "t", [("x", [])], "x", "y"),
        line_chart("e", "t", [("x", [(0.0, 1.0)])], "x", "y", log2_x=True),  # x = 0 has no log
    ):
        assert _marks(svg) == [] and "no data" in svg


def test_a_line_chart_draws_a_path_per_line_points_when_asked_and_whiskers() -> None:
    lines = [("base", [(1.0, 1.0), (2.0, 1.5), (4.0, 1.2)]), ("one", [(2.0, 0.9)])]
    svg = line_chart("l", "t", lines, "load", "speedup", whiskers=[[(2.0, 1.4, 1.6)]], ref_y=1.0, log2_x=True)
    tags = [m.tag.removeprefix(NS) for m in _marks(svg)]
    # a path for each line, the whisker of the first, and a point for the line of one point only
    assert tags == ["path", "line", "path", "circle"]
    assert _marks(svg)[3].findtext(f"{NS}title") == "one: 0.9 at 2"  # the x said as given, not its log
    assert 'stroke-dasharray="4 3"' in svg
    with_markers = line_chart("l", "t", lines, "x", "y", markers=True)
    assert [m.tag.removeprefix(NS) for m in _marks(with_markers)] == [
        "path",
        "circle",
        "circle",
        "circle",
        "path",
        "circle",
    ]


def test_a_step_line_goes_across_then_up() -> None:
    svg = line_chart("s", "t", [("x", [(0.0, 0.0), (1.0, 1.0)])], "x", "y", step=True)
    d = _marks(svg)[0].get("d") or ""
    assert d.startswith("M") and "H" in d and "V" in d and "L" not in d
