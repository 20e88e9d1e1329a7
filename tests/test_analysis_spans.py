"""The report's "where drafts land": acceptance per span type and output position, pooled and per-request mean
acceptance length (analysis/figures/spans.py, report tables and JSON)."""

from __future__ import annotations

from typing import Any

from specproxy.analysis.report import accum
from specproxy.analysis.report.render import report_json, report_tables
from specproxy.attribution.spans import span_block
from specproxy.core.record import Record
from specproxy.core.spans import SPAN_TYPES
from tests.analysisutil import make_record

CODE, PROSE = SPAN_TYPES.index("code"), SPAN_TYPES.index("prose")


def _with_spans(rec: Record, codes: list[int], *, steps: bool = True) -> Record:
    rec["spans"] = span_block(rec["chunks"], bytes([PROSE, *codes]), chunks_are_steps=steps, spec=rec["spec"])
    return rec


def _records() -> list[Record]:
    # a long reply: 40 code steps accepting 3 of 3, then 10 prose steps accepting 0; a short one: 4 prose steps, 1 each
    long = _with_spans(make_record("a", accepted=[3] * 40 + [0] * 10, k=3), [CODE] * 40 + [PROSE] * 10)
    short = _with_spans(make_record("b", accepted=[1] * 4, k=3), [PROSE] * 4)
    return [long, short]


def test_acceptance_per_span_and_position_and_both_means() -> None:
    report = accum.build_report(_records(), ("workload",))
    (g,) = report.groups
    sp = g.spans
    assert sp is not None
    code, prose = sp.types["code"], sp.types["prose"]
    assert (code.steps, code.accepted, code.draft_tokens, code.basis) == (40, 120, 120, "steps")
    assert code.acceptance_rate == 1.0 and code.mean_acceptance_length == 4.0
    assert (prose.steps, prose.accepted, prose.requests) == (14, 4, 2)
    assert prose.acceptance_rate == 4 / 42
    assert code.token_share == 160 / (160 + 10 + 8)
    # the long reply's first step starts at token 1: steps at 1, 5, ..., 29 lie in bucket 0 (8 of them)
    assert sp.positions["0"].steps == 8 + 4 and list(sp.positions) == ["0", "32", "128"]
    assert sp.mal_pooled == 1 + 124 / 54
    assert sp.mal_per_request == ((1 + 120 / 50) + 2.0) / 2


def test_shared_rows_are_used_only_where_nothing_was_measured() -> None:
    measured, shared = _records()
    other = _with_spans(make_record("c", accepted=[2] * 6, k=3, chunks_are_steps=False), [CODE] * 6, steps=False)
    report = accum.build_report([measured, shared, other], ("workload",))
    sp = report.groups[0].spans
    assert sp is not None
    assert sp.types["code"].basis == "steps" and sp.types["code"].left_out == 1 and sp.types["code"].requests == 2
    alone = accum.build_report([other], ("workload",)).groups[0].spans
    assert alone is not None and alone.types["code"].basis == "shared" and alone.types["code"].accepted == 12


def test_tables_and_json() -> None:
    report = accum.build_report(_records(), ("workload",))
    tables = {t.title: t for t in report_tables(report)}
    where = tables["Where drafts land"]
    rows = {r[1]: r for r in where.rows}
    assert rows["code"][5] == "100.0%" and rows["code"][7] == "measured"
    assert "tokens 0-31" in rows and "tokens 128-511" in rows
    mal = tables["Mean acceptance length: pooled and per request"].rows[0]
    assert mal[2] == f"{1 + 124 / 54:.2f}" and mal[3] == f"{((1 + 120 / 50) + 2.0) / 2:.2f}"
    doc: dict[str, Any] = report_json(report)
    spans = doc["groups"][0]["spans"]
    assert spans["types"]["code"]["acceptance_rate"] == 1.0
    assert spans["mean_acceptance_length"]["requests"] == 2
    assert set(spans["positions"]) == {"0", "32", "128"}


def test_records_without_spans_leave_the_tables_out() -> None:
    report = accum.build_report([make_record("x", accepted=[1, 2], k=3)], ("workload",))
    assert "Where drafts land" not in {t.title for t in report_tables(report)}
    assert report.groups[0].spans is not None and report.groups[0].spans.types == {}
