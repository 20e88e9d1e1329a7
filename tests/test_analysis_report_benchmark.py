"""The report benchmark's comparison of two report JSONs (specproxy.analysis.report.benchmark.max_rel_diff): the
largest relative difference of any figure, infinite when the groups or a missing figure differ."""

from __future__ import annotations

import math
from typing import Any

from specproxy.analysis.report.benchmark import max_rel_diff


def _report(*groups: tuple[str, dict[str, float | None]]) -> dict[str, Any]:
    return {"groups": [{"key": k, "figures": {n: {"value": v} for n, v in f.items()}} for k, f in groups]}


def test_equal_reports_differ_by_nothing() -> None:
    a = _report(("chat", {"ttft": 0.5, "tps": None}), ("code", {"ttft": 0.0}))
    assert max_rel_diff(a, a) == 0.0


def test_the_largest_relative_difference_is_relative_to_the_first() -> None:
    a = _report(("chat", {"ttft": 0.5, "tps": 100.0}), ("code", {"ttft": 2.0}))
    b = _report(("chat", {"ttft": 0.51, "tps": 99.0}), ("code", {"ttft": 2.1}))
    assert math.isclose(max_rel_diff(a, b), 0.05)


def test_other_groups_a_figure_missing_on_one_side_or_a_change_from_zero_are_infinite() -> None:
    a = _report(("chat", {"ttft": 0.0, "tps": 1.0}))
    assert max_rel_diff(a, _report(("code", {"ttft": 0.0, "tps": 1.0}))) == math.inf
    assert max_rel_diff(a, _report(("chat", {"ttft": 0.0, "tps": None}))) == math.inf
    assert max_rel_diff(a, _report(("chat", {"ttft": 0.1, "tps": 1.0}))) == math.inf
