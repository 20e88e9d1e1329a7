"""The record sink: a queue drained by one writer task; file writes run in a thread so the event loop never blocks.

A sink that fails (disk full, permissions) never breaks traffic: the failure is counted, logged once per kind and
visible in the metrics, and the records stay queued (up to ``max_queue``) for the next attempt; only past that are
they dropped, and counted. ``healthy`` tells a ``--fail-closed`` proxy to refuse traffic instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path

from specproxy.core.record import Record, dumps

log = logging.getLogger("specproxy.sink")


class RecordSink:
    def __init__(
        self,
        path: Path | None,
        *,
        rotate_bytes: int = 256 * 1024 * 1024,
        keep: int = 10,
        max_queue: int = 1_000_000,
        on_written: Callable[[int], None] | None = None,
        on_dropped: Callable[[int], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.rotate_bytes = rotate_bytes
        self.keep = keep
        self.max_queue = max_queue
        self._queue: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self.healthy = True
        self._last_error: str | None = None
        self._on_written = on_written
        self._on_dropped = on_dropped
        self._on_error = on_error

    @property
    def queued(self) -> int:
        """Records waiting to be written."""
        return len(self._queue)

    async def start(self) -> None:
        if self.path is not None:
            await asyncio.to_thread(self._open_check)
        self._task = asyncio.create_task(self._run(), name="specproxy-sink")

    def _open_check(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab"):
            pass

    def put(self, rec: Record) -> None:
        """Never blocks, never raises: called on the relay's side of the proxy."""
        try:
            line = dumps(rec)
        except Exception:  # a record that cannot be serialised is a bug; it must not break the request
            log.exception("cannot serialise a record")
            self._drop(1)
            return
        if len(self._queue) >= self.max_queue:
            self._drop(1)
            return
        self._queue.append(line)
        self._wake.set()

    def _drop(self, n: int) -> None:
        self.dropped += n
        if self._on_dropped is not None:
            self._on_dropped(n)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = list(self._queue)
                if self.path is None:
                    self._queue.clear()
                    self._count(len(batch))
                    continue
                try:
                    await asyncio.to_thread(self._write, b"".join(batch))
                except OSError as e:
                    self._failed(str(e))
                    if self._closing:
                        return
                    await asyncio.sleep(1.0)  # retry later; records stay queued
                    continue
                for _ in range(len(batch)):
                    self._queue.popleft()
                self._count(len(batch))
                if not self.healthy:
                    log.warning("record sink recovered: %s", self.path)
                    self.healthy = True
                    self._last_error = None
            if self._closing:
                return

    def _count(self, n: int) -> None:
        self.written += n
        if self._on_written is not None:
            self._on_written(n)

    def _failed(self, reason: str) -> None:
        self.errors += 1
        self.healthy = False
        if self._on_error is not None:
            self._on_error()
        if reason != self._last_error:
            log.error("cannot write records to %s: %s (traffic continues; records are queued)", self.path, reason)
            self._last_error = reason

    def _write(self, data: bytes) -> None:
        assert self.path is not None
        if self.rotate_bytes > 0:
            with contextlib.suppress(FileNotFoundError):
                if self.path.stat().st_size + len(data) > self.rotate_bytes and self.path.stat().st_size > 0:
                    self._rotate()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)

    def _rotate(self) -> None:
        assert self.path is not None
        base = str(self.path)
        oldest = Path(f"{base}.{self.keep}")
        with contextlib.suppress(FileNotFoundError):
            oldest.unlink()
        for i in range(self.keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{base}.{i}", f"{base}.{i + 1}")
        os.replace(base, f"{base}.1")

    async def close(self) -> None:
        """Flush everything queued, then stop. Records that still cannot be written are counted as dropped."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._queue:
            self._drop(len(self._queue))
            log.error("%d records could not be written to %s", len(self._queue), self.path)
            self._queue.clear()
