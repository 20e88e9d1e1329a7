"""The roofline's rows, table and JSON (specproxy.analysis.roofline.render), on docs/report-json.md's worked
examples: a measurement's own read bytes give its own ceiling, else the estimate from the inputs."""

from __future__ import annotations

import pytest

from specproxy.analysis.roofline.model import roofline
from specproxy.analysis.roofline.render import ROOFLINE_HEADERS, roofline_json, roofline_rows, roofline_tables

DENSE = roofline(27e9, 0.56, 1.7e12)  # 15.1 GB per token, ~112 tok/s
WITH_KV = roofline(27e9, 0.56, 1.7e12, extra_bytes_per_token=4.9e9)  # ~20 GB per token, ~85 tok/s


def test_the_worked_examples() -> None:
    assert DENSE.ceiling_tok_s == pytest.approx(112.4, abs=0.1)
    [row] = roofline_rows(WITH_KV, [("run", 71.0, None)])
    assert row[:3] == ["run", pytest.approx(20.02e9), "estimated"]
    assert (row[3], row[5]) == (pytest.approx(84.9, abs=0.1), pytest.approx(0.836, abs=0.001))
    moe = roofline(30e9, 1.0, 1.275e12, active_params=3e9)
    [row] = roofline_rows(moe, [("moe", 177.0, None)])
    assert (row[3], row[5]) == (pytest.approx(425.0), pytest.approx(177 / 425))


def test_a_measured_read_size_gives_the_rows_own_ceiling() -> None:
    rows = roofline_rows(DENSE, [("a", 50.0, 10e9), ("b", None, None)])
    assert rows[0] == ["a", 10e9, "measured", pytest.approx(170.0), 50.0, pytest.approx(50 / 170)]
    assert rows[1][2:] == ["estimated", pytest.approx(DENSE.ceiling_tok_s), None, None]


def test_without_measurements_one_row_shows_the_ceiling() -> None:
    assert roofline_rows(DENSE, []) == [["", DENSE.bytes_per_token, "estimated", DENSE.ceiling_tok_s, None, None]]


def test_the_json_names_every_column_and_the_inputs() -> None:
    rows = roofline_rows(WITH_KV, [("run", 71.0, None)])
    doc = roofline_json(WITH_KV, rows)
    assert doc["kind"] == "specproxy.roofline"
    assert (doc["params"], doc["active_params"], doc["bytes_per_param"]) == (27e9, 27e9, 0.56)
    assert (doc["extra_bytes_per_token"], doc["bandwidth_bytes_s"]) == (4.9e9, 1.7e12)
    assert list(doc["rows"][0]) == ROOFLINE_HEADERS and doc["rows"][0]["bytes_source"] == "estimated"


def test_the_table_says_where_the_bytes_came_from_and_that_speculation_may_pass_100_percent() -> None:
    [t] = roofline_tables(WITH_KV, roofline_rows(WITH_KV, [("", 71.0, None), ("m", 200.0, 10e9)]))
    assert [r[0] for r in t.rows] == ["-", "m"]
    assert t.rows[0][1] == "20.02 GB (estimated)" and t.rows[1][1] == "10.00 GB (measured)"
    assert "+ 4.9 GB other reads" in t.notes[0]
    assert "can exceed 100%" in t.notes[1]
