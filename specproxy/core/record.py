"""The per-request record: one JSON object per line, written by the proxy and by ``specproxy run``.

The schema is documented in ``docs/records.md`` and typed here, once: :class:`Record` and the types of its nested
objects. Every record carries ``schema_version``; readers accept every older version by upgrading it through
:data:`_UPGRADES` (one converter per version step), so files written by an older specproxy keep working, and then
:func:`as_record` gives every field its type (a value of the wrong type in a hand-edited or foreign file reads as
missing), so readers use the fields as typed. Pure: :func:`parse_line` takes bytes; the thin file reading is
:func:`read_records`.

The types, the upgrade chain and the typed reader live together because they change together with every schema
version.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NotRequired, TypedDict, TypeVar

import orjson

from specproxy.core.salvage import GLUED, glued_tail

SCHEMA_VERSION = 9
T = TypeVar("T")

OUTCOMES = ("ok", "upstream_error", "upstream_reset", "client_cancelled", "timeout", "proxy_error", "shutdown")
SPEC_SOURCES = ("server", "chunks", "counters")


class Estimate(TypedDict):
    """One source's figure for a request (``SpecEstimate.as_dict``)."""

    accepted: float | None
    drafts: float | None
    draft_tokens: float | None
    per_position: list[float]
    k: float | None
    exact: bool
    acceptance_rate: float | None
    mean_acceptance_length: float | None


class Estimates(TypedDict):
    server: Estimate | None
    chunks: Estimate | None
    counters: Estimate | None


class SpecBlock(TypedDict):
    source: str | None  # one of SPEC_SOURCES, or None when no estimate applies
    accepted: float | None
    drafts: float | None
    draft_tokens: float | None
    k: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: list[float]
    tokens_per_step: dict[str, int]  # tokens per decode step (as a string) -> steps
    # the shape the server's own figure (estimates.server) rode in, e.g. vllm_metrics; null without one, and in
    # records written before specproxy read more than one
    server_source: str | None
    estimates: Estimates


class SpanCell(TypedDict):
    """Decode steps, their tokens, accepted drafts and draft tokens (null when unknown) in one span type or position
    bucket; shares of the request's figure when the block's basis is ``shared``."""

    steps: float
    tokens: float
    accepted: float
    draft_tokens: float | None


class SpanBlock(TypedDict):
    basis: str  # "steps" (measured per step from the chunks) or "shared" (the request's figure spread by tokens)
    types: dict[str, SpanCell]  # span type (core.spans.SPAN_TYPES) -> its cell
    positions: dict[str, SpanCell]  # lower edge of the output-position bucket (attribution.spans) -> its cell


class Overhead(TypedDict):
    mean: float
    max: float
    count: int


class Record(TypedDict):
    schema_version: int
    request_id: str
    upstream_id: str | None
    started_at: float | None
    workload: str
    label: str | None
    run_id: str | None
    repeat: int | None
    method: str
    path: str
    model: str | None
    status: int | None
    stream: bool
    outcome: str
    error: str | None
    finish_reason: str | None
    truncated: bool
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache
    token_source: str  # where completion_tokens came from
    chunk_token_source: str  # where the split of that total over the chunks came from (the same, or an estimate)
    ttft_s: float | None
    e2e_s: float | None
    decode_tok_s: float | None
    tpot_s: float | None
    upstream_headers_s: float | None
    chunks: list[tuple[float, int]]  # (offset_s, tokens) per token- or text-bearing event; JSON [offset, tokens]
    events: int
    reads: int
    multi_event_reads: int
    keepalives: int
    buffer_sized_reads: int | None  # reads of exactly 2**n bytes, 1 KiB up to 64 KiB: a buffering hop's; null before v6
    chunks_are_steps: bool
    flags: list[str]
    proxy_overhead_s: Overhead | None
    spec: SpecBlock | None
    spans: SpanBlock | None  # where the drafts landed: per span type and output position; null before v8
    request: Any  # the captured request body (JSON), or None
    response_text: str | None
    replay_of: str | None
    shadow_of: str | None  # a shadow's live request (proxy --shadow): its request_id; null otherwise, and before v7
    conversation: str | None  # the conversation a multi-turn request belongs to (load generator), else None
    turn: int | None  # its turn in that conversation, from 1
    engine: str | None  # vllm, sglang, ollama, llamacpp (--engine, or what auto-detection found); None: unknown
    # The engine's own counts and durations (Ollama eval_*/prompt_eval_*, llama.cpp timings), tokens and seconds:
    # prompt_tokens, prompt_s, decode_tokens, decode_s, load_s, total_s, draft_tokens, draft_accepted.
    engine_timings: dict[str, float] | None
    trace_parent: str | None  # the client's W3C traceparent header, kept when the proxy exports spans (OTLP)
    # Optional, not written by the recorder: a measured figure a user may add for `specproxy roofline`.
    read_bytes_per_token: NotRequired[float | None]


class RecordError(ValueError):
    pass


def _upgrade_0_to_1(rec: dict[str, Any]) -> dict[str, Any]:
    # Version 0 (pre-release) called the chunk timeline "timeline" and had no label.
    rec = dict(rec)
    if "timeline" in rec and "chunks" not in rec:
        rec["chunks"] = rec.pop("timeline")
    rec.setdefault("label", None)
    rec["schema_version"] = 1
    return rec


def _adding(*fields: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The upgrade to the next version of one that added ``fields``: an older record never knew them (null)."""

    def up(rec: dict[str, Any]) -> dict[str, Any]:
        return {**rec, **dict.fromkeys(fields), "schema_version": rec.get("schema_version", 0) + 1}

    return up


def _upgrade_4_to_5(rec: dict[str, Any]) -> dict[str, Any]:
    return {**rec, "chunk_token_source": rec.get("token_source"), "schema_version": 5}


_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    0: _upgrade_0_to_1,
    # 2: the prompt tokens the engine served from its prefix cache; version 1 never read them
    1: _adding("cached_tokens"),
    # 3: which conversation and turn a request was; version 2 sent single requests only
    2: _adding("conversation", "turn"),
    # 4: the engine and its own timings; version 3 spoke to vLLM's OpenAI server only but did not say so: unknown
    3: _adding("engine", "engine_timings"),
    # 5: the chunks' token counts say where they came from apart from the total's; version 4 had one source for both
    4: _upgrade_4_to_5,
    # 6: the client's traceparent, and reads of a buffer's size (a buffering hop between engine and recorder);
    # version 5 read neither
    5: _adding("trace_parent", "buffer_sized_reads"),
    # 7: a shadow's live request (proxy --shadow); version 6 sent no shadows
    6: _adding("shadow_of"),
    # 8: acceptance per span type and output position; version 7 did not split it
    7: _adding("spans"),
    # 9: a record may be written before its best figure is known, and corrected by a later line (Correction);
    # version 8 held such a record back instead: nothing to change
    8: _adding(),
}


def upgrade(rec: dict[str, Any]) -> dict[str, Any]:
    version = rec.get("schema_version", 0)
    if not isinstance(version, int) or version < 0:
        raise RecordError(f"bad schema_version {version!r}")
    if version > SCHEMA_VERSION:
        raise RecordError(f"record schema_version {version} is newer than this specproxy reads ({SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        rec = _UPGRADES[version](rec)
        version = rec["schema_version"]
    return rec


# Readers warn here when they skip a partial line; the command line shows these as ``specproxy: warning: ...``.
log = logging.getLogger("specproxy.records")


class NotJSONError(RecordError):
    """A line that is not JSON at all (as opposed to JSON that is not a record, or a record too new to read)."""


def parse_line(line: bytes) -> Record | Correction | None:
    """One line of a record file: a record, a correction of an earlier one, or None for a blank line. Raises
    RecordError for anything else."""
    line = line.strip()
    if not line:
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise NotJSONError(f"not JSON: {e}") from e
    if isinstance(obj, dict) and CORRECTION_KEY in obj:
        return correction_of(obj)
    if not isinstance(obj, dict) or "request_id" not in obj:
        raise RecordError("not a specproxy record (no request_id)")
    return as_record(upgrade(obj))


# -- corrections ---------------------------------------------------------------------------------------------------
# A record whose best figure is not known when its request ends (its counters' share rests on a per-workload model
# still being fitted) is written at once with the figure known then and this flag; a later line, a correction, says
# which of its fields changed once the figure was settled. The file stays append-only, a reader that stopped early
# (or a proxy killed before the correction) still has the record, and the readers here apply the corrections.
CORRECTION_PENDING = "correction_pending"
CORRECTION_KEY = "correction_of"
# How many records awaiting their correction a reader holds back, at most: the oldest goes out as written beyond
# it (a proxy writes a record's correction within its --attribution-hold, so this is far more than a file needs).
MAX_AWAITING = 100_000


@dataclass(frozen=True, slots=True)
class Correction:
    """A line ``{"correction_of": request_id, "run_id": ..., "fields": {...}}``: the fields of that record which
    changed, each whole, as the record has them (``flags`` always among them, without ``correction_pending``)."""

    request_id: str
    run_id: str | None
    fields: dict[str, Any]


def correction_of(obj: Mapping[str, Any]) -> Correction:
    version = obj.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise RecordError(f"record schema_version {version} is newer than this specproxy reads ({SCHEMA_VERSION})")
    rid, fields = obj.get(CORRECTION_KEY), obj.get("fields")
    if not isinstance(rid, str) or not isinstance(fields, dict):
        raise RecordError("a correction needs correction_of (a request id) and fields (an object)")
    return Correction(rid, _str(obj.get("run_id")), fields)


def correction_line(early: Record, final: Record) -> dict[str, Any]:
    """The correction that turns ``early`` (written flagged ``correction_pending``) into ``final``."""
    changed = {k: v for k, v in final.items() if k == "flags" or early.get(k) != v}
    changed["flags"] = [f for f in final["flags"] if f != CORRECTION_PENDING]
    return {
        "schema_version": SCHEMA_VERSION,
        CORRECTION_KEY: final["request_id"],
        "run_id": final["run_id"],
        "fields": changed,
    }


def corrected(rec: Record, c: Correction) -> Record:
    """``rec`` with ``c`` applied, typed again."""
    return as_record({**rec, **c.fields, "request_id": rec["request_id"], "run_id": rec["run_id"]})


class Reconciler(Generic[T]):
    """Applies corrections to the records they follow, in one pass over a run's lines: a record flagged
    ``correction_pending`` is held back until its correction (or the end, or :data:`MAX_AWAITING` later records of
    its kind), every other one goes on at once. Pure: the caller feeds what it read and takes what comes out.
    ``record`` and ``replace`` reach the record inside the caller's item (a record, or the analysis's lean item)."""

    def __init__(self, record: Callable[[T], Record], replace: Callable[[T, Record], T]) -> None:
        self._record, self._replace = record, replace
        self._awaiting: dict[tuple[str | None, str], T] = {}

    def feed(self, entry: T | Correction) -> Iterator[T]:
        if isinstance(entry, Correction):
            # one whose record is not held (let go past the bound, or in another file given) has nothing to correct
            held = self._awaiting.pop((entry.run_id, entry.request_id), None)
            if held is not None:
                yield self._replace(held, corrected(self._record(held), entry))
            return
        rec = self._record(entry)
        if CORRECTION_PENDING not in rec["flags"]:
            yield entry
            return
        self._awaiting[(rec["run_id"], rec["request_id"])] = entry
        if len(self._awaiting) > MAX_AWAITING:
            yield self._awaiting.pop(next(iter(self._awaiting)))

    def rest(self) -> Iterator[T]:
        """The records whose correction never came (the writer stopped first), as written."""
        awaiting, self._awaiting = self._awaiting, {}
        yield from awaiting.values()


def record_files(path: Path) -> list[Path]:
    """A record file and its rotated predecessors (``x.jsonl.1``, ``x.jsonl.2`` ...), oldest first; or every
    ``*.jsonl`` in a directory."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(".jsonl") or ".jsonl." in p.name)
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, path] if path.exists() else rotated


def read_records(path: str | Path) -> Iterator[Record]:
    """Every record of a run file (with its rotations) or directory. Errors name the file and line.

    A write cut short (a crash, a full disk, a file read while it is written or copied) leaves a partial line: a last
    line without its newline that is not JSON, or, once a restarted writer has ended it and appended more, a line that
    is a JSON object cut short. Such a line is skipped with a warning on the ``specproxy.records`` logger (one line,
    naming the file), so one interrupted write never makes a file unreadable. Any other malformed line is an error.
    Corrections are applied to the records they follow (:class:`Reconciler`), so a corrected record comes out once,
    with its best figure, where its correction was read.
    """
    p = Path(path)
    files = record_files(p)
    if not files:
        raise RecordError(f"{p}: no such record file or directory")
    merge: Reconciler[Record] = Reconciler(lambda r: r, lambda _, r: r)
    for f in files:
        try:
            fh = f.open("rb")
        except OSError as e:
            raise RecordError(f"{f}: cannot read: {e.strerror}") from e
        with fh:
            for lineno, line in enumerate(fh, 1):
                try:
                    rec = parse_line(line)
                except NotJSONError as e:
                    if not line.endswith(b"\n"):
                        log.warning("%s: skipped a partial last line (a write cut short)", f)
                        continue
                    if cut_short(line):
                        log.warning("%s:%d: skipped a partial line (a write cut short, then appended to)", f, lineno)
                        continue
                    if (tail := glued_tail(line)) is not None:
                        log.warning("%s:%d: %s", f, lineno, GLUED)
                        rec = parse_line(tail)
                    else:
                        raise RecordError(f"{f}:{lineno}: {e}") from e
                except RecordError as e:
                    raise RecordError(f"{f}:{lineno}: {e}") from e
                if rec is not None:
                    yield from merge.feed(rec)
    yield from merge.rest()


def cut_short(line: bytes) -> bool:
    """Whether a line is the start of a JSON object whose end is missing: what an interrupted append leaves, as
    opposed to a line damaged anywhere else (which stays an error)."""
    line = line.strip()
    if not line.startswith(b"{"):
        return False
    try:  # a cut may fall inside a multi-byte character: drop the incomplete end, refuse anything else invalid
        text = codecs.getincrementaldecoder("utf-8")().decode(line, final=False)
        orjson.loads(text)
    except UnicodeDecodeError:
        return False
    except orjson.JSONDecodeError as e:
        return e.pos >= len(text)  # the parser ran out of input; everything before the cut was valid
    return False


# -- typing what was read ------------------------------------------------------------------------------------------
def number(v: Any) -> float | None:
    """A JSON number; None for null, booleans, strings and anything else."""
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    return int(v) if isinstance(v, float) and v.is_integer() else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _nums(v: Any) -> list[float]:
    return [number(x) or 0.0 for x in v] if isinstance(v, list) else []


def _chunks(v: Any) -> list[tuple[float, int]]:
    """``[offset_s, tokens]`` pairs; malformed entries are skipped."""
    out: list[tuple[float, int]] = []
    if isinstance(v, list):
        for item in v:
            if isinstance(item, list | tuple) and len(item) >= 2:
                t, n = number(item[0]), number(item[1])
                if t is not None and n is not None:
                    out.append((t, int(n)))
    return out


def _estimate(v: Any) -> Estimate | None:
    if not isinstance(v, Mapping):
        return None
    return Estimate(
        accepted=number(v.get("accepted")),
        drafts=number(v.get("drafts")),
        draft_tokens=number(v.get("draft_tokens")),
        per_position=_nums(v.get("per_position")),
        k=number(v.get("k")),
        exact=v.get("exact") is True,
        acceptance_rate=number(v.get("acceptance_rate")),
        mean_acceptance_length=number(v.get("mean_acceptance_length")),
    )


def _spec(v: Any) -> SpecBlock | None:
    if not isinstance(v, Mapping):
        return None
    est = v.get("estimates")
    est = est if isinstance(est, Mapping) else {}
    hist = v.get("tokens_per_step")
    return SpecBlock(
        source=_str(v.get("source")),
        accepted=number(v.get("accepted")),
        drafts=number(v.get("drafts")),
        draft_tokens=number(v.get("draft_tokens")),
        k=number(v.get("k")),
        acceptance_rate=number(v.get("acceptance_rate")),
        mean_acceptance_length=number(v.get("mean_acceptance_length")),
        per_position=_nums(v.get("per_position")),
        tokens_per_step={
            str(key): int(n)
            for key, n in (hist.items() if isinstance(hist, Mapping) else ())
            if str(key).isdigit() and number(n) is not None
        },
        server_source=_str(v.get("server_source")),
        estimates=Estimates(
            server=_estimate(est.get("server")),
            chunks=_estimate(est.get("chunks")),
            counters=_estimate(est.get("counters")),
        ),
    )


def _span_cells(v: Any) -> dict[str, SpanCell]:
    out: dict[str, SpanCell] = {}
    for key, c in v.items() if isinstance(v, Mapping) else ():
        if not isinstance(c, Mapping):
            continue
        steps, tokens, accepted = number(c.get("steps")), number(c.get("tokens")), number(c.get("accepted"))
        if steps is None or tokens is None or accepted is None:
            continue
        out[str(key)] = SpanCell(
            steps=steps, tokens=tokens, accepted=accepted, draft_tokens=number(c.get("draft_tokens"))
        )
    return out


def _spans(v: Any) -> SpanBlock | None:
    if not isinstance(v, Mapping) or not isinstance(basis := v.get("basis"), str):
        return None
    return SpanBlock(basis=basis, types=_span_cells(v.get("types")), positions=_span_cells(v.get("positions")))


def _overhead(v: Any) -> Overhead | None:
    if not isinstance(v, Mapping):
        return None
    mean, peak, count = number(v.get("mean")), number(v.get("max")), _int(v.get("count"))
    if mean is None or peak is None or count is None:
        return None
    return Overhead(mean=mean, max=peak, count=count)


def _timings(v: Any) -> dict[str, float] | None:
    if not isinstance(v, Mapping):
        return None
    return {str(k): n for k, x in v.items() if (n := number(x)) is not None}


def as_record(obj: Mapping[str, Any]) -> Record:
    """A record of the current version with every field of its type: what a reader may rely on. A value of the wrong
    type reads as missing (null, zero, false or empty); the request's id is the one field that must be there."""
    rid = obj.get("request_id")
    if rid is None:
        raise RecordError("not a specproxy record (no request_id)")
    flags = obj.get("flags")
    rec = Record(
        schema_version=SCHEMA_VERSION,
        request_id=str(rid),
        upstream_id=_str(obj.get("upstream_id")),
        started_at=number(obj.get("started_at")),
        workload=_str(obj.get("workload")) or "default",
        label=_str(obj.get("label")),
        run_id=_str(obj.get("run_id")),
        repeat=_int(obj.get("repeat")),
        method=_str(obj.get("method")) or "POST",
        path=_str(obj.get("path")) or "",
        model=_str(obj.get("model")),
        status=_int(obj.get("status")),
        stream=obj.get("stream") is True,
        outcome=_str(obj.get("outcome")) or "unknown",
        error=_str(obj.get("error")),
        finish_reason=_str(obj.get("finish_reason")),
        truncated=obj.get("truncated") is True,
        prompt_tokens=_int(obj.get("prompt_tokens")),
        completion_tokens=_int(obj.get("completion_tokens")),
        cached_tokens=_int(obj.get("cached_tokens")),
        token_source=_str(obj.get("token_source")) or "none",
        chunk_token_source=_str(obj.get("chunk_token_source")) or _str(obj.get("token_source")) or "none",
        ttft_s=number(obj.get("ttft_s")),
        e2e_s=number(obj.get("e2e_s")),
        decode_tok_s=number(obj.get("decode_tok_s")),
        tpot_s=number(obj.get("tpot_s")),
        upstream_headers_s=number(obj.get("upstream_headers_s")),
        chunks=_chunks(obj.get("chunks")),
        events=_int(obj.get("events")) or 0,
        reads=_int(obj.get("reads")) or 0,
        multi_event_reads=_int(obj.get("multi_event_reads")) or 0,
        buffer_sized_reads=_int(obj.get("buffer_sized_reads")),
        keepalives=_int(obj.get("keepalives")) or 0,
        chunks_are_steps=obj.get("chunks_are_steps") is True,
        flags=[f for f in flags if isinstance(f, str)] if isinstance(flags, list) else [],
        proxy_overhead_s=_overhead(obj.get("proxy_overhead_s")),
        spec=_spec(obj.get("spec")),
        spans=_spans(obj.get("spans")),
        request=obj.get("request"),
        response_text=_str(obj.get("response_text")),
        replay_of=_str(obj.get("replay_of")),
        shadow_of=_str(obj.get("shadow_of")),
        conversation=_str(obj.get("conversation")),
        turn=_int(obj.get("turn")),
        engine=_str(obj.get("engine")),
        engine_timings=_timings(obj.get("engine_timings")),
        trace_parent=_str(obj.get("trace_parent")),
    )
    if "read_bytes_per_token" in obj:
        rec["read_bytes_per_token"] = number(obj["read_bytes_per_token"])
    return rec


def dumps(rec: Record) -> bytes:
    return orjson.dumps(rec) + b"\n"
