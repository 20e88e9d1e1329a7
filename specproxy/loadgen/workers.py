"""``--workers N``: the run spread over N processes (spawned, each on uvloop), results merged in the parent.

Worker ``w`` runs shard ``w/N`` of this machine's shard (so ``--shard i/M --workers N`` is part ``i + M*w`` of
``M*N``), writes its records to its own part file (``OUT.worker<w>``), and sends progress snapshots and its result to
the parent over one queue. The parent forwards SIGINT / SIGTERM to the workers, waits for them (each stops cleanly and
writes its records), then appends the part files to ``OUT`` in worker order and removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from specproxy.loadgen.progress import ProgressSnapshot, merge
from specproxy.loadgen.runner import DriveResult, LoadSpec, run_shard
from specproxy.serving import stop_signals

EXIT_GRACE_S = 5.0  # how long a worker that exited may take for its result to arrive through the queue


class WorkerError(Exception):
    """A worker process failed; the message says which and why."""


def part_path(out: Path, index: int) -> Path:
    return out.with_name(f"{out.name}.worker{index}")


def _worker(spec: LoadSpec, index: int, q: Any, report: bool) -> None:
    import uvloop

    def reporter(snap: ProgressSnapshot) -> None:
        q.put(("progress", index, snap))

    try:
        result = uvloop.run(run_shard(spec, reporter=reporter if report else None))
        q.put(("result", index, result))
    except KeyboardInterrupt:  # a signal before the run installed its handlers
        q.put(("result", index, DriveResult(lags_s=[], signal=int(signal.SIGINT))))
    except BaseException as e:
        q.put(("error", index, f"{type(e).__name__}: {' '.join(str(e).split())}"))


async def run_workers(
    spec: LoadSpec, workers: int, out: Path, *, on_progress: Callable[[ProgressSnapshot], None] | None = None
) -> DriveResult:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    procs: list[Any] = []
    parts = [part_path(out, w) for w in range(workers)]
    for w in range(workers):
        sub = replace(
            spec,
            shard=spec.shard.sub(w, workers),
            recorder=replace(spec.recorder, record_path=str(parts[w]), rotate_bytes=0),
        )
        p = ctx.Process(target=_worker, args=(sub, w, q, on_progress is not None), name=f"specproxy-worker-{w}")
        p.start()
        procs.append(p)
    loop = asyncio.get_running_loop()
    signalled: list[int] = []

    def forward(signum: int) -> None:
        signalled.append(signum)
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    results: dict[int, DriveResult] = {}
    errors: dict[int, str] = {}
    snaps: dict[int, ProgressSnapshot] = {}
    exited_at: dict[int, float] = {}
    try:
        with stop_signals(forward):
            while len(results) + len(errors) < workers:
                while True:
                    try:
                        kind, w, payload = q.get_nowait()
                    except queue_mod.Empty:
                        break
                    if kind == "progress":
                        snaps[w] = payload
                        if on_progress is not None:
                            on_progress(merge(snaps.values()))
                    elif kind == "result":
                        results[w] = payload
                    else:
                        errors[w] = payload
                now = loop.time()
                for w, p in enumerate(procs):
                    if w in results or w in errors or p.exitcode is None:
                        continue
                    exited_at.setdefault(w, now)
                    if now - exited_at[w] > EXIT_GRACE_S:
                        errors[w] = f"exited with code {p.exitcode} without a result"
                await asyncio.sleep(0.05)
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 10.0)
            if p.is_alive():
                p.kill()
        q.close()
        q.join_thread()
    await asyncio.to_thread(join_parts, parts, out)
    if errors:
        w, msg = sorted(errors.items())[0]
        raise WorkerError(f"worker {w} of {workers} failed: {msg}")
    merged = DriveResult(lags_s=[])
    for w in sorted(results):
        r = results[w]
        merged.lags_s.extend(r.lags_s)
        merged.warmup_sent += r.warmup_sent
        merged.warmup_failed += r.warmup_failed
        merged.conversations_cut += r.conversations_cut
        merged.records_written += r.records_written
        merged.records_dropped += r.records_dropped
        if merged.signal is None:
            merged.signal = r.signal
    if signalled:
        merged.signal = signalled[0]
    return merged


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return b""
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def join_parts(parts: list[Path], out: Path) -> None:
    """Append every worker's part to ``out`` (created 0600, as the sink creates record files), each part starting on a
    line of its own: a worker killed mid-write leaves a partial last line, which readers then skip with a warning
    instead of finding it glued to the next part's first record."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "ab") as dst:
        last = _last_byte(out)
        for part in parts:
            if not part.exists():
                continue
            if last not in (b"", b"\n"):  # the previous part ended mid-line
                dst.write(b"\n")
            with part.open("rb") as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                    last = chunk[-1:]
            part.unlink()
