"""One pass over runs: records decoded lean, chunk timelines handled in vectorised batches.

Most of a record's JSON is its chunk timeline (``[[offset_s, tokens], ...]``, a pair per chunk).
Parsing that into Python lists and tuples is most of what reading costs, and the analysis only needs two numbers from
it per chunk. So :func:`decode_line` cuts the timeline out of the line as bytes (a plain byte search: the sink writes
it as one array of number pairs) and parses the rest of the record; :class:`ChunkBatch` then parses the timelines of
a few thousand records at once into one float array and computes inter-step and inter-token gaps with numpy, handing
each accumulator that asked for a record's chunks its share. A line that does not fit the fast path (an old schema, a
hand-edited file, odd values) goes through :func:`specproxy.core.record.parse_line` unchanged, so every line reads as
it always did. Memory is bounded by the batch size, never by the number of records.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Protocol

import numpy as np
import numpy.typing as npt
import orjson

from specproxy.analysis.figures.records import request_rates
from specproxy.analysis.figures.sketch import FloatArray, Quantiles
from specproxy.core.record import Correction, Record, RecordError, as_record, parse_line, upgrade

_KEY = b'"chunks":['
_NUMERIC = b"0123456789.,eE+-[]"
BATCH = 4096


@dataclass(slots=True)
class Item:
    """One record as the stream hands it on: the record without its chunk list, the chunk list as JSON bytes, and
    the two per-request figures that may need the chunks (decode tok/s and TPOT of records that lack them)."""

    rec: Record
    seg: bytes
    tok_s: float | None
    tpot_s: float | None

    def corrected(self, rec: Record) -> Item:
        """This item with its record corrected (:class:`specproxy.core.record.Reconciler`); the chunks stay."""
        return Item(Record(**{**rec, "chunks": []}), self.seg, self.tok_s, self.tpot_s)

    def full(self) -> Record:
        """The whole record, its chunk timeline typed as :func:`specproxy.core.record.as_record` types it."""
        rec = Record(**self.rec)
        rec["chunks"] = typed_chunks(self.seg) if self.seg else []
        return rec


def typed_chunks(seg: bytes) -> list[tuple[float, int]]:
    return as_record({"request_id": "-", "chunks": orjson.loads(seg)})["chunks"]


def _fallback(line: bytes) -> Item | Correction | None:
    rec = parse_line(line)
    return rec if rec is None or isinstance(rec, Correction) else item_of(rec)


def item_of(rec: Record) -> Item:
    """An in-memory record as the stream would hand it on (its chunks moved out)."""
    chunks = rec["chunks"]
    lean = Record(**{**rec, "chunks": []})
    return _with_rates(lean, orjson.dumps(chunks) if chunks else b"", chunks)


def _with_rates(rec: Record, seg: bytes, chunks: Sequence[tuple[float, int]] | None) -> Item:
    def typed() -> Sequence[tuple[float, int]]:
        if chunks is not None:
            return chunks
        return typed_chunks(seg) if seg else []

    tok_s, tpot_s = request_rates(rec, typed)
    return Item(rec, seg, tok_s, tpot_s)


def decode_line(line: bytes) -> Item | Correction | None:
    """One line (a record, or a correction of an earlier one); None when blank. Raises as :func:`parse_line` does."""
    start = line.find(_KEY)
    if start < 0:
        return _fallback(line)
    after = start + len(_KEY)
    if line[after : after + 1] == b"]":
        seg, end = b"", after + 1
    else:
        close = line.find(b"]]", after)
        if close < 0:
            return _fallback(line)
        end = close + 2
        seg = line[after - 1 : end]
        if seg.translate(None, _NUMERIC) or seg.count(b",") != 2 * (seg.count(b"[") - 1) - 1:
            return _fallback(line)  # anything but [number, number] pairs: typed the slow way
    if line[end : end + 1] == b",":
        head = line[:start] + line[end + 1 :]
    elif line[start - 1 : start] == b",":
        head = line[: start - 1] + line[end:]
    else:
        return _fallback(line)
    try:
        obj = orjson.loads(head)
    except orjson.JSONDecodeError:
        return _fallback(line)
    if not isinstance(obj, dict) or "request_id" not in obj or "chunks" in obj:
        return _fallback(line)
    try:
        rec = as_record(upgrade(obj))
    except RecordError:
        return _fallback(line)
    return _with_rates(rec, seg, None)


# -- chunk timelines in batches ------------------------------------------------------------------------------------
class GapSink(Protocol):
    def gap_targets(self) -> tuple[Quantiles, Quantiles | None]:
        """Where inter-step gaps go, and inter-token gaps (weighted by the tokens each gap brought), if wanted."""


class StepSink(Protocol):
    def add_steps(self, sizes: Mapping[int, int]) -> None:
        """Decode steps after the first, by tokens per step."""


Assign = list[tuple[int, list[int]]]  # (sink number, indexes of the batch's records that go to it)


class ChunkWork:
    """The arithmetic on batches of timelines, with an accumulator per sink number: run in the reading process, or
    in a second one (:class:`ChunkBatch` with ``parallel``) while the first reads on."""

    def __init__(self) -> None:
        self.gaps: dict[int, tuple[Quantiles, Quantiles | None]] = {}
        self.steps: dict[int, Counter[int]] = {}

    def process(self, segs: list[bytes], gaps: Assign, itl: set[int], steps: Assign) -> None:
        t, n, rid = _parse(segs)
        keep = n > 0  # only chunks that carried tokens are steps
        t, n, rid = t[keep], n[keep], rid[keep]
        same = rid[1:] == rid[:-1]  # a gap opens at every step after a record's first
        gap = np.maximum(0.0, t[1:] - t[:-1])[same]
        n1 = n[1:][same]
        grid = rid[1:][same]
        token = gap / n1
        mask = np.zeros(len(segs), dtype=bool)
        for sid, idx in gaps:
            mask[:] = False
            mask[idx] = True
            m = mask[grid]
            acc = self.gaps.get(sid)
            if acc is None:
                acc = self.gaps[sid] = (Quantiles(), Quantiles() if sid in itl else None)
            acc[0].add_many(gap[m])
            if acc[1] is not None:
                acc[1].add_many(token[m], n1[m])
        for sid, idx in steps:
            mask[:] = False
            mask[idx] = True
            sizes = np.bincount(n1[mask[grid]].astype(np.int64)).tolist()
            self.steps.setdefault(sid, Counter()).update({size: k for size, k in enumerate(sizes) if k})


def _parse(segs: list[bytes]) -> tuple[FloatArray, FloatArray, npt.NDArray[np.int64]]:
    pairs = np.fromiter((s.count(b"[") - 1 for s in segs), dtype=np.int64, count=len(segs))
    flat = orjson.loads(b"[" + b",".join(segs).translate(None, b"[]") + b"]")
    if len(flat) == 2 * int(pairs.sum()):
        arr = np.asarray(flat, dtype=np.float64).reshape(-1, 2)
        return arr[:, 0], np.trunc(arr[:, 1]), np.repeat(np.arange(len(segs)), pairs)
    # Odd pairs ([t], [t, n, x]): type each timeline as the record reader does.
    ts: list[float] = []
    ns: list[float] = []
    rid: list[int] = []
    for i, seg in enumerate(segs):
        for t, n in typed_chunks(seg):
            ts.append(t)
            ns.append(float(n))
            rid.append(i)
    return np.array(ts, dtype=np.float64), np.array(ns, dtype=np.float64), np.array(rid, dtype=np.int64)


def _worker(conn: Connection) -> None:
    work = ChunkWork()
    while (msg := conn.recv()) is not None:
        work.process(*msg)
    conn.send((work.gaps, work.steps))
    conn.close()


class ChunkBatch:
    """Chunk timelines waiting to be parsed together. :meth:`flush` at the end hands every sink what its records'
    chunks add up to. With ``parallel`` the arithmetic runs in a second process, fed batch by batch through a pipe,
    while this one goes on reading: the two halves of the work take about the same time."""

    def __init__(self, size: int = BATCH, *, parallel: bool = False) -> None:
        self.size = size
        self._segs: list[bytes] = []
        self._gaps: dict[int, list[int]] = {}
        self._steps: dict[int, list[int]] = {}
        self._gap_sinks: dict[int, GapSink] = {}
        self._step_sinks: dict[int, StepSink] = {}
        self._itl: set[int] = set()
        self._work = ChunkWork()
        self._conn: Connection | None = None
        self._proc: BaseProcess | None = None
        if parallel:
            # fork: the reading process has no threads, and a forked child needs no importable __main__
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            ctx = multiprocessing.get_context(method)
            self._conn, child = ctx.Pipe()
            self._proc = ctx.Process(target=_worker, args=(child,), daemon=True)  # type: ignore[attr-defined]
            self._proc.start()
            child.close()

    def add(self, seg: bytes, gaps: Sequence[GapSink] = (), steps: Sequence[StepSink] = ()) -> None:
        if not seg or not (gaps or steps):
            return
        i = len(self._segs)
        self._segs.append(seg)
        for g in gaps:
            sid = id(g)
            if sid not in self._gap_sinks:
                self._gap_sinks[sid] = g
                if g.gap_targets()[1] is not None:
                    self._itl.add(sid)
            self._gaps.setdefault(sid, []).append(i)
        for t in steps:
            self._step_sinks.setdefault(id(t), t)
            self._steps.setdefault(id(t), []).append(i)
        if len(self._segs) >= self.size:
            self._send()

    def _send(self) -> None:
        if not self._segs:
            return
        msg = (self._segs, list(self._gaps.items()), self._itl, list(self._steps.items()))
        if self._conn is not None:
            try:
                self._conn.send(msg)
            except OSError:
                raise RuntimeError("the chunk worker process died (out of memory?)") from None
        else:
            self._work.process(*msg)
        self._segs, self._gaps, self._steps = [], {}, {}

    def flush(self) -> None:
        """Process what is pending and deliver every sink its share (and stop the second process, if any)."""
        self._send()
        if self._conn is not None and self._proc is not None:
            self._conn.send(None)
            try:
                self._work.gaps, self._work.steps = self._conn.recv()
            except EOFError:
                raise RuntimeError("the chunk worker process died (out of memory?)") from None
            self._proc.join()
            self._conn.close()
            self._conn = self._proc = None
        for sid, (step, itl) in self._work.gaps.items():
            target_step, target_itl = self._gap_sinks[sid].gap_targets()
            target_step.merge(step)
            if target_itl is not None and itl is not None:
                target_itl.merge(itl)
        for sid, sizes in self._work.steps.items():
            self._step_sinks[sid].add_steps(sizes)
        self._work = ChunkWork()
