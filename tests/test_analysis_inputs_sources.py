"""A run's files and their lines (specproxy.analysis.inputs.sources): rotations oldest first, compressed rotations
read as one stream, several gzip members or zstd frames one after the other, a compressed end cut short warned
about and skipped, a rotation present twice refused."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

from specproxy.analysis.inputs.sources import RunFile, SourceError, file_lines, glob_escape, run_files, run_name

zstandard = pytest.importorskip("zstandard")


def _names(files: list[RunFile]) -> list[tuple[str, int, str]]:
    return [(f.path.name, f.index, f.compression) for f in files]


def test_rotations_are_read_oldest_first_the_current_file_last(tmp_path: Path) -> None:
    for name in ("prod.jsonl", "prod.jsonl.1", "prod.jsonl.2.gz", "prod.jsonl.10.zst", "prod.jsonlx", "other.jsonl"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "prod.jsonl.3").mkdir()  # a folder is no rotation
    assert _names(run_files(tmp_path / "prod.jsonl")) == [
        ("prod.jsonl.10.zst", 10, "zst"),
        ("prod.jsonl.2.gz", 2, "gz"),
        ("prod.jsonl.1", 1, ""),
        ("prod.jsonl", 0, ""),
    ]


def test_one_rotation_named_on_its_own_is_just_that_file(tmp_path: Path) -> None:
    for name in ("prod.jsonl", "prod.jsonl.1", "prod.jsonl.2.gz"):
        (tmp_path / name).write_bytes(b"")
    assert _names(run_files(tmp_path / "prod.jsonl.2.gz")) == [("prod.jsonl.2.gz", 2, "gz")]


def test_rotations_without_the_current_file_still_make_a_run(tmp_path: Path) -> None:
    (tmp_path / "prod.jsonl.1").write_bytes(b"")
    assert _names(run_files(tmp_path / "prod.jsonl")) == [("prod.jsonl.1", 1, "")]


def test_a_directory_reads_every_jsonl_file_with_its_rotations_by_name(tmp_path: Path) -> None:
    for name in ("b.jsonl", "a.jsonl.1.gz", "a.jsonl", "notes.txt", "c.jsonl.2"):
        (tmp_path / name).write_bytes(b"")
    assert [f.path.name for f in run_files(tmp_path)] == ["a.jsonl.1.gz", "a.jsonl", "b.jsonl", "c.jsonl.2"]


def test_a_rotation_present_twice_is_refused(tmp_path: Path) -> None:
    for name in ("prod.jsonl", "prod.jsonl.2", "prod.jsonl.2.gz"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SourceError, match="the same rotation twice"):
        run_files(tmp_path / "prod.jsonl")


def test_nothing_to_read_is_said_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such record file or directory"):
        run_files(tmp_path / "absent.jsonl")
    (tmp_path / "notes.txt").write_bytes(b"")
    with pytest.raises(SourceError, match=r"no \*\.jsonl record files in this directory"):
        run_files(tmp_path)


def test_glob_characters_in_a_name_are_taken_literally(tmp_path: Path) -> None:
    assert glob_escape("a*b?[c]") == "a[*]b[?][[]c]"
    (tmp_path / "run[1].jsonl").write_bytes(b"")
    (tmp_path / "run1.jsonl").write_bytes(b"")
    assert [f.path.name for f in run_files(tmp_path / "run[1].jsonl")] == ["run[1].jsonl"]


def test_run_names_drop_rotation_compression_and_jsonl() -> None:
    assert run_name(Path("x/prod.jsonl.3.gz")) == "prod"
    assert run_name(Path("prod.jsonl")) == "prod"
    assert run_name(Path("prod.log")) == "prod.log"


def _lines(path: Path, index: int = 1, comp: str = "") -> list[tuple[int, bytes, bool]]:
    return list(file_lines(RunFile(path, index, comp)))


def test_lines_are_numbered_and_a_last_line_without_newline_says_so(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_bytes(b"a\nb\n\nc")
    assert _lines(p, 0) == [(1, b"a", True), (2, b"b", True), (3, b"", True), (4, b"c", False)]


def test_several_gzip_members_and_zstd_frames_read_as_one_stream(tmp_path: Path) -> None:
    gz = tmp_path / "r.jsonl.1.gz"
    gz.write_bytes(gzip.compress(b"a\nb") + gzip.compress(b"c\nd\n"))
    assert _lines(gz, 1, "gz") == [(1, b"a", True), (2, b"bc", True), (3, b"d", True)]
    zst = tmp_path / "r.jsonl.2.zst"
    c = zstandard.ZstdCompressor()
    zst.write_bytes(c.compress(b"a\n") + c.compress(b"b\n"))
    assert _lines(zst, 2, "zst") == [(1, b"a", True), (2, b"b", True)]


def test_a_compressed_file_cut_short_keeps_what_it_held_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    whole = gzip.compress(b"".join(b'{"n":%d}\n' % i for i in range(200)))
    p = tmp_path / "r.jsonl.1.gz"
    p.write_bytes(gzip.compress(b"first\n") + whole[: len(whole) // 2])
    with caplog.at_level(logging.WARNING):
        got = _lines(p, 1, "gz")
    assert got[0] == (1, b"first", True) and len(got) >= 2
    assert [n for n, _, _ in got] == list(range(1, len(got) + 1))
    assert "compressed data cut short after line" in caplog.text


def test_a_file_that_is_not_the_compressed_data_its_name_says_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl.1.gz"
    p.write_bytes(b"plain text\n")
    with pytest.raises(SourceError, match="not readable gz data"):
        _lines(p, 1, "gz")
