"""Records as a table, for pandas, Polars or DuckDB: one row per request, flat columns, written as a stream.

Parquet goes through pyarrow (``pip install 'specproxy[export]'``), in row groups of :data:`ROW_GROUP` rows, so memory
is one row group whatever the run's size; CSV needs nothing beyond Python. Chunk timings are optional: ``list``
(Parquet only) adds two list columns to each row (``chunk_offsets_s``, ``chunk_tokens``), ``table`` writes a second
file beside the first with one row per chunk (``request_id``, ``chunk``, ``offset_s``, ``tokens``). The IO module of
the export (with :mod:`.inputs.runs` for reading).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from specproxy.analysis.inputs.scan import Item, typed_chunks
from specproxy.core.record import Record

FORMATS = ("parquet", "csv")
CHUNKS = ("none", "list", "table")
ROW_GROUP = 65_536


class ExportError(ValueError):
    """The export cannot be done as asked: one line."""


def _spec(name: str) -> Callable[[Record], Any]:
    return lambda r: r["spec"][name] if r["spec"] is not None else None  # type: ignore[literal-required]


def _overhead(name: str) -> Callable[[Record], Any]:
    return lambda r: r["proxy_overhead_s"][name] if r["proxy_overhead_s"] is not None else None  # type: ignore[literal-required]


def _field(name: str) -> Callable[[Record], Any]:
    return lambda r: r.get(name)


# (column, arrow type name, getter); the order of the table
COLUMNS: tuple[tuple[str, str, Callable[[Record], Any]], ...] = (
    *((n, "string", _field(n)) for n in ("request_id", "upstream_id")),
    ("started_at", "float64", _field("started_at")),
    *((n, "string", _field(n)) for n in ("workload", "label", "run_id")),
    ("repeat", "int64", _field("repeat")),
    *((n, "string", _field(n)) for n in ("method", "path", "model")),
    ("status", "int64", _field("status")),
    ("stream", "bool", _field("stream")),
    *((n, "string", _field(n)) for n in ("outcome", "error", "finish_reason")),
    ("truncated", "bool", _field("truncated")),
    *((n, "int64", _field(n)) for n in ("prompt_tokens", "completion_tokens", "cached_tokens")),
    *((n, "string", _field(n)) for n in ("token_source", "chunk_token_source")),  # chunk_token_source: schema 5
    *((n, "float64", _field(n)) for n in ("ttft_s", "e2e_s", "decode_tok_s", "tpot_s", "upstream_headers_s")),
    *((n, "int64", _field(n)) for n in ("events", "reads", "multi_event_reads", "keepalives")),
    ("buffer_sized_reads", "int64", _field("buffer_sized_reads")),  # record schema 6; null before
    ("chunks_are_steps", "bool", _field("chunks_are_steps")),
    ("flags", "string", lambda r: ",".join(r["flags"])),
    ("proxy_overhead_mean_s", "float64", _overhead("mean")),
    ("proxy_overhead_max_s", "float64", _overhead("max")),
    ("spec_source", "string", _spec("source")),
    *((f"spec_{n}", "float64", _spec(n)) for n in ("accepted", "drafts", "draft_tokens", "k")),
    ("acceptance_rate", "float64", _spec("acceptance_rate")),
    ("mean_acceptance_length", "float64", _spec("mean_acceptance_length")),
    ("spec_per_position", "string", lambda r: orjson.dumps(r["spec"]["per_position"]).decode() if r["spec"] else None),
    ("replay_of", "string", _field("replay_of")),
    ("shadow_of", "string", _field("shadow_of")),  # record schema 7; null before
    ("conversation", "string", _field("conversation")),  # multi-turn runs (record schema 3); null before
    ("turn", "int64", _field("turn")),
    ("engine", "string", _field("engine")),  # record schema 4; null before
)


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ExportError(
            "--format parquet needs pyarrow: pip install 'specproxy[export]' (or use --format csv)"
        ) from None
    return pyarrow


def chunks_path(output: Path) -> Path:
    """Where ``--chunks table`` writes the per-chunk rows: ``x.parquet`` -> ``x.chunks.parquet``."""
    return output.with_name(f"{output.stem}.chunks{output.suffix}")


class _Parquet:
    def __init__(self, path: Path, columns: list[tuple[str, str]]) -> None:
        pa = _pyarrow()
        self.pa = pa
        types = {"string": pa.string(), "float64": pa.float64(), "int64": pa.int64(), "bool": pa.bool_()}
        types |= {"list<float64>": pa.list_(pa.float64()), "list<int64>": pa.list_(pa.int64())}
        self.schema = pa.schema([(n, types[t]) for n, t in columns])
        self.names = [n for n, _ in columns]
        self.writer = pa.parquet.ParquetWriter(str(path), self.schema, compression="zstd")
        self.cols: list[list[Any]] = [[] for _ in columns]

    def add(self, row: list[Any]) -> None:
        for col, v in zip(self.cols, row, strict=True):
            col.append(v)
        if len(self.cols[0]) >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.cols[0]:
            arrays = [self.pa.array(c, type=f.type) for c, f in zip(self.cols, self.schema, strict=True)]
            self.writer.write_table(self.pa.Table.from_arrays(arrays, schema=self.schema))
            self.cols = [[] for _ in self.cols]

    def close(self) -> None:
        self.flush()
        self.writer.close()


class _Csv:
    def __init__(self, path: Path, columns: list[tuple[str, str]]) -> None:
        self.fh = path.open("w", encoding="utf-8", newline="")
        self.out = csv.writer(self.fh)
        self.out.writerow([n for n, _ in columns])

    def add(self, row: list[Any]) -> None:
        self.out.writerow(["" if v is None else v for v in row])

    def close(self) -> None:
        self.fh.close()


def export(items: Iterable[Item], output: Path, fmt: str = "parquet", chunks: str = "none") -> int:
    """Write the items' rows to ``output`` (and the chunk rows beside it with ``chunks="table"``); returns the rows
    written. Raises ExportError for what cannot be done as asked, OSError for files that cannot be written."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if chunks not in CHUNKS:
        raise ExportError(f"--chunks must be one of {', '.join(CHUNKS)}, got {chunks!r}")
    if fmt == "csv" and chunks == "list":
        raise ExportError("--chunks list needs --format parquet (CSV has no list columns); use --chunks table")
    columns = [(n, t) for n, t, _ in COLUMNS]
    if chunks == "list":
        columns += [("chunk_offsets_s", "list<float64>"), ("chunk_tokens", "list<int64>")]
    writer_of = _Parquet if fmt == "parquet" else _Csv
    # written beside the target and renamed at the end: an export that fails leaves no half table behind
    targets = [output, *([chunks_path(output)] if chunks == "table" else [])]
    temps = [t.with_name(f".{t.name}.partial") for t in targets]
    main = writer_of(temps[0], columns)
    chunk_columns = [("request_id", "string"), ("chunk", "int64"), ("offset_s", "float64"), ("tokens", "int64")]
    side = writer_of(temps[1], chunk_columns) if chunks == "table" else None
    n = 0
    try:
        for item in items:
            rec = item.rec
            row = [get(rec) for _, _, get in COLUMNS]
            if chunks != "none":
                timeline = typed_chunks(item.seg) if item.seg else []
                if side is not None:
                    for i, (t, k) in enumerate(timeline):
                        side.add([rec["request_id"], i, t, k])
                else:
                    row += [[t for t, _ in timeline], [k for _, k in timeline]]
            main.add(row)
            n += 1
        main.close()
        if side is not None:
            side.close()
        for temp, target in zip(temps, targets, strict=True):
            os.replace(temp, target)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
    return n
