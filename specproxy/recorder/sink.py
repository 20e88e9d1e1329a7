"""The record sink: the one writer of a record file. A queue drained by one writer task; file writes run in a thread
so the event loop never blocks.

What it promises (docs/records.md, "What is written, and when"):

- **Every record put is written exactly once, or counted lost.** An append is all or nothing: the file's size is
  taken before the write, and any failure (a short write, ENOSPC, EIO) cuts the file back to it, so the retry
  neither duplicates a record nor glues one to a partial line. A record counts as written only once all of its bytes
  are in the file. A file that does not end in a newline (a crash cut the last write short) gets one before the
  next append, so the first record after a restart is a line of its own.
- **Memory is bounded in bytes.** Records wait in memory while the file cannot be written, up to
  ``max_pending_bytes``; a record that would go past it is dropped, logged and counted (``dropped``), never queued
  without end. So is every record still unwritten when the sink closes.
- **Retention is a setting.** Rotation keeps ``keep`` rotated files (0: all of them); every file deleted is logged
  and counted (``files_deleted``).
- **Record files are private.** Created 0600; the mode of a file that already exists is left as its owner set it.

A sink that fails never breaks traffic: the failure is counted and logged once per kind, and ``healthy`` tells a
``--fail-closed`` proxy to refuse traffic instead.

Who needs to hear more than the counts says so through two hooks: :attr:`RecordSink.follow` gives a record put an
acknowledgement, called once with True when the record is written or False when it is dropped (the proxy tells each
relay the fate of its own records this way), and :meth:`RecordSink.add_error_listener` hears every failed append.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections import deque
from collections.abc import Callable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from specproxy.core.record import Record

Ack = Callable[[bool], None]


def _correction(written: bool) -> None:
    """What a correction line queues in place of a record's acknowledgement: its fate is counted apart from the
    records' (``corrections``, ``corrections_dropped``), and no relay is told."""


log = logging.getLogger("specproxy.sink")

DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
# One append carries at most this much (and at least one record): a failed append has little to cut back.
APPEND_BYTES = 1024 * 1024
RETRY_S = 1.0
FILE_MODE = 0o600


class RecordSink:
    append_bytes = APPEND_BYTES
    retry_s = RETRY_S

    def __init__(
        self,
        path: Path | None,
        *,
        rotate_bytes: int = 256 * 1024 * 1024,
        keep: int = 0,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        on_written: Callable[[int], None] | None = None,
        on_dropped: Callable[[int], None] | None = None,
        on_error: Callable[[], None] | None = None,
        on_deleted: Callable[[], None] | None = None,
    ) -> None:
        if keep < 0 or max_pending_bytes <= 0:
            raise ValueError("keep must be >= 0 and max_pending_bytes > 0")
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.keep = keep  # rotated files kept; 0 keeps every one
        self.max_pending_bytes = max_pending_bytes
        self._queue: deque[bytes] = deque()
        self._acks: deque[Ack | None] = deque()  # each queued record's acknowledgement, in the queue's order
        # given a record as it is put, what to call once with its fate (True: written; False: dropped), if anything
        self.follow: Callable[[Record], Ack | None] | None = None
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self.written = 0
        self.dropped = 0
        self.corrections = 0  # correction lines written (not records)
        self.corrections_dropped = 0  # lost: their records stay as first written, flagged correction_pending
        self.errors = 0
        self.files_deleted = 0
        self.healthy = True
        self._last_error: str | None = None
        self._overflowing = False
        # The size the file had before an append whose failure could not be cut back: the next append cuts it first.
        self._cut_to: int | None = None
        self._on_written = on_written
        self._on_dropped = on_dropped
        self._on_error: list[Callable[[], None]] = [on_error] if on_error is not None else []
        self._on_deleted = on_deleted

    def add_error_listener(self, listener: Callable[[], None]) -> None:
        """``listener`` is called at every failed append, after the ones already listening."""
        self._on_error.append(listener)

    @property
    def queued(self) -> int:
        """Records waiting to be written."""
        return len(self._queue)

    @property
    def queued_bytes(self) -> int:
        """Bytes of records waiting to be written (at most ``max_pending_bytes``, or one record)."""
        return self._pending_bytes

    async def start(self) -> None:
        if self.path is not None:
            await asyncio.to_thread(self._open_check)
        self._task = asyncio.create_task(self._run(), name="specproxy-sink")

    def _open_check(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))

    def put(self, rec: Record) -> None:
        """Never blocks, never raises: called on the relay's side of the proxy."""
        self._put(rec, self.follow(rec) if self.follow is not None else None)

    def put_correction(self, line: dict[str, Any]) -> None:
        """A correction of a record put before (:func:`specproxy.core.record.correction_line`), written after it in
        the same order; counted apart (``corrections``), never as a record. Never blocks, never raises."""
        self._put(line, _correction)

    def _put(self, rec: Mapping[str, Any], ack: Ack | None) -> None:
        if self._closed:  # nothing will write it any more: a record finished after the end still counts, as lost
            log.error("a record finished after the record sink closed and is lost")
            self._drop(1, ack)
            return
        try:
            line = orjson.dumps(rec) + b"\n"
        except Exception:  # a record that cannot be serialised is a bug; it must not break the request
            log.exception("cannot serialise a record")
            self._drop(1, ack)
            return
        # One record always fits in an empty queue, whatever its size: it is in memory already.
        if self._queue and self._pending_bytes + len(line) > self.max_pending_bytes:
            if not self._overflowing:
                self._overflowing = True
                log.error(
                    "records are being lost: %d bytes of records wait to be written to %s, the most allowed "
                    "(%d); further records are dropped and counted until the queue drains",
                    self._pending_bytes,
                    self.path,
                    self.max_pending_bytes,
                )
            self._drop(1, ack)
            return
        self._queue.append(line)
        self._acks.append(ack)
        self._pending_bytes += len(line)
        self._wake.set()

    def _drop(self, n: int, ack: Ack | None = None) -> None:
        """``n`` records are lost: one being put (its ``ack``), or the queue's remainder at the close."""
        if ack is _correction:
            self.corrections_dropped += 1
            return
        self.dropped += n
        if self._on_dropped is not None:
            self._on_dropped(n)
        if ack is not None:
            ack(False)

    async def _run(self) -> None:
        # Bytes the next append may carry: halved after a failed append of several records, so that a disk with a
        # little room left still takes whole records, as many as fit; doubled back after each success.
        budget = self.append_bytes
        last_try = False  # closing: the one more attempt a record gets after a failure, before it counts as lost
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if self.path is None:
                    self._count(len(self._queue))
                    self._pending_bytes = 0
                    continue
                n, size = self._next_append(budget)
                data = b"".join(islice(self._queue, n))
                try:
                    await asyncio.to_thread(self._append, data)
                except Exception as e:  # OSError mostly; anything else must not kill the writer either
                    if not isinstance(e, OSError):
                        log.exception("writing records to %s failed", self.path)
                    self._failed(str(e))
                    if n > 1:
                        budget = max(1, size // 2)  # fewer records at once, right away
                        continue
                    if self._closing:
                        if last_try:
                            return
                        # an append that failed before (or as) close() was called gets one more try at once: the
                        # disk may have room again, and close() promises a last attempt
                        last_try = True
                        continue
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.retry_s)  # retry later; records stay queued
                    continue
                self._pending_bytes -= size
                self._count(n)
                full = budget >= self.append_bytes
                budget = min(self.append_bytes, budget * 2)
                # recovered once appends of full size succeed again, or nothing is left to write
                if not self.healthy and (full or not self._queue):
                    log.warning("record sink recovered: %s", self.path)
                    self.healthy = True
                    self._last_error = None
            if self._overflowing:
                self._overflowing = False
                log.warning("the record queue has drained: %d records were lost so far", self.dropped)
            if self._closing:
                return

    def _next_append(self, budget: int) -> tuple[int, int]:
        """How many records from the head of the queue the next append carries (at least one), and their bytes."""
        n = size = 0
        for line in self._queue:
            if n and size + len(line) > budget:
                break
            n += 1
            size += len(line)
        return n, size

    def _count(self, n: int) -> None:
        """The ``n`` records at the queue's head are written: off the queue, counted, acknowledged."""
        acks, records = self._acks, 0
        for _ in range(n):
            self._queue.popleft()
            ack = acks.popleft()
            if ack is _correction:
                self.corrections += 1
                continue
            records += 1
            if ack is not None:
                ack(True)
        self.written += records
        if self._on_written is not None and records:
            self._on_written(records)

    def _failed(self, reason: str) -> None:
        self.errors += 1
        self.healthy = False
        for listener in self._on_error:
            listener()
        if reason != self._last_error:
            log.error("cannot write records to %s: %s (traffic continues; records are queued)", self.path, reason)
            self._last_error = reason

    # -- the file (in a worker thread) -----------------------------------------------------------------------------
    def _append(self, data: bytes) -> None:
        """Append ``data`` (whole lines) completely, or leave the file as it was and raise."""
        assert self.path is not None
        fd = self._open()
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a device or a pipe (/dev/stdout): nothing to check or cut back
                self._write_all(fd, data)
                return
            size = self._settle(fd, st.st_size)
            if not (self.rotate_bytes > 0 and size > 0 and size + len(data) > self.rotate_bytes):
                self._append_at(fd, size, data)
                return
        finally:
            os.close(fd)
        self._rotate()
        fd = self._open()
        try:
            self._append_at(fd, os.fstat(fd).st_size, data)
        finally:
            os.close(fd)

    def _open(self) -> int:
        assert self.path is not None
        flags = os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            return os.open(self.path, os.O_RDWR | flags, FILE_MODE)
        except PermissionError:  # write-only for us: appends still work, the last byte cannot be checked
            return os.open(self.path, os.O_WRONLY | flags, FILE_MODE)

    def _settle(self, fd: int, size: int) -> int:
        """The file's good size: an earlier failed append that could not be cut back is cut back now (or this
        append fails too, rather than add records after partial bytes)."""
        if self._cut_to is not None:
            if size > self._cut_to:
                self._truncate(fd, self._cut_to)
                size = self._cut_to
            self._cut_to = None
        return size

    def _append_at(self, fd: int, start: int, data: bytes) -> None:
        ended = start == 0 or self._ends_in_newline(fd, start)
        try:
            self._write_all(fd, data if ended else b"\n" + data)
        except BaseException:
            self._cut_back(fd, start)
            raise
        if not ended:
            log.warning("%s ended in a partial line (a write cut short): ended it before appending", self.path)

    def _ends_in_newline(self, fd: int, size: int) -> bool:
        try:
            return os.pread(fd, 1, size - 1) == b"\n"
        except OSError:  # opened write-only: trust the file
            return True

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._write(fd, view)
            view = view[n:]

    def _write(self, fd: int, data: memoryview) -> int:
        """One ``write(2)``; may write less than asked. The seam the tests fail on purpose."""
        return os.write(fd, data)

    def _truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def _cut_back(self, fd: int, size: int) -> None:
        """Undo a failed append: what it wrote is not a record, and a retry must start where it started."""
        try:
            self._truncate(fd, size)
        except OSError as e:
            self._cut_to = size  # the next append cuts first, and fails rather than append after the partial bytes
            log.error("cannot cut %s back to %d bytes after a failed write: %s", self.path, size, e)

    def _rotate(self) -> None:
        """``PATH`` becomes ``PATH.1``, ``PATH.1`` becomes ``PATH.2``... With ``keep`` N, ``PATH.N`` is deleted first
        (logged and counted); files numbered beyond N (left by a larger ``keep``) are left alone."""
        assert self.path is not None
        base = str(self.path)
        if self.keep:
            oldest = Path(f"{base}.{self.keep}")
            try:
                size = oldest.stat().st_size
                oldest.unlink()
            except FileNotFoundError:
                pass
            else:
                self.files_deleted += 1
                if self._on_deleted is not None:
                    self._on_deleted()
                log.warning("deleted %s (%d bytes): --rotate-keep %d rotated files are kept", oldest, size, self.keep)
        for i in sorted(self._rotated_indexes(), reverse=True):
            if not self.keep or i < self.keep:
                os.replace(f"{base}.{i}", f"{base}.{i + 1}")
        os.replace(base, f"{base}.1")

    def _rotated_indexes(self) -> list[int]:
        assert self.path is not None
        prefix = self.path.name + "."
        return [
            int(p.name[len(prefix) :])
            for p in self.path.parent.glob(prefix + "*")
            if p.name[len(prefix) :].isdigit() and int(p.name[len(prefix) :]) > 0
        ]

    async def close(self) -> None:
        """Flush everything queued, then stop. Records that still cannot be written are counted as dropped."""
        self._closing = True
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._queue:
            self._queue.clear()
            self._pending_bytes = 0
            n = 0
            while self._acks:
                ack = self._acks.popleft()
                if ack is _correction:
                    self._drop(1, ack)
                    continue
                n += 1
                if ack is not None:
                    ack(False)
            if n:
                self._drop(n)
                log.error("%d records could not be written to %s and are lost", n, self.path)
        self._closed = True
