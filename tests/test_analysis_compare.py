"""`specproxy compare`: speedups against the right baseline, medians over repeats with their spread, paired
per-request speedups for replays of one recording."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import typer
from typer.testing import CliRunner

from specproxy.analysis.compare.model import build_comparison
from specproxy.analysis.compare.render import compare_json, compare_tables
from specproxy.commands.analysis import register
from specproxy.core.record import Record
from tests.analysisutil import baseline_records, make_record, write_run


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def spec_run(label: str, step_s: float, workload: str = "chat", n: int = 5, **kw: Any) -> list[Record]:
    # Every step accepts its one draft: 2 tokens per step, so decode tok/s = 2 / step_s (80 tokens over 40 steps).
    return [
        make_record(
            f"{label}-{workload}-{i}", accepted=[1] * 40, k=1, step_s=step_s, label=label, workload=workload, **kw
        )
        for i in range(n)
    ]


def test_speedup_against_the_run_without_speculation() -> None:
    recs = spec_run("MTP-n1", 0.012) + baseline_records(requests=5, step_s=0.01)
    c = build_comparison(recs)
    assert c.baseline == "Base" and "without speculative decoding" in c.baseline_reason
    rows = {r.label: r for r in c.rows}
    assert [r.label for r in c.rows] == ["MTP-n1", "Base"]  # the order the runs were given
    assert rows["Base"].is_baseline and rows["Base"].speedup == pytest.approx(1.0)
    assert rows["Base"].tok_s.value == pytest.approx(100.0)
    assert rows["MTP-n1"].tok_s.value == pytest.approx(2 / 0.012)
    assert rows["MTP-n1"].speedup == pytest.approx((2 / 0.012) / 100.0)
    assert rows["MTP-n1"].acceptance_rate == pytest.approx(1.0)
    assert rows["MTP-n1"].mean_acceptance_length == pytest.approx(2.0)
    assert rows["Base"].acceptance_rate is None
    assert rows["MTP-n1"].paired is None  # different requests: nothing to pair


def test_baseline_given_or_first_label() -> None:
    recs = spec_run("MTP-n1", 0.01) + spec_run("MTP-n3", 0.02)
    c = build_comparison(recs)
    assert c.baseline == "MTP-n1" and "first" in c.baseline_reason
    c = build_comparison(recs, baseline="MTP-n3")
    assert {r.label: r.speedup for r in c.rows} == {"MTP-n1": pytest.approx(2.0), "MTP-n3": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="baseline label 'Base' is not in the runs; labels: MTP-n1, MTP-n3"):
        build_comparison(recs, baseline="Base")


def test_per_workload_rows_and_missing_baseline_workload() -> None:
    recs = (
        baseline_records(requests=3, workload="chat")
        + spec_run("MTP", 0.01, workload="chat")
        + spec_run("MTP", 0.01, workload="code")
    )
    c = build_comparison(recs)
    assert [(r.workload, r.label) for r in c.rows] == [("chat", "Base"), ("chat", "MTP"), ("code", "MTP")]
    rows = {(r.workload, r.label): r for r in c.rows}
    assert rows[("chat", "MTP")].speedup == pytest.approx(2.0)
    assert rows[("code", "MTP")].speedup is None  # no baseline measured for code


def test_repeats_median_and_spread() -> None:
    recs: list[Record] = []
    for rep, step in enumerate((0.01, 0.0125, 0.02)):  # 200, 160, 100 tok/s
        recs += spec_run("MTP", step, n=3, repeat=rep, run_id=f"r{rep}")
    recs += baseline_records(requests=3, step_s=0.01)
    row = next(r for r in build_comparison(recs).rows if r.label == "MTP")
    assert row.tok_s.value == pytest.approx(160.0)
    assert (row.spread_kind, row.spread_lo, row.spread_hi) == ("repeats", pytest.approx(100.0), pytest.approx(200.0))
    assert row.speedup == pytest.approx(1.6)
    base = next(r for r in build_comparison(recs).rows if r.label == "Base")
    assert base.spread_kind == "requests"


def test_paired_speedups_for_replays_of_one_recording() -> None:
    base = [make_record(f"b{i}", plain_steps=10, label="Base", replay_of=f"rec-{i}", step_s=0.01) for i in range(11)]
    # Request i accepts i of its 10 drafts: (10 + i) tokens in 100 ms, so its speedup is 1 + i / 10.
    spec = [
        make_record(f"s{i}", accepted=[1] * i + [0] * (10 - i), k=1, label="MTP", replay_of=f"rec-{i}", step_s=0.01)
        for i in range(11)
    ]
    row = next(r for r in build_comparison(base + spec).rows if r.label == "MTP")
    assert row.paired is not None
    assert row.paired.pairs == 11
    assert row.paired.median == pytest.approx(1.5)
    assert row.paired.p10 == pytest.approx(1.1)
    assert row.paired.p90 == pytest.approx(1.9)
    # The original recording pairs with its replays through its own request id.
    original = [make_record(f"rec-{i}", plain_steps=10, label="Original", step_s=0.01) for i in range(11)]
    row = next(r for r in build_comparison(original + spec).rows if r.label == "MTP")
    assert row.paired is not None and row.paired.pairs == 11


def test_compare_cli_markdown_and_json(tmp_path: Path) -> None:
    a = write_run(tmp_path / "base.jsonl", baseline_records(requests=5, label="Base-FP16"))
    b = write_run(tmp_path / "n3.jsonl", spec_run("MTP-FP16-n3", 0.0125))
    code, md, err = invoke("compare", str(a), str(b), "--format", "md")
    assert code == 0, err
    assert "| workload | configuration | tok/s | p10-p90 | speedup | acceptance |" in md  # the spread says its kind
    assert "| chat | Base-FP16 (baseline) | 100.0 |" in md
    assert "| chat | MTP-FP16-n3 | 160.0 | 160.0-160.0 | 1.60x | 100.0% |" in md
    code, out, _ = invoke("compare", str(a), str(b), "-f", "json", "--baseline", "MTP-FP16-n3")
    assert code == 0
    doc = orjson.loads(out)
    assert (doc["kind"], doc["baseline"], doc["labels"]) == (
        "specproxy.compare",
        "MTP-FP16-n3",
        ["Base-FP16", "MTP-FP16-n3"],
    )
    assert doc["rows"][0]["speedup"] == pytest.approx(100 / 160)
    code, _, err = invoke("compare", str(a), str(b), "--baseline", "nope")
    assert code == 2 and "baseline label 'nope' is not in the runs" in err
    code, _, err = invoke("compare", str(a), "--metric", "fast")
    assert code == 2 and "--metric must be one of decode, output" in err


def test_the_same_requests_pair_without_a_replay() -> None:
    """``matrix`` and ``run`` with one seed send each configuration the same bodies in the same order: those pair,
    whatever each configuration calls its model, and the row says how; bodies that differ do not."""

    def body(i: int, model: str) -> dict[str, object]:
        return {"model": model, "messages": [{"role": "user", "content": f"prompt {i}"}], "max_tokens": 32}

    base = [make_record(f"b{i}", plain_steps=10, label="Base", step_s=0.01, request=body(i, "m")) for i in range(11)]
    spec = [
        make_record(f"s{i}", accepted=[1] * i + [0] * (10 - i), k=1, label="MTP", step_s=0.01, request=body(i, "m-mtp"))
        for i in range(11)
    ]
    other = [
        make_record(f"o{i}", plain_steps=5, label="Other", step_s=0.01, request=body(100 + i, "m")) for i in range(3)
    ]
    c = build_comparison(base + spec + other, baseline="Base")
    rows = {r.label: r for r in c.rows}
    mtp = rows["MTP"]
    assert mtp.paired is not None and mtp.paired.pairs == 11 and mtp.paired_by == "same request"
    assert mtp.paired.median == pytest.approx(1.5)
    assert rows["Other"].paired is None
    text = "\n".join(str(n) for t in compare_tables(c) for n in t.notes)
    assert "by the same workload and request body: 1 row" in text
    assert compare_json(c)["rows"][1]["paired"]["by"] == "same request"


def test_an_acceptance_from_unsettled_counters_shares_is_marked() -> None:
    unsettled = ["partial_drafting", "counters_unsettled"]
    recs = (
        spec_run("ngram-n3", 0.012, source="counters", flags=unsettled)
        + spec_run("ngram-n5", 0.011, source="counters")
        + baseline_records(requests=5, step_s=0.01)
    )
    c = build_comparison(recs)
    rows = {r.label: r for r in c.rows}
    assert (rows["ngram-n3"].unsettled, rows["ngram-n5"].unsettled, rows["Base"].unsettled) == (5, 0, 0)
    table = compare_tables(c)[0]
    cells = {row[1]: row[table.headers.index("acceptance")] for row in table.rows}
    assert cells["ngram-n3"] == "100.0% *" and cells["ngram-n5"] == "100.0%"
    assert any(n.startswith("*: ") and "counters_unsettled" in n for n in table.notes)
    assert [r["acceptance_unsettled"] for r in compare_json(c)["rows"]] == [5, 0, 0]
    plain = compare_tables(build_comparison(spec_run("ngram-n5", 0.011) + baseline_records(requests=5)))[0]
    assert not any(n.startswith("*: ") for n in plain.notes)
