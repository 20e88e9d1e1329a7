"""One pass over runs: records decoded lean, chunk timelines handled in vectorised batches.

A record is about 2.5 KB of JSON, four fifths of it the chunk timeline (``[[offset_s, tokens], ...]``, ~106 pairs).
Parsing that into Python lists and tuples is most of what reading costs, and the analysis only needs two numbers from
it per chunk. So :func:`decode_line` cuts the timeline out of the line as bytes (a plain byte search: the sink writes
it as one array of number pairs) and parses the rest of the record; :class:`ChunkBatch` then parses the timelines of
a few thousand records at once into one float array and computes inter-step and inter-token gaps with numpy, handing
each accumulator that asked for a record's chunks its share. A line that does not fit the fast path (an old schema, a
hand-edited file, odd values) goes through :func:`specproxy.core.record.parse_line` unchanged, so every line reads as
it always did. Memory is bounded by the batch size, never by the number of records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import orjson

from specproxy.analysis.sketch import FloatArray
from specproxy.core.record import Record, RecordError, as_record, parse_line, upgrade
from specproxy.core.stats import decode_tok_s

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

    def full(self) -> Record:
        """The whole record, its chunk timeline typed as :func:`specproxy.core.record.as_record` types it."""
        rec = Record(**self.rec)
        rec["chunks"] = _typed_chunks(self.seg) if self.seg else []
        return rec


def _typed_chunks(seg: bytes) -> list[tuple[float, int]]:
    return as_record({"request_id": "-", "chunks": orjson.loads(seg)})["chunks"]


def _fallback(line: bytes) -> Item | None:
    rec = parse_line(line)
    return None if rec is None else item_of(rec)


def item_of(rec: Record) -> Item:
    """An in-memory record as the stream would hand it on (its chunks moved out)."""
    chunks = rec["chunks"]
    lean = Record(**{**rec, "chunks": []})
    return _with_rates(lean, orjson.dumps(chunks) if chunks else b"", chunks)


def _with_rates(rec: Record, seg: bytes, chunks: Sequence[tuple[float, int]] | None) -> Item:
    tok_s, tpot_s = rec["decode_tok_s"], rec["tpot_s"]
    if (tok_s is None or tpot_s is None) and seg:
        if chunks is None:
            chunks = _typed_chunks(seg)
        rate = decode_tok_s(chunks)
        if tok_s is None:
            tok_s = rate
        if tpot_s is None:
            tpot_s = 1.0 / rate if rate else None
    return Item(rec, seg, tok_s, tpot_s)


def decode_line(line: bytes) -> Item | None:
    """One line; None when blank. Raises as :func:`parse_line` does."""
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
    def add_gaps(self, step: FloatArray, token: FloatArray, weight: FloatArray) -> None:
        """Inter-step gaps, inter-token gaps and their weights (the tokens each gap brought)."""


class StepSink(Protocol):
    def add_steps(self, sizes: Mapping[int, int]) -> None:
        """Decode steps after the first, by tokens per step."""


class ChunkBatch:
    """Chunk timelines waiting to be parsed together; :meth:`flush` hands every sink its records' gaps and steps."""

    def __init__(self, size: int = BATCH) -> None:
        self.size = size
        self._segs: list[bytes] = []
        self._gap_sinks: dict[int, tuple[GapSink, list[int]]] = {}
        self._step_sinks: dict[int, tuple[StepSink, list[int]]] = {}

    def add(self, seg: bytes, gaps: Sequence[GapSink] = (), steps: Sequence[StepSink] = ()) -> None:
        if not seg or not (gaps or steps):
            return
        i = len(self._segs)
        self._segs.append(seg)
        for s in gaps:
            self._gap_sinks.setdefault(id(s), (s, []))[1].append(i)
        for t in steps:
            self._step_sinks.setdefault(id(t), (t, []))[1].append(i)
        if len(self._segs) >= self.size:
            self.flush()

    def _parse(self) -> tuple[FloatArray, FloatArray, np.ndarray]:
        segs = self._segs
        pairs = np.fromiter((s.count(b"[") - 1 for s in segs), dtype=np.int64, count=len(segs))
        flat = orjson.loads(b"[" + b",".join(segs).translate(None, b"[]") + b"]")
        if len(flat) != 2 * int(pairs.sum()):
            return self._parse_slowly()
        arr = np.asarray(flat, dtype=np.float64).reshape(-1, 2)
        return arr[:, 0], np.trunc(arr[:, 1]), np.repeat(np.arange(len(segs)), pairs)

    def _parse_slowly(self) -> tuple[FloatArray, FloatArray, np.ndarray]:
        # Odd pairs ([t], [t, n, x]): type each timeline as the record reader does.
        ts: list[float] = []
        ns: list[float] = []
        rid: list[int] = []
        for i, seg in enumerate(self._segs):
            for t, n in _typed_chunks(seg):
                ts.append(t)
                ns.append(float(n))
                rid.append(i)
        return np.array(ts, dtype=np.float64), np.array(ns, dtype=np.float64), np.array(rid, dtype=np.int64)

    def flush(self) -> None:
        if not self._segs:
            return
        t, n, rid = self._parse()
        keep = n > 0  # only chunks that carried tokens are steps
        t, n, rid = t[keep], n[keep], rid[keep]
        same = rid[1:] == rid[:-1]  # a gap opens at every step after a record's first
        gap = np.maximum(0.0, t[1:] - t[:-1])[same]
        n1 = n[1:][same]
        grid = rid[1:][same]
        token = gap / n1
        mask = np.zeros(len(self._segs), dtype=bool)
        for sink, idx in self._gap_sinks.values():
            mask[:] = False
            mask[idx] = True
            m = mask[grid]
            sink.add_gaps(gap[m], token[m], n1[m])
        for steps_sink, idx in self._step_sinks.values():
            mask[:] = False
            mask[idx] = True
            sizes = n1[mask[grid]].astype(np.int64)
            steps_sink.add_steps({size: k for size, k in enumerate(np.bincount(sizes).tolist()) if k})
        self._segs = []
        self._gap_sinks = {}
        self._step_sinks = {}
