"""`specproxy report`: figures equal hand-computed truth; repeats give medians and spreads; every format renders;
bad input gives one clear line and exit 2."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from specproxy.analysis.figures.acceptance import pool_acceptance
from specproxy.analysis.html.gather import ChartInput
from specproxy.analysis.inputs.scan import ChunkBatch, item_of
from specproxy.analysis.report.accum import build_report
from specproxy.commands.analysis import register
from specproxy.core.record import Record, parse_line
from tests.analysisutil import T0, make_record, write_run


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def hand_records() -> list[Record]:
    # A: prefill at 50 ms, then steps every 10 ms accepting 2, 0, 1 of k=3 -> chunks of 1, 3, 1, 2 tokens.
    a = make_record("a", accepted=[2, 0, 1], k=3, ttft_s=0.05, step_s=0.01, started_at=T0, counters_accepted_extra=1)
    # B: prefill at 100 ms, then two steps every 20 ms accepting 3 and 3 -> chunks of 1, 4, 4 tokens.
    b = make_record("b", accepted=[3, 3], k=3, ttft_s=0.1, step_s=0.02, started_at=T0 + 1.0, source="server")
    # C failed after 9 s: counted, but kept out of every latency figure.
    c = make_record("c", plain_steps=0, ttft_s=9.0, started_at=T0 + 0.5, outcome="upstream_error")
    return [a, b, c]


def test_report_figures_equal_hand_computed_truth() -> None:
    report = build_report(hand_records())
    assert len(report.groups) == 1
    g = report.groups[0]
    assert dict(g.key) == {"workload": "chat", "label": "MTP-n3"}
    assert (g.requests, g.errors, dict(g.outcomes)) == (3, 1, {"ok": 2, "upstream_error": 1})
    f = g.figure
    assert f("decode_tok_s_p50") == pytest.approx(200.0)  # A: 6 tokens / 30 ms; B: 8 tokens / 40 ms
    # 7 + 9 + 1 tokens from the first start to the last end (C ends at 0.5 + 9.001 s).
    assert f("output_tok_s") == pytest.approx(17 / 9.501)
    assert f("ttft_s_p50") == pytest.approx(0.075)
    assert f("ttft_s_p90") == pytest.approx(0.095)
    assert f("ttft_s_p99") == pytest.approx(0.0995)
    assert f("step_s_p50") == pytest.approx(0.01)
    assert f("step_s_p99") == pytest.approx(0.02)
    # Inter-token gaps: A gives 3 x 3.33 ms, 10 ms, 2 x 5 ms; B gives 8 x 5 ms.
    assert f("itl_s_p50") == pytest.approx(0.005)
    assert f("itl_s_p99") == pytest.approx(0.01 * 0.87 + 0.005 * 0.13)
    assert f("tpot_s_p50") == pytest.approx(0.005)
    assert f("e2e_s_p50") == pytest.approx((0.081 + 0.141) / 2)
    acc = g.acceptance
    assert (acc.accepted, acc.drafts, acc.draft_tokens) == (9, 5, 15)
    assert f("acceptance_rate") == pytest.approx(9 / 15)
    assert f("mean_acceptance_length") == pytest.approx(1 + 9 / 5)
    assert acc.position_rates == pytest.approx((0.8, 0.6, 0.4))
    assert acc.tokens_per_step == {1: 1, 2: 1, 3: 1, 4: 2}
    assert acc.sources == {"chunks": 1, "server": 1}
    assert acc.k == 3
    rec = acc.reconciliation
    assert rec is not None and rec.requests == 1
    assert rec.accepted_gap_pct == pytest.approx(100 / 3)


def test_grouping_by_workload_and_label_keeps_input_order() -> None:
    recs = [
        make_record("1", accepted=[1], k=1, workload="code", label="B"),
        make_record("2", accepted=[1], k=1, workload="chat", label="A"),
        make_record("3", accepted=[1], k=1, workload="code", label="A"),
    ]
    keys = [tuple(v for _, v in g.key) for g in build_report(recs).groups]
    assert keys == [("code", "B"), ("code", "A"), ("chat", "A")]
    assert [tuple(v for _, v in g.key) for g in build_report(recs, ("label",)).groups] == [("B",), ("A",)]
    with pytest.raises(ValueError, match="cannot group by"):
        build_report(recs, ("colour",))


def test_repeats_give_the_median_over_repeats_and_the_spread() -> None:
    recs: list[Record] = []
    # Per repeat every request decodes at 20 tokens / (10 steps * step): 200, 100 and 160 tok/s.
    for rep, step in enumerate((0.01, 0.02, 0.0125)):
        recs += [
            make_record(f"r{rep}-{i}", accepted=[1] * 10, k=1, step_s=step, repeat=rep, run_id=f"run-{rep}")
            for i in range(3)
        ]
    g = build_report(recs).groups[0]
    assert g.repeats == 3
    fig = g.figures["decode_tok_s_p50"]
    assert (fig.value, fig.min, fig.max, fig.n) == (pytest.approx(160.0), pytest.approx(100.0), pytest.approx(200.0), 3)
    step = g.figures["step_s_p50"]
    assert (step.value, step.min, step.max) == (pytest.approx(0.0125), pytest.approx(0.01), pytest.approx(0.02))
    # Acceptance is pooled over every repeat.
    assert g.acceptance.drafts == 90


def test_records_missing_fields_are_tolerated() -> None:
    old = parse_line(
        b'{"schema_version": 1, "request_id": "x", "outcome": "ok", "chunks": [[0.1, 1], [0.2, 2], "junk"]}'
    )
    nonstream = parse_line(
        b'{"request_id": "y", "outcome": "ok", "stream": false, "spec": {"source": null}, "e2e_s": 1.0,'
        b' "ttft_s": "soon", "completion_tokens": true, "flags": "none"}'
    )
    assert old is not None and nonstream is not None
    assert (nonstream["ttft_s"], nonstream["completion_tokens"], nonstream["flags"]) == (None, None, [])
    g = build_report([old, nonstream]).groups[0]
    assert dict(g.key) == {"workload": "default", "label": "(none)"}  # the recorder's workload when none applies
    assert g.figure("decode_tok_s_p50") == pytest.approx(20.0)  # from the chunks: 2 tokens over 100 ms
    assert g.figure("acceptance_rate") is None
    assert g.acceptance.sources == {"none": 1}
    assert pool_acceptance([]).position_rates == ()


def test_in_flight_steps_up_and_down() -> None:
    recs = [
        make_record("a", plain_steps=2, started_at=T0, step_s=0.5),  # ends at 1.051
        make_record("b", plain_steps=2, started_at=T0 + 0.5, step_s=0.5),  # 0.5 .. 1.551
    ]
    charts, batch = ChartInput(("workload", "label")), ChunkBatch()
    for rec in recs:
        charts.add(item_of(rec), batch)
    batch.flush()
    points = charts.in_flight(recs[0]["label"] or "")
    assert [n for _, n in points] == [0, 1, 2, 1, 0]
    assert max(t for t, _ in points) == pytest.approx(1.551)


def test_report_formats(tmp_path: Path) -> None:
    run = write_run(tmp_path / "mtp.jsonl", hand_records())
    code, out, err = invoke("report", str(run))
    assert code == 0, err
    assert "Throughput" in out and "Speculative decoding" in out
    assert "200.0" in out and "60.0%" in out and "0.80 0.60 0.40" in out and "+33.3% (n=1)" in out

    code, md, _ = invoke("report", str(run), "--format", "md")
    assert code == 0
    assert "### Speculative decoding" in md
    assert "| workload | label | requests |" in md and "|---|---|---:|" in md

    code, text, _ = invoke("report", str(run), "-f", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 1
    assert float(rows[0]["decode_tok_s_p50"]) == pytest.approx(200.0)
    assert rows[0]["outcome_upstream_error"] == "1"
    assert float(rows[0]["position_2_rate"]) == pytest.approx(0.4)

    out_file = tmp_path / "report.json"
    code, out, _ = invoke("report", str(run), "-f", "json", "-o", str(out_file))
    assert code == 0 and out == ""
    doc = orjson.loads(out_file.read_bytes())
    assert (doc["kind"], doc["version"], doc["group_by"]) == ("specproxy.report", 1, ["workload", "label"])
    grp = doc["groups"][0]
    assert grp["key"] == {"workload": "chat", "label": "MTP-n3"}
    assert grp["figures"]["ttft_s_p50"]["value"] == pytest.approx(0.075)
    assert grp["acceptance"]["tokens_per_step"] == {"1": 1, "2": 1, "3": 1, "4": 2}
    assert grp["acceptance"]["reconciliation"]["accepted_gap_pct"] == pytest.approx(100 / 3)


def test_unlabelled_records_take_the_run_name(tmp_path: Path) -> None:
    run = write_run(tmp_path / "proxy-night.jsonl", [make_record("a", accepted=[1], k=1, label=None)])
    code, out, _ = invoke("report", str(run), "-f", "json")
    assert code == 0
    assert orjson.loads(out)["groups"][0]["key"]["label"] == "proxy-night"


def test_rotations_and_directories_are_read(tmp_path: Path) -> None:
    write_run(tmp_path / "r.jsonl.1", [make_record("old", accepted=[1], k=1)])
    write_run(tmp_path / "r.jsonl", [make_record("new", accepted=[0], k=1)])
    for target in (tmp_path / "r.jsonl", tmp_path):
        code, out, _ = invoke("report", str(target), "-f", "json")
        assert code == 0
        assert orjson.loads(out)["requests"] == 2


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (lambda p: None, ["{p}/missing.jsonl"], "no such record file or directory"),
        (lambda p: (p / "empty.jsonl").write_bytes(b"\n"), ["{p}/empty.jsonl"], "no records"),
        (lambda p: (p / "d").mkdir(), ["{p}/d"], "no *.jsonl record files"),
        (lambda p: (p / "bad.jsonl").write_bytes(b"{not json\n"), ["{p}/bad.jsonl"], "bad.jsonl:1: not JSON"),
        (lambda p: None, ["{p}/r.jsonl", "--by", "colour"], "--by takes"),
        (lambda p: None, ["{p}/r.jsonl", "--format", "pdf"], "--format must be one of"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, setup: Callable[[Path], object], args: list[str], message: str
) -> None:
    write_run(tmp_path / "r.jsonl", [make_record("a", accepted=[1], k=1)])
    setup(tmp_path)
    code, out, err = invoke("report", *(a.format(p=tmp_path) for a in args))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("specproxy: error: ")
    assert message in err
    assert "Traceback" not in err


def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    (tmp_path / "new.jsonl").write_bytes(orjson.dumps({"schema_version": 99, "request_id": "x"}) + b"\n")
    code, _, err = invoke("report", str(tmp_path / "new.jsonl"))
    assert code == 2
    assert "new.jsonl:1: record schema_version 99 is newer" in err


def test_records_timed_off_the_engines_clock_are_counted_and_told(tmp_path: Path) -> None:
    from specproxy.analysis.inputs.runs import read_runs
    from specproxy.analysis.report.accum import stream_report

    off = ["decode_rate_off_engine"]
    recs = [make_record(f"r{i}", accepted=[1, 2], k=3, flags=off if i < 2 else ()) for i in range(3)]
    run = write_run(tmp_path / "busy.jsonl", recs)
    in_memory = build_report(recs, ("workload",))
    streamed, _ = stream_report(read_runs([run]), ("workload",))
    assert [g.decode_off_engine for g in in_memory.groups] == [g.decode_off_engine for g in streamed.groups] == [2]
    code, out, err = invoke("report", str(run))
    assert code == 0, err
    assert "2 requests' decode tok/s is over 25% off the engine's own timing" in out
    code, out, _ = invoke("report", str(run), "-f", "json")
    assert code == 0 and orjson.loads(out)["groups"][0]["decode_off_engine"] == 2
    clean = write_run(tmp_path / "quiet.jsonl", [make_record("q", accepted=[1], k=3)])
    code, out, _ = invoke("report", str(clean))
    assert code == 0 and "off the engine's own timing" not in out


def test_counters_shares_from_an_unsettled_model_are_counted_and_told(tmp_path: Path) -> None:
    from specproxy.analysis.inputs.runs import read_runs
    from specproxy.analysis.report.accum import stream_report

    flag = ["partial_drafting", "counters_unsettled"]
    recs = [
        make_record(f"r{i}", accepted=[1, 0], k=3, source="counters", flags=flag if i < 2 else ()) for i in range(3)
    ]
    run = write_run(tmp_path / "short.jsonl", recs)
    streamed, _ = stream_report(read_runs([run]), ("workload",))
    assert [g.acceptance.unsettled for g in build_report(recs, ("workload",)).groups] == [2]
    assert [g.acceptance.unsettled for g in streamed.groups] == [2]
    code, out, err = invoke("report", str(run))
    assert code == 0, err
    assert "counters 3 (2 unsettled)" in out and "too few scrape intervals" in out
    code, out, _ = invoke("report", str(run), "-f", "json")
    assert code == 0 and orjson.loads(out)["groups"][0]["acceptance"]["unsettled"] == 2
    settled = write_run(tmp_path / "long.jsonl", [make_record("q", accepted=[1], k=3, source="counters")])
    code, out, _ = invoke("report", str(settled))
    assert code == 0 and "unsettled" not in out
