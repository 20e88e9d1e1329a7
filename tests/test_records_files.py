"""Reading record files that a write cut short (a crash, a full disk, a copy in progress): the partial line is
skipped with one warning line naming the file, every whole record is read, and any other malformed line is still an
error naming the file and line. Through the library and through the commands a user runs (report, compare, advise,
replay), on real files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from specproxy.core.record import RecordError, dumps, read_records
from tests.analysisutil import baseline_records, profile_records, write_run
from tests.test_cli import run


def _ids(path: Path) -> list[str]:
    return [r["request_id"] for r in read_records(path)]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "specproxy.records"]


def test_a_partial_last_line_is_skipped_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recs = baseline_records(requests=3)
    path = tmp_path / "x.jsonl"
    path.write_bytes(dumps(recs[0]) + dumps(recs[1]) + dumps(recs[2])[:100])
    with caplog.at_level(logging.WARNING):
        assert _ids(path) == [recs[0]["request_id"], recs[1]["request_id"]]
    assert _warnings(caplog) == [f"{path}: skipped a partial last line (a write cut short)"]


def test_a_partial_last_line_cut_inside_a_character(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recs = baseline_records(requests=2, request={"messages": [{"role": "user", "content": "こんにちは" * 10}]})
    line = dumps(recs[1])
    cut = line.index("こ".encode()) + 1  # inside the character's three bytes
    path = tmp_path / "x.jsonl"
    path.write_bytes(dumps(recs[0]) + line[:cut])
    with caplog.at_level(logging.WARNING):
        assert _ids(path) == [recs[0]["request_id"]]
    assert len(_warnings(caplog)) == 1


def test_a_partial_last_line_of_a_rotated_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recs = baseline_records(requests=4)
    path = tmp_path / "x.jsonl"
    Path(f"{path}.1").write_bytes(dumps(recs[0]) + dumps(recs[1])[:80])
    path.write_bytes(dumps(recs[2]) + dumps(recs[3]))
    with caplog.at_level(logging.WARNING):
        assert _ids(path) == [recs[0]["request_id"], recs[2]["request_id"], recs[3]["request_id"]]
    assert _warnings(caplog) == [f"{path}.1: skipped a partial last line (a write cut short)"]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b"{oops\n", r"x\.jsonl:2: not JSON"),
        (b"not json\n", r"x\.jsonl:2: not JSON"),
        (b'{"request_id": "a"}}\n', r"x\.jsonl:2: not JSON"),  # whole, then more
        (b'[{"request_id": "a"\n', r"x\.jsonl:2: not JSON"),  # not an object
        (b'{"request_id": "a", "workload": \xff\xfe\n', r"x\.jsonl:2: not JSON"),  # not UTF-8
        (b'{"request_id": "z", "schema_version": 99}', r"x\.jsonl:2: .*newer"),  # a whole last line, too new
    ],
)
def test_only_a_line_cut_short_is_forgiven(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: bytes, error: str
) -> None:
    recs = baseline_records(requests=3)
    path = tmp_path / "x.jsonl"
    path.write_bytes(dumps(recs[0]) + dumps(recs[1]).rstrip(b"\n") + b"\n" + dumps(recs[2])[:120])
    with caplog.at_level(logging.WARNING):
        assert len(_ids(path)) == 2  # a whole last line without its newline is read; a partial one is skipped
    path.write_bytes(dumps(recs[0]) + bad + (dumps(recs[2])[:120] if bad.endswith(b"\n") else b""))
    with pytest.raises(RecordError, match=error):
        list(read_records(path))


def _cut(path: Path) -> Path:
    """The file as a crash leaves it: its last record cut short."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 150])
    return path


@pytest.mark.parametrize("command", ["report", "compare", "advise"])
def test_analysis_commands_read_a_file_cut_short_with_one_warning_line(tmp_path: Path, command: str) -> None:
    base = _cut(write_run(tmp_path / "base.jsonl", baseline_records(requests=10, label="Base")))
    spec = _cut(write_run(tmp_path / "spec.jsonl", profile_records([0.8, 0.6, 0.4], 3, requests=10)))
    args = {
        "report": ["report", str(spec)],
        "compare": ["compare", str(base), str(spec), "--baseline", "Base"],
        "advise": ["advise", str(spec), "--baseline-run", str(base)],
    }[command]
    p = run(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    read = [f for f in (base, spec) if str(f) in args]
    expected = [f"specproxy: warning: {f}: skipped a partial last line (a write cut short)" for f in read]
    assert sorted(p.stderr.splitlines()) == expected  # one line per file, nothing else
    assert "Traceback" not in p.stderr


def test_replay_reads_a_recording_cut_short(tmp_path: Path) -> None:
    rec = _cut(write_run(tmp_path / "rec.jsonl", baseline_records(requests=3)))
    p = run("replay", str(rec), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o.jsonl"), cwd=tmp_path)
    lines = p.stderr.splitlines()
    assert lines[0] == f"specproxy: warning: {rec}: skipped a partial last line (a write cut short)"
    assert p.returncode == 1 and "cannot reach" in p.stderr  # it got as far as the target: the file was read


def test_a_broken_middle_line_is_still_an_error_on_the_command_line(tmp_path: Path) -> None:
    recs = baseline_records(requests=3)
    path = tmp_path / "x.jsonl"
    path.write_bytes(dumps(recs[0]) + dumps(recs[1]) + dumps(recs[2])[:99])
    p = run("report", str(path), cwd=tmp_path)
    assert p.returncode == 0 and p.stderr.count("\n") == 1 and "partial last line" in p.stderr
    path.write_bytes(dumps(recs[0]) + b"{oops\n" + dumps(recs[1]) + dumps(recs[2])[:99])
    p = run("report", str(path), cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert f"{path}:2: not JSON" in p.stderr


def test_worker_parts_are_joined_on_line_boundaries_into_a_private_file(tmp_path: Path) -> None:
    from specproxy.loadgen.workers import join_parts

    whole = b'{"request_id": "a"}\n'
    parts = [tmp_path / "p0", tmp_path / "p1", tmp_path / "p2"]
    parts[0].write_bytes(whole + b'{"request_id": "cut sh')  # a worker killed mid-write
    parts[1].write_bytes(whole.replace(b"a", b"b") * 3)
    parts[2].write_bytes(b"")
    out = tmp_path / "run.jsonl"
    join_parts(parts, out)
    assert (out.stat().st_mode & 0o777) == 0o600
    assert out.read_bytes().split(b"\n")[:3] == [
        whole.rstrip(),
        b'{"request_id": "cut sh',
        whole.rstrip().replace(b"a", b"b"),
    ]
    assert not any(p.exists() for p in parts)


def test_a_partial_record_an_older_version_glued_to_the_next_is_skipped_and_the_next_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Older versions, restarted after a cut, appended right behind the partial line: ``{partial{whole}``, once or
    several times in a row. The whole record is read, with one warning per line; the library and the commands agree."""
    recs = baseline_records(requests=6)
    path = tmp_path / "x.jsonl"
    path.write_bytes(
        dumps(recs[0])
        + dumps(recs[1])[:150]  # cut short, then the next record appended to it
        + dumps(recs[2])
        + dumps(recs[3])[:90]  # two cuts in a row, then a whole record
        + dumps(recs[4])[:200]
        + dumps(recs[5])
    )
    ids = [r["request_id"] for r in recs]
    with caplog.at_level(logging.WARNING):
        assert _ids(path) == [ids[0], ids[2], ids[5]]
    assert len(_warnings(caplog)) == 2 and all("glued" in w for w in _warnings(caplog))
    p = run("report", str(path), "--format", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("glued") == 2 and "Traceback" not in p.stderr
    # a line damaged otherwise, with a whole record behind it, is still an error
    path.write_bytes(dumps(recs[0]) + b"not json " + dumps(recs[2]))
    with pytest.raises(RecordError, match=r"x\.jsonl:2: not JSON"):
        list(read_records(path))
