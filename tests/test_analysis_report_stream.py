"""Streaming analysis: the one-pass figures equal the in-memory reference (exactly while quantiles are exact, within
the sketch's stated error beyond), rotations and compressed rotations read as one file, cut writes are skipped with a
warning, and bad inputs are one line."""

from __future__ import annotations

import gzip
import itertools
import math
import random
from pathlib import Path

import numpy as np
import orjson
import pytest
import typer
import zstandard
from analysisutil import make_record, profile_records, write_run
from typer.testing import CliRunner

from specproxy.analysis.compare.model import ComparisonBuilder
from specproxy.analysis.figures import sample, sketch
from specproxy.analysis.figures.sketch import RELATIVE_ERROR, DDSketch, Quantiles
from specproxy.analysis.figures.slo import FigureSpec, parse_slo
from specproxy.analysis.html.gather import MAX_TIMELINE_POINTS, ChartInput
from specproxy.analysis.inputs.runs import read_runs
from specproxy.analysis.inputs.scan import ChunkBatch, item_of
from specproxy.analysis.inputs.synth import synth_lines, write_synth
from specproxy.analysis.report.accum import build_report, stream_report
from specproxy.commands.analysis import register
from specproxy.core.record import parse_line, read_records
from specproxy.core.stats import percentile
from tests.reference_report import build_report as reference_report

N = 600


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _figures(report: object) -> list[tuple[tuple[tuple[str, str], ...], str, float | None]]:
    return [(g.key, name, f.value) for g in report.groups for name, f in g.figures.items()]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "prod.jsonl"
    write_synth(path, N, seed=3)
    return path


SPEC = FigureSpec.with_percentiles((50, 90, 99, 99.9), parse_slo(["ttft=200ms,tpot=20ms"]))


def test_streaming_report_equals_the_in_memory_one_exactly(synth_run: Path) -> None:
    old = reference_report(list(read_records(synth_run)), ("workload", "label"), SPEC)
    new, exact = stream_report(read_runs([synth_run]), ("workload", "label"), SPEC)
    assert exact and new.quantiles_exact
    assert [g.key for g in new.groups] == [g.key for g in old.groups]
    assert _figures(new) == _figures(old)
    for a, b in zip(old.groups, new.groups, strict=True):
        assert (a.acceptance, a.outcomes, a.token_sources, a.requests) == (
            b.acceptance,
            b.outcomes,
            b.token_sources,
            b.requests,
        )


def test_sketched_percentiles_stay_within_the_stated_error(synth_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = reference_report(list(read_records(synth_run)), ("workload", "label"), SPEC)
    monkeypatch.setattr(sketch, "EXACT_LIMIT", 50)  # every latency figure of every group goes to the sketch
    new, exact = stream_report(read_runs([synth_run]), ("workload", "label"), SPEC)
    assert not exact
    for (key, name, a), (key2, name2, b) in zip(_figures(old), _figures(new), strict=True):
        assert (key, name) == (key2, name2)
        if a is None or b is None:
            assert a is b
        else:
            assert abs(b - a) <= RELATIVE_ERROR * abs(a) + 1e-12, (key, name, a, b)
    code, out, _ = invoke("report", str(synth_run), "-f", "json")
    doc = orjson.loads(out)
    assert code == 0 and doc["quantiles"] == {"exact": False, "exact_up_to": 50, "relative_error": RELATIVE_ERROR}
    _, text, _ = invoke("report", str(synth_run))
    assert "DDSketch: within 0.5% of the exact figure" in text


def test_quantiles_weighted_exact_and_sketch_merge() -> None:
    rng = random.Random(5)
    values = [rng.lognormvariate(-4, 1.5) for _ in range(3000)] + [0.0] * 40
    weights = [rng.randint(1, 4) for _ in values]
    expanded = [v for v, w in zip(values, weights, strict=True) for _ in range(w)]
    q = Quantiles()
    q.add_many(np.array(values[:1000]), np.array(weights[:1000], dtype=np.float64))
    q.add_many(np.array(values[1000:]), np.array(weights[1000:], dtype=np.float64))
    halves = [Quantiles(limit=100), Quantiles(limit=100)]
    for i, (v, w) in enumerate(zip(values, weights, strict=True)):
        halves[i % 2].add_many(np.array([v]), np.array([float(w)]))
    halves[0].merge(halves[1])
    assert q.exact and not halves[0].exact
    for p in (0, 1, 10, 50, 90, 99, 99.9, 100):
        exact = percentile(expanded, p)
        assert exact is not None
        assert q.percentile(p) == exact
        assert abs(halves[0].percentile(p) - exact) <= RELATIVE_ERROR * exact + 1e-12  # type: ignore[operator]
    one, other, both = DDSketch(), DDSketch(), DDSketch()
    one.add(np.array(values[:100]))
    other.add(np.array(values[100:]))
    both.add(np.array(values))
    one.merge(other)
    assert np.array_equal(one.pos, both.pos) and one.zero == both.zero == 40


def test_negative_and_tiny_values_are_kept() -> None:
    q = Quantiles(limit=1)
    q.add_many(np.array([-2.0, -1.0, 0.0, 1e-12, 3.0]))
    assert not q.exact
    assert math.isclose(q.percentile(0) or 0, -2.0, rel_tol=RELATIVE_ERROR)
    assert q.percentile(50) == 0.0
    assert math.isclose(q.percentile(100) or 0, 3.0, rel_tol=RELATIVE_ERROR)


def test_rotations_and_compressed_rotations_read_as_one_file(tmp_path: Path, synth_run: Path) -> None:
    whole = [r["request_id"] for r in read_records(synth_run)]
    rotated = tmp_path / "prod.jsonl"
    files = write_synth(rotated, N, seed=3, files=4, compress=("gz", "zst", ""))
    assert [f.name for f in files] == ["prod.jsonl.3.gz", "prod.jsonl.2.zst", "prod.jsonl.1", "prod.jsonl"]
    assert [i.rec["request_id"] for i in read_runs([rotated])] == whole
    _, a, _ = invoke("report", str(synth_run), "-f", "json")
    code, b, _ = invoke("report", str(rotated), "-f", "json")
    assert code == 0
    assert {**orjson.loads(a), "inputs": None} == {**orjson.loads(b), "inputs": None}
    # a directory reads each file with its rotations, oldest first; a compressed rotation named alone is one file
    assert [i.rec["request_id"] for i in read_runs([tmp_path])] == whole
    assert [i.rec["request_id"] for i in read_runs([files[1]])] == whole[N // 4 : N // 2]
    assert {i.rec["label"] for i in read_runs([files[0]])} <= {"Base", "MTP-n1", "MTP-n3"}


def test_cut_writes_are_skipped_with_a_warning(tmp_path: Path) -> None:
    lines = list(synth_lines(40, seed=1))
    gz = gzip.compress(b"".join(lines[:20]))
    (tmp_path / "r.jsonl.2.gz").write_bytes(gz[: len(gz) - 200])  # a copy cut short
    (tmp_path / "r.jsonl.1.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[20:30]))[:-150])
    (tmp_path / "r.jsonl").write_bytes(b"".join(lines[30:]) + lines[0][:300])  # a partial last line
    code, out, err = invoke("report", str(tmp_path / "r.jsonl"), "-f", "json")
    assert code == 0
    assert "r.jsonl.2.gz: compressed data cut short" in err
    assert "r.jsonl.1.zst: compressed data cut short" in err
    assert "r.jsonl: skipped a partial last line" in err
    assert 15 <= orjson.loads(out)["requests"] < 40


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"r.jsonl": b"x", "r.jsonl.1": b"", "r.jsonl.1.gz": b""}, "the same rotation twice"),
        ({"r.jsonl": b"", "r.jsonl.1.gz": b"not gzip\n"}, "r.jsonl.1.gz: not readable gz data"),
        ({"r.jsonl": b"", "r.jsonl.1.zst": b"not zstd\n"}, "r.jsonl.1.zst: not readable zst data"),
        ({"r.jsonl": b'{"request_id": "a"}\n{"no": 1}\n'}, "r.jsonl:2: not a specproxy record"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(tmp_path: Path, files: dict[str, bytes], message: str) -> None:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    for cmd in ("report", "compare", "advise"):
        code, out, err = invoke(cmd, str(tmp_path / "r.jsonl"))
        assert code == 2 and out == ""
        assert err.startswith("specproxy: error: ") and err.count("\n") == 1, err
        assert message in err


def test_the_second_process_adds_up_to_the_same(synth_run: Path) -> None:
    inline, _ = stream_report(read_runs([synth_run]), ("workload", "label"), SPEC)
    forked, _ = stream_report(read_runs([synth_run]), ("workload", "label"), SPEC, parallel=True)
    assert _figures(forked) == _figures(inline)
    assert [g.acceptance for g in forked.groups] == [g.acceptance for g in inline.groups]


def test_odd_lines_take_the_slow_path_and_read_the_same() -> None:
    rec = make_record("odd", accepted=[1, 0, 2], k=3)
    line = orjson.dumps({**rec, "chunks": [[0.05, 1], [0.06, 2.0], [0.07, True], [0.08]]})
    item = item_of(parse_line(line))  # type: ignore[arg-type]
    assert item.full()["chunks"] == [(0.05, 1), (0.06, 2)]
    moved = orjson.dumps({"chunks": rec["chunks"], **{k: v for k, v in rec.items() if k != "chunks"}})
    assert item_of(parse_line(moved)).full() == rec  # type: ignore[arg-type]


def _compare(records: list[dict[str, object]]) -> object:
    builder = ComparisonBuilder()
    batch = ChunkBatch()
    for rec in records:
        builder.add(item_of(rec), batch)  # type: ignore[arg-type]
    batch.flush()
    return builder.build("Base")


def test_compare_pairs_survive_key_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    base = profile_records([0.0], 1, requests=60, label="Base", step_s=0.02)
    mtp = [
        {**r, "replay_of": b["request_id"], "request_id": f"x{i}"}
        for i, (r, b) in enumerate(zip(profile_records([0.8], 1, requests=60, label="MTP"), base, strict=True))
    ]
    full = _compare([*base, *mtp])
    row = next(r for r in full.rows if r.label == "MTP")  # type: ignore[attr-defined]
    assert row.paired is not None and row.paired.pairs == 60 and not full.notes  # type: ignore[attr-defined]
    monkeypatch.setattr(sample, "KEY_CAPACITY", 20)
    sampled = _compare([*base, *mtp])
    row = next(r for r in sampled.rows if r.label == "MTP")  # type: ignore[attr-defined]
    # the same requests are kept on both sides, so the sample is of pairs: every kept key pairs up
    assert row.paired is not None and 5 <= row.paired.pairs <= 20
    assert any("sample of requests chosen by hash" in n for n in sampled.notes)  # type: ignore[attr-defined]


def test_in_flight_is_thinned_to_a_bounded_number_of_points() -> None:
    data = ChartInput(("workload", "label"))
    batch = ChunkBatch()
    for i in range(MAX_TIMELINE_POINTS * 2):
        data.add(item_of(make_record(f"r{i}", plain_steps=2, started_at=1000.0 + i * 0.01)), batch)
    points = data.in_flight("MTP-n3")
    assert len(points) <= MAX_TIMELINE_POINTS + 1
    assert max(n for _, n in points) >= 1
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(points))


def test_in_memory_records_and_files_agree(tmp_path: Path) -> None:
    recs = [*profile_records([0.7, 0.5], 2, requests=30), *profile_records([0.0], 1, requests=10, label="Base")]
    write_run(tmp_path / "r.jsonl", recs)
    a = stream_report(item_of(r) for r in recs)[0]
    b = stream_report(read_runs([tmp_path / "r.jsonl"]))[0]
    assert _figures(a) == _figures(b) == _figures(build_report(recs))
