"""The record sink's promises, on real files: an append is all or nothing (a write that fails part way is cut back,
so the retry neither duplicates nor glues), nothing counts as written unless it is in the file, a file cut short by
a crash gets its newline before the next record, memory for unwritten records is bounded in bytes (past it, records
are counted lost), rotation keeps what ``keep`` says and counts every deletion, and record files are created 0600.

The disk filling up is simulated by :class:`DiskFillsUp`, a sink whose ``write(2)`` has room for the file to grow to
so many bytes (a short write at the edge, then ENOSPC), until the test grows it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from pathlib import Path

import orjson
import pytest

from specproxy.core.record import Record, as_record, dumps, read_records, record_files
from specproxy.recorder.sink import RecordSink


def rec(i: int, size: int = 200) -> Record:
    return as_record({"request_id": f"r{i:04d}", "workload": "w", "request": {"prompt": "x" * size}})


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def ids(path: Path) -> list[str]:
    return [orjson.loads(line)["request_id"] for line in lines(path)]


class DiskFillsUp(RecordSink):
    """A disk that holds ``limit`` bytes of the record file (None: no limit): a write reaching it is short, the next
    one fails with ENOSPC; cutting the file back frees the space again. ``cut_fails``: how many cut-backs fail."""

    retry_s = 0.01

    def __init__(self, path: Path, *, limit: int | None, cut_fails: int = 0, **kw: object) -> None:
        super().__init__(path, **kw)  # type: ignore[arg-type]
        self.limit = limit
        self.cut_fails = cut_fails
        self.resting = False  # an append of a single record failed: the writer waits retry_s before the next one

    def _append(self, data: bytes) -> None:
        try:
            super()._append(data)
        except OSError:
            self.resting = data.count(b"\n") == 1
            raise

    def _write(self, fd: int, data: memoryview) -> int:
        if self.limit is None:
            return os.write(fd, data)
        room = self.limit - os.fstat(fd).st_size
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data[:room])

    def _truncate(self, fd: int, size: int) -> None:
        if self.cut_fails:
            self.cut_fails -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super()._truncate(fd, size)


async def until(cond: object, what: str) -> None:
    for _ in range(1000):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize("append_bytes", [1 << 20, 2000])  # one append for the batch, or two records per append
@pytest.mark.parametrize("room", [0, 1, 400, 834, 835, 1668, 2100, 4000])  # records are 834 bytes: in and between
async def test_a_write_cut_short_is_cut_back_and_written_once(tmp_path: Path, room: int, append_bytes: int) -> None:
    path = tmp_path / "r.jsonl"
    sink = DiskFillsUp(path, limit=room)
    sink.append_bytes = append_bytes
    sink.retry_s = 3600  # at rest after the first failure of a single record, until close() wakes it
    await sink.start()
    records = [rec(i) for i in range(12)]
    for r in records:
        sink.put(r)
    await until(lambda: sink.resting, "the writer failed down to one record")
    # while the disk is full: whole lines only, each counted, none twice, as many as fit
    assert path.read_bytes().endswith(b"\n") or path.stat().st_size == 0
    on_disk = ids(path)
    assert on_disk == [r["request_id"] for r in records[: len(on_disk)]]
    assert len(on_disk) == room // len(dumps(records[0]))
    assert sink.written == len(on_disk) and sink.queued == len(records) - len(on_disk)
    assert sink.dropped == 0 and not sink.healthy
    sink.limit = None  # the filesystem grows
    await sink.close()  # the writer tries again at once, and writes everything
    assert ids(path) == [r["request_id"] for r in records]  # exactly one line per record, in order
    assert lines(path) == [dumps(r) for r in records]  # nothing glued, nothing partial
    assert sink.written == len(records) and sink.dropped == 0 and sink.healthy


async def test_a_disk_with_a_little_room_takes_as_many_whole_records_as_fit(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    one = len(dumps(rec(0)))
    sink = DiskFillsUp(path, limit=one * 3 + one // 2)
    sink.retry_s = 3600
    records = [rec(i) for i in range(12)]
    for r in records:  # queued before the writer starts: one append would carry them all
        sink.put(r)
    await sink.start()
    await until(lambda: sink.resting, "the writer failed down to one record")
    assert sink.written == 3
    assert lines(path) == [dumps(r) for r in records[:3]]
    await sink.close()  # the disk never grew: the rest is lost, and counted
    assert lines(path) == [dumps(r) for r in records[:3]]
    assert sink.written == 3 and sink.dropped == 9


async def test_a_cut_back_that_fails_is_done_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    sink = DiskFillsUp(path, limit=300, cut_fails=1)
    sink.retry_s = 3600
    await sink.start()
    records = [rec(i) for i in range(5)]
    for r in records:
        sink.put(r)
    await until(lambda: sink.resting, "the writer failed down to one record")
    assert sink.cut_fails == 0 and path.read_bytes() == b""  # the partial bytes left by the first failure are gone
    sink.limit = None
    await sink.close()
    assert lines(path) == [dumps(r) for r in records]
    assert sink.written == 5


async def test_every_record_is_written_or_counted_lost(tmp_path: Path) -> None:
    """Records put while the disk is full, some past the byte bound: written + dropped is what was put, and the
    file holds exactly the written ones."""
    path = tmp_path / "r.jsonl"
    one = len(dumps(rec(0)))
    sink = DiskFillsUp(path, limit=one * 2 + 10, max_pending_bytes=one * 4)
    await sink.start()
    records = [rec(i) for i in range(20)]
    for r in records[:10]:
        sink.put(r)
        await asyncio.sleep(0)
    await until(lambda: sink.errors >= 1, "the disk filled")
    for r in records[10:]:
        sink.put(r)
    assert sink.queued_bytes <= one * 4
    sink.limit = None
    await until(lambda: sink.queued == 0, "the queue drained")
    await sink.close()
    on_disk = ids(path)
    assert len(on_disk) == sink.written and len(set(on_disk)) == len(on_disk)
    assert sink.written + sink.dropped == len(records) and sink.dropped > 0
    assert on_disk == sorted(on_disk)  # what was kept is in the order it was put


async def test_each_record_followed_hears_its_fate_once(tmp_path: Path) -> None:
    """``follow``'s acknowledgement is called once per record: True for exactly the records in the file, False for
    every other one (dropped as it was put past the bound, or still queued when the sink closed on a full disk); a
    record ``follow`` gives none to is written all the same. Error listeners hear every failed append."""
    path = tmp_path / "r.jsonl"
    one = len(dumps(rec(0)))
    sink = DiskFillsUp(path, limit=one * 2 + 10, max_pending_bytes=one * 4)
    fates: dict[str, list[bool]] = {}
    sink.follow = lambda r: (
        None if r["request_id"] == "r0030" else (lambda ok, i=r["request_id"]: fates.setdefault(i, []).append(ok))
    )
    failures: list[int] = []
    sink.add_error_listener(lambda: failures.append(sink.errors))
    await sink.start()
    for i in range(10):
        sink.put(rec(i))
        await asyncio.sleep(0)
    await until(lambda: sink.errors >= 1, "the disk filled")
    for i in range(10, 20):
        sink.put(rec(i))  # past the bound: some are dropped as they are put
    sink.limit = None
    await until(lambda: sink.queued == 0, "the queue drained")
    sink.put(rec(30))  # not followed
    await until(lambda: sink.queued == 0, "written")
    sink.limit = sink.written * one  # full again: the next records stay queued until the close drops them
    for i in range(20, 24):
        sink.put(rec(i))
    await until(lambda: len(failures) >= 2, "the disk filled again")
    await sink.close()
    assert all(len(f) == 1 for f in fates.values())
    on_disk = set(ids(path))
    assert "r0030" in on_disk and "r0030" not in fates
    assert {i for i, f in fates.items() if f == [True]} == on_disk - {"r0030"}
    assert {i for i, f in fates.items() if f == [False]} == {f"r{i:04d}" for i in range(24)} - on_disk
    assert {f"r{i:04d}" for i in range(20, 24)} <= {i for i, f in fates.items() if f == [False]}
    assert sink.dropped > 4
    assert failures == list(range(1, sink.errors + 1))


async def test_restart_on_a_file_cut_short_ends_the_partial_line_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.jsonl"
    old = [rec(i) for i in range(3)]
    path.write_bytes(dumps(old[0]) + dumps(old[1]) + dumps(old[2])[:57])  # a crash mid-write
    with caplog.at_level(logging.WARNING):
        sink = RecordSink(path)
        await sink.start()
        new = [rec(i) for i in range(10, 13)]
        for r in new:
            sink.put(r)
        await sink.close()
    got = lines(path)
    assert got[:2] == [dumps(old[0]), dumps(old[1])]
    assert got[2] == dumps(old[2])[:57] + b"\n"  # the partial line ended, not glued to the next record
    assert got[3:] == [dumps(r) for r in new]
    with caplog.at_level(logging.WARNING, logger="specproxy.records"):
        assert [r["request_id"] for r in read_records(path)] == ["r0000", "r0001", "r0010", "r0011", "r0012"]
    assert [r.getMessage() for r in caplog.records if r.name == "specproxy.sink"] == [
        f"{path} ended in a partial line (a write cut short): ended it before appending"
    ]
    assert [r.getMessage() for r in caplog.records if r.name == "specproxy.records"] == [
        f"{path}:3: skipped a partial line (a write cut short, then appended to)"
    ]


async def test_memory_for_unwritten_records_is_bounded_in_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.jsonl"
    bound = 10_000
    sink = DiskFillsUp(path, limit=0, max_pending_bytes=bound)
    await sink.start()
    size = len(dumps(rec(0, 2000)))
    with caplog.at_level(logging.ERROR, logger="specproxy.sink"):
        for i in range(50):
            sink.put(rec(i, 2000))
            assert sink.queued_bytes <= bound
        await until(lambda: sink.errors >= 1, "the write failed")
    kept = bound // size
    assert sink.queued == kept and sink.queued_bytes == kept * size
    assert sink.dropped == 50 - kept
    assert sum("records are being lost" in m for m in caplog.messages) == 1  # one line, not one per record
    await sink.close()  # the disk never came back: what is queued is lost too, and counted
    assert sink.dropped == 50 and sink.written == 0 and sink.queued == 0
    assert path.read_bytes() == b""


async def test_one_record_larger_than_the_bound_is_still_written(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    sink = RecordSink(path, max_pending_bytes=100)
    await sink.start()
    sink.put(rec(0, 5000))
    await sink.close()
    assert sink.written == 1 and sink.dropped == 0 and ids(path) == ["r0000"]


async def _rotating(path: Path, n: int, **kw: object) -> RecordSink:
    deleted: list[int] = []
    sink = RecordSink(path, rotate_bytes=1000, on_deleted=lambda: deleted.append(1), **kw)  # type: ignore[arg-type]
    await sink.start()
    for i in range(n):
        sink.put(rec(i, 600))  # one record per file
        await until(lambda i=i: sink.written == i + 1, "the record written")
    await sink.close()
    assert len(deleted) == sink.files_deleted
    return sink


async def test_rotation_keeps_every_file_by_default(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    sink = await _rotating(path, 14)
    assert sink.files_deleted == 0
    assert len(record_files(path)) == 14
    assert [r["request_id"] for r in read_records(path)] == [f"r{i:04d}" for i in range(14)]


async def test_rotation_keep_deletes_the_oldest_logs_and_counts_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.jsonl"
    with caplog.at_level(logging.WARNING, logger="specproxy.sink"):
        sink = await _rotating(path, 9, keep=3)
    assert sorted(os.listdir(tmp_path)) == ["r.jsonl", "r.jsonl.1", "r.jsonl.2", "r.jsonl.3"]
    assert sink.files_deleted == 9 - 4
    deletions = [m for m in caplog.messages if m.startswith("deleted ")]
    assert len(deletions) == 5 and all("r.jsonl.3" in m and "--rotate-keep 3" in m for m in deletions)
    assert [r["request_id"] for r in read_records(path)] == [f"r{i:04d}" for i in range(5, 9)]


async def test_record_files_are_created_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "sub" / "r.jsonl"
        sink = RecordSink(path, rotate_bytes=1000)
        await sink.start()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # from creation, before any record
        for i in range(3):
            sink.put(rec(i, 600))
            await until(lambda i=i: sink.written == i + 1, "the record written")
        await sink.close()
        assert len(record_files(path)) == 3
        assert {stat.S_IMODE(p.stat().st_mode) for p in record_files(path)} == {0o600}
        # an existing file's mode is its owner's choice: left as it is
        mine = tmp_path / "mine.jsonl"
        mine.touch(0o640)
        mine.chmod(0o640)
        sink = RecordSink(mine)
        await sink.start()
        sink.put(rec(0))
        await sink.close()
        assert stat.S_IMODE(mine.stat().st_mode) == 0o640 and sink.written == 1
    finally:
        os.umask(old)
