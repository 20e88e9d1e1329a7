"""SLOs, goodput and chosen percentiles: parsing, the figures, and the report's tables and JSON."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from specproxy.analysis.figures.slo import FigureSpec, Slo, SloSpec, goodput, parse_percentiles, parse_slo
from specproxy.analysis.report.accum import build_report
from specproxy.analysis.report.model import FIGURES
from tests.analysisutil import T0, make_record, write_run
from tests.test_cli import run


def test_parse_slo_any_subset_and_per_workload() -> None:
    spec = parse_slo(["ttft=500ms,tpot=50ms", "code_agent:e2e=30s", "ja_chat:ttft=1.5s,e2e=2m"])
    assert spec is not None and spec.default == Slo(ttft_s=0.5, tpot_s=0.05)
    assert spec.per_workload == {"code_agent": Slo(e2e_s=30.0), "ja_chat": Slo(ttft_s=1.5, e2e_s=120.0)}
    assert spec.for_workload("other") == spec.default and spec.for_workload("code_agent") == Slo(e2e_s=30.0)
    assert parse_slo([]) is None
    assert parse_slo(["tpot=250us"]) == SloSpec(Slo(tpot_s=0.00025))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ttft=fast", "not a duration"),
        ("latency=1s", "TARGET one of ttft, tpot, e2e"),
        ("ttft=1s,ttft=2s", "given twice"),
        ("ttft=0ms", "positive"),
        ("ttft", "TARGET=DURATION"),
    ],
)
def test_parse_slo_errors_name_the_value(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        parse_slo([value])
    assert value in str(e.value)


def test_parse_percentiles() -> None:
    assert parse_percentiles("50,90,99,99.9") == (50, 90, 99, 99.9)
    for bad in ("0", "101", "50,50", "p99", "nan"):
        with pytest.raises(ValueError):
            parse_percentiles(bad)


def test_a_request_meets_the_slo_only_when_ok_and_every_target_holds() -> None:
    slo = Slo(ttft_s=0.1, tpot_s=0.02)
    fast = make_record("a", plain_steps=10, ttft_s=0.05, step_s=0.01)
    slow_first = make_record("b", plain_steps=10, ttft_s=0.2, step_s=0.01)
    slow_tokens = make_record("c", plain_steps=10, ttft_s=0.05, step_s=0.03)
    failed = make_record("d", plain_steps=10, ttft_s=0.05, step_s=0.01, outcome="upstream_error")
    assert [slo.met_by(r) for r in (fast, slow_first, slow_tokens, failed)] == [True, False, False, False]
    assert not Slo(e2e_s=1.0).met_by({**fast, "e2e_s": None})  # a target on a missing figure is not met


def test_goodput_is_good_requests_and_their_tokens_over_the_span() -> None:
    recs = [make_record(f"r{i}", plain_steps=9, ttft_s=0.05 if i % 2 else 0.5, started_at=T0 + i) for i in range(4)]
    # four requests, one per second, each ending 0.05-0.5 s + 9 steps x 10 ms + 1 ms after its start
    gp = goodput(recs, SloSpec(Slo(ttft_s=0.1)))
    span = (T0 + 3 + recs[3]["e2e_s"]) - T0
    assert gp.attainment == 0.5
    assert gp.requests_per_s == pytest.approx(2 / span)
    assert gp.tokens_per_s == pytest.approx(20 / span)  # 10 tokens each
    nobody = goodput(recs, SloSpec(per_workload={"other": Slo(ttft_s=1)}))  # no SLO for this workload
    assert (nobody.attainment, nobody.requests_per_s, nobody.tokens_per_s) == (None, None, None)


def test_default_figures_are_unchanged_and_chosen_ones_replace_them() -> None:
    assert FigureSpec().names == FIGURES
    spec = FigureSpec.with_percentiles((50, 99.9), parse_slo(["ttft=100ms"]))
    assert "ttft_s_p99.9" in spec.names and "ttft_s_p90" not in spec.names and "e2e_s_p99.9" in spec.names
    recs = [make_record(f"r{i}", plain_steps=5, ttft_s=0.05 if i else 0.5, started_at=T0 + i) for i in range(3)]
    g = build_report(recs, ("workload",), spec).groups[0]
    assert g.figure("slo_attainment") == pytest.approx(2 / 3)
    assert g.figure("ttft_s_p99.9") == pytest.approx(0.5, rel=0.01)


def test_report_cli_prints_goodput_and_chosen_percentiles(tmp_path: Path) -> None:
    recs = [make_record(f"r{i}", plain_steps=5, ttft_s=0.05 if i else 0.5, started_at=T0 + i) for i in range(3)]
    path = write_run(tmp_path / "run.jsonl", recs)
    p = run("report", str(path), "--slo", "ttft=100ms", "--percentiles", "50,99.9", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["slo"]["default"] == {"ttft_s": 0.1, "tpot_s": None, "e2e_s": None}
    figs = doc["groups"][0]["figures"]
    assert figs["slo_attainment"]["value"] == pytest.approx(2 / 3) and "ttft_s_p99.9" in figs
    table = run("report", str(path), "--slo", "ttft=100ms", "--percentiles", "50,99.9")
    assert "SLO met" in table.stdout and "TTFT p99.9" in table.stdout and "goodput req/s" in table.stdout
    bad = run("report", str(path), "--slo", "ttft=soon")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "ttft=soon" in bad.stderr


def test_compare_shows_goodput_per_configuration(tmp_path: Path) -> None:
    base = [make_record(f"b{i}", plain_steps=5, ttft_s=0.5, label="Base", started_at=T0 + i) for i in range(3)]
    spec = [make_record(f"s{i}", accepted=[1] * 5, k=1, ttft_s=0.05, label="MTP", started_at=T0 + i) for i in range(3)]
    path = write_run(tmp_path / "both.jsonl", [*base, *spec])
    p = run("compare", str(path), "--slo", "ttft=100ms", "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["label"]: r for r in orjson.loads(p.stdout)["rows"]}
    assert rows["Base"]["slo_attainment"] == 0 and rows["MTP"]["slo_attainment"] == 1
    assert rows["MTP"]["goodput_req_s"] > 0
    table = run("compare", str(path), "--slo", "ttft=100ms")
    assert "SLO met" in table.stdout and "goodput tok/s" in table.stdout
    plain = run("compare", str(path), "--format", "json")
    assert "slo_attainment" not in plain.stdout  # without --slo, as before
