"""Live progress: per-workload counters updated once per finished request, and a one-line display on stderr.

No per-chunk work: a request adds to its workload's counters when it ends; acceptance comes from the recorder's own
per-workload totals. Snapshots are plain dicts so worker processes can send them to the parent, which merges them.
On a terminal the display is a table (``live_table``); the line is for logs (``--progress`` without a terminal).
Either is redrawn about twice a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TextIO

from specproxy.attribution.counts import SpecCounts
from specproxy.core.figures import acceptance_rate

# workload -> {"done", "ok", "errors", "tokens", "accepted", "draft_tokens", "in_flight", "ttft_sum", "ttft_n"}
ProgressSnapshot = dict[str, dict[str, float]]
_FIELDS = ("done", "ok", "errors", "tokens", "accepted", "draft_tokens", "in_flight", "ttft_sum", "ttft_n")


class Progress:
    def __init__(self, workloads: Iterable[str]) -> None:
        self._counts: dict[str, dict[str, float]] = {w: dict.fromkeys(_FIELDS, 0.0) for w in workloads}

    def started(self, workload: str) -> None:
        self._counts.setdefault(workload, dict.fromkeys(_FIELDS, 0.0))["in_flight"] += 1

    def finished(self, workload: str, ok: bool, tokens: int, ttft_s: float | None = None) -> None:
        c = self._counts.setdefault(workload, dict.fromkeys(_FIELDS, 0.0))
        c["done"] += 1
        c["in_flight"] = max(0.0, c["in_flight"] - 1)
        c["ok" if ok else "errors"] += 1
        c["tokens"] += tokens
        if ttft_s is not None:
            c["ttft_sum"] += ttft_s
            c["ttft_n"] += 1

    def snapshot(self, spec: Mapping[str, SpecCounts] | None = None) -> ProgressSnapshot:
        """The counters, with accepted / draft tokens taken from ``spec`` (the recorder's ``workload_spec``)."""
        out: ProgressSnapshot = {}
        for w, c in self._counts.items():
            s = dict(c)
            acc = spec.get(w, SpecCounts()) if spec else SpecCounts()
            s["accepted"] = float(acc.accepted)
            s["draft_tokens"] = float(acc.draft_tokens)
            out[w] = s
        return out


def merge(snapshots: Iterable[ProgressSnapshot]) -> ProgressSnapshot:
    out: ProgressSnapshot = {}
    for snap in snapshots:
        for w, c in snap.items():
            acc = out.setdefault(w, dict.fromkeys(_FIELDS, 0.0))
            for k in _FIELDS:
                acc[k] += c.get(k, 0.0)
    return out


def render(snap: ProgressSnapshot, elapsed_s: float, *, total: int | None, duration_s: float | None) -> str:
    """One line: overall done/total, req/s, tok/s, then each workload's done, tok/s and acceptance."""
    done = sum(c["done"] for c in snap.values())
    tokens = sum(c["tokens"] for c in snap.values())
    errors = sum(c["errors"] for c in snap.values())
    t = max(elapsed_s, 1e-9)
    if total is not None:
        head = f"{int(done)}/{total}"
    elif duration_s is not None:
        head = f"{int(done)} in {min(elapsed_s, duration_s):.0f}/{duration_s:g} s"
    else:
        head = f"{int(done)}"
    parts = [f"{head} {done / t:.1f} req/s {tokens / t:.0f} tok/s" + (f" {int(errors)} err" if errors else "")]
    for w, c in snap.items():
        rate = acceptance_rate(c["accepted"], c["draft_tokens"])
        acc = f" acc {rate:.2f}" if rate is not None else ""
        parts.append(f"{w} {int(c['done'])} {c['tokens'] / t:.0f} tok/s{acc}")
    return " | ".join(parts)


class ProgressLine:
    """Redraws ``line()`` on ``stream`` every ``interval_s`` while running, if the stream is a terminal."""

    def __init__(
        self, line: Callable[[], str], *, stream: TextIO | None = None, interval_s: float = 0.5, force: bool = False
    ) -> None:
        self._line = line
        self._stream = stream if stream is not None else sys.stderr
        self._interval_s = interval_s
        self.enabled = force or _isatty(self._stream)
        self._task: asyncio.Task[None] | None = None
        self._width = 0

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="specproxy-progress")

    async def _run(self) -> None:
        while True:
            self.draw()
            await asyncio.sleep(self._interval_s)

    def draw(self) -> None:
        text = self._line()
        pad = max(0, self._width - len(text))
        self._width = len(text)
        with contextlib.suppress(OSError, ValueError):
            self._stream.write("\r" + text + " " * pad)
            self._stream.flush()

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self.draw()
        with contextlib.suppress(OSError, ValueError):
            self._stream.write("\n")
            self._stream.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
