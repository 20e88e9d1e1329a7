"""``specproxy export``: Parquet and CSV read back equal to the records; chunk timings as lists or a second table;
row groups bound the memory; what cannot be done is one line."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from analysisutil import make_record, profile_records, write_run
from typer.testing import CliRunner

from specproxy.analysis import export as export_mod
from specproxy.analysis.inputs.runs import read_runs
from specproxy.commands.export import register
from specproxy.core.record import Record


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _records() -> list[Record]:
    recs = profile_records([0.8, 0.6], 2, requests=12, workload="code", repeat=1)
    recs.append(make_record("bad", outcome="upstream_error", plain_steps=0, label=None, flags=["a", "b"]))
    return recs


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run.jsonl", _records())


def test_parquet_round_trip_with_chunk_lists(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_mod, "ROW_GROUP", 5)  # several row groups: the file is written as a stream
    out = tmp_path / "run.parquet"
    code, _, err = invoke(str(run), "-o", str(out), "--chunks", "list")
    assert code == 0, err
    assert "13 requests" in err
    meta = pq.ParquetFile(out).metadata
    assert meta.num_rows == 13 and meta.num_row_groups == 3
    rows = pq.read_table(out).to_pylist()
    recs = [i.full() for i in read_runs([run])]
    for row, rec in zip(rows, recs, strict=True):
        for name in ("request_id", "workload", "label", "outcome", "ttft_s", "e2e_s", "decode_tok_s", "repeat"):
            assert row[name] == rec[name], name  # type: ignore[literal-required]
        assert row["flags"] == ",".join(rec["flags"])
        assert list(zip(row["chunk_offsets_s"], row["chunk_tokens"], strict=True)) == rec["chunks"]
        spec = rec["spec"]
        assert row["spec_accepted"] == (spec["accepted"] if spec else None)
        assert row["acceptance_rate"] == (spec["acceptance_rate"] if spec else None)
    assert rows[-1]["label"] == "run"  # a record without a label takes its run's name, as in every report


def test_chunk_table_and_csv(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.csv"
    code, _, err = invoke(str(run), "-o", str(out), "-f", "csv", "--chunks", "table")
    assert code == 0, err
    recs = [i.full() for i in read_runs([run])]
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in recs]
    assert [float(r["ttft_s"]) for r in rows] == [r["ttft_s"] for r in recs]
    assert rows[-1]["decode_tok_s"] == ""  # null is an empty cell
    with (tmp_path / "run.chunks.csv").open(newline="") as fh:
        chunks = list(csv.DictReader(fh))
    assert [(c["request_id"], float(c["offset_s"]), int(c["tokens"])) for c in chunks] == [
        (r["request_id"], t, n) for r in recs for t, n in r["chunks"]
    ]
    pq_out = tmp_path / "run.parquet"
    assert invoke(str(run), "-o", str(pq_out), "--chunks", "table")[0] == 0
    table = pq.read_table(tmp_path / "run.chunks.parquet")
    assert table.num_rows == len(chunks) and table.column_names == ["request_id", "chunk", "offset_s", "tokens"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-f", "xlsx"], "--format must be one of parquet, csv"),
        (["--chunks", "all"], "--chunks must be one of none, list, table"),
        (["-f", "csv", "--chunks", "list"], "--chunks list needs --format parquet"),
    ],
)
def test_bad_options_are_one_line(run: Path, tmp_path: Path, args: list[str], message: str) -> None:
    code, out, err = invoke(str(run), "-o", str(tmp_path / "x.out"), *args)
    assert code == 2 and out == ""
    assert err.startswith("specproxy: error: ") and err.count("\n") == 1 and message in err


def test_unwritable_output_and_missing_pyarrow(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = invoke(str(run), "-o", str(tmp_path / "no" / "such" / "dir.parquet"))
    assert code == 2 and err.count("\n") == 1 and "cannot write" in err
    code, _, err = invoke(str(run), "-o", str(tmp_path))
    assert code == 2 and "is a directory" in err
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if the extra were not installed
    code, _, err = invoke(str(run), "-o", str(tmp_path / "x.parquet"))
    assert code == 2 and err.count("\n") == 1 and "pip install 'specproxy[export]'" in err
    assert invoke(str(run), "-o", str(tmp_path / "x.csv"), "-f", "csv")[0] == 0  # CSV needs nothing more
