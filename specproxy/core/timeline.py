"""The timeline of one response as a recorder sees it: every upstream read, every SSE event, their token counts.

Pure: times come in as ``perf_counter_ns`` integers from the caller, bytes come in as they were read. Per read the
work is one SSE (or NDJSON) scan and one small JSON parse per event, read by the response's wire dialect
(:mod:`specproxy.core.dialects`: OpenAI, SGLang and llama.cpp native, Ollama, Anthropic Messages, OpenAI Responses);
nothing is re-serialised. :meth:`ResponseTimeline.result` turns it into the figures a record needs.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from specproxy.core.dialects import Dialect, dialect_for, stream_framing
from specproxy.core.dialects.engine import PER_TOKEN_ENGINES
from specproxy.core.dialects.native import NativeDialect
from specproxy.core.figures import decode_tok_s, tpot_s, ttft_s
from specproxy.core.ndjson import NDJSONDecoder
from specproxy.core.openai_stream import StreamChunk, plain_fields
from specproxy.core.spans import SpanClassifier
from specproxy.core.sse import SSEDecoder
from specproxy.core.tokens import ChunkTokenCounter, Tokenizer, TokenSource

NON_STREAM_PARSE_LIMIT = 32 * 1024 * 1024  # a non-streamed body larger than this is relayed but not parsed
EVENT_PARSE_LIMIT = 64 * 1024 * 1024  # an SSE event (or line) growing past this stops the recording of the stream
INFLATE_LIMIT = 8 * 1024 * 1024  # decompressed bytes per read: more is a decompression bomb, not a token stream
TEXT_CAPTURE_LIMIT = 4 * 1024 * 1024
# A read of exactly 2**n bytes in this range is a buffer's size: what a buffering hop (nginx's proxy and gzip
# buffers, 4 or 8 KiB) releases when its buffer fills. Above it, reads of 2**n are the reader's own read limit.
BUFFER_SIZES = frozenset(2**n for n in range(10, 17))


@dataclass(slots=True)
class TimelineResult:
    stream: bool
    chunks: list[tuple[float, int]]  # (offset_s, tokens) per token- or text-bearing event
    token_source: TokenSource  # where the totals came from (completion_tokens)
    chunk_token_source: TokenSource  # where the split over chunks came from: the same, or a tokenizer's estimate
    ttft_s: float | None
    decode_tok_s: float | None
    tpot_s: float | None
    last_token_s: float | None
    completion_tokens: int | None
    completion_from_usage: bool  # completion_tokens is the server's usage figure, not a sum of chunk counts
    prompt_tokens: int | None
    cached_tokens: int | None  # prompt tokens the engine served from its prefix cache, when it said
    finish_reason: str | None
    upstream_id: str | None
    server_spec: dict[str, Any] | None
    llama_timings: dict[str, Any] | None
    error: Any
    done: bool  # saw [DONE] (streams) or a complete JSON body
    events: int
    reads: int
    multi_event_reads: int
    buffer_sized_reads: int
    keepalives: int
    non_json_events: int
    response_text: str | None
    text_complete: bool  # response_text holds every character of the response (not cut at TEXT_CAPTURE_LIMIT)
    flags: list[str] = field(default_factory=list)
    dialect: str = "openai"
    engine_hint: str | None = None  # the engine the response's shape names (core.dialects.engine)
    engine_timings: dict[str, float] | None = None  # the engine's own counts and durations (tokens, seconds)
    span_codes: bytes = b""  # per chunk, what it wrote: an index into core.spans.SPAN_TYPES (streams only)


PLAIN_DIALECTS = (Dialect, NativeDialect)  # dialects whose plain chunk is OpenAI's: read by the plain lane


class ResponseTimeline:
    """Feed it the response as it arrives; ask for :meth:`result` at the end."""

    def __init__(
        self,
        start_ns: int,
        *,
        stream: bool,
        tokenizer: Tokenizer | None = None,
        keep_text: bool = False,
        content_encoding: str | None = None,
        dialect: Dialect | None = None,
        framing: str = "sse",
    ):
        self.start_ns = start_ns
        self.stream = stream
        self.dialect = dialect or dialect_for("")
        self._ndjson = NDJSONDecoder() if framing == "ndjson" else None
        # the OpenAI shapes over SSE: whole reads of ``data:`` events take the plain lane (:meth:`_on_payload`)
        self._plain = framing == "sse" and type(self.dialect) in PLAIN_DIALECTS
        # The proxy relays bytes as they came (compressed or not); the recorder reads a decompressed copy.
        enc = (content_encoding or "").strip().lower()
        self._inflate: Any = None
        self._inflate_failed = False
        self._too_large = False
        if enc in ("gzip", "x-gzip"):
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self._inflate = zlib.decompressobj()
        elif enc not in ("", "identity"):
            self._inflate_failed = True  # br, zstd: relayed untouched, not read
        self._sse = SSEDecoder()
        self._tokens = ChunkTokenCounter(tokenizer)
        self._keep_text = keep_text
        self._text: list[str] = []
        self._text_len = 0
        self._text_cut = False
        self._body = bytearray()
        self._body_over = False
        self.chunks: list[tuple[float, int]] = []
        self._spans = SpanClassifier()
        self.span_codes = bytearray()  # one per entry of chunks
        self._sources: Counter[str] = Counter()
        self._inexact = False  # a chunk's count came from a tokenizer (any source but usage and token ids)
        self.events = 0
        self.reads = 0
        self.multi_event_reads = 0
        self.buffer_sized_reads = 0  # reads as they came (before any inflating) of a size in BUFFER_SIZES
        self.non_json = 0
        self.several_choices = False  # n > 1: chunks of several sequences interleave, a chunk is not a step
        self.done = False
        self.first_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self._final_usage: tuple[int | None, int | None] = (None, None)
        self._cached: int | None = None
        self._bad_usage = False
        self._finish: str | None = None
        self._id: str | None = None
        self._spec: dict[str, Any] | None = None
        self._timings: dict[str, Any] | None = None
        self._error: Any = None
        self._sum_tokens = 0
        self._engine: str | None = None
        self._engine_timings: dict[str, float] | None = None

    @property
    def finish_reason(self) -> str | None:
        return self._finish

    @property
    def exact_counts(self) -> bool:
        """Whether every chunk count so far came from the server (usage deltas or token ids), from an engine whose
        chunks are steps: llama.cpp and Ollama send one event per token, so a count per event says nothing of steps."""
        return not self._inexact and self._engine not in PER_TOKEN_ENGINES

    @property
    def server_spec(self) -> dict[str, Any] | None:
        """The engine's own speculative figures for this request, once they arrived (vLLM: on the final chunk)."""
        return self._spec

    def reply_text(self) -> str | None:
        """The streamed reply's text when it was kept whole (``keep_text``) and is not empty, else None: what a
        conversation's next turn carries as the model's own earlier reply."""
        if not self._keep_text or self._text_cut or not self._text:
            return None
        return "".join(self._text)

    # -- feeding ---------------------------------------------------------------------------------------------------
    def feed(self, t_ns: int, data: bytes) -> None:
        self.reads += 1
        if len(data) in BUFFER_SIZES:
            self.buffer_sized_reads += 1
        if self._inflate_failed:
            return
        if self._inflate is not None:
            try:
                data = self._inflate.decompress(data, INFLATE_LIMIT)
            except zlib.error:
                self._inflate_failed = True
                return
            if self._inflate.unconsumed_tail:  # expands beyond reason: stop reading (the relay goes on)
                self._inflate_failed = True
                self._inflate = None
                return
        if not self.stream:
            if not self._body_over:
                if len(self._body) + len(data) > NON_STREAM_PARSE_LIMIT:
                    self._body_over = True
                    self._body.clear()
                else:
                    self._body += data
            return
        if self._too_large:
            return
        if self._plain and self._whole_events(t_ns, data):
            return
        bearing = 0
        if self._ndjson is not None:
            for line in self._ndjson.feed(data):
                if self._on_event(t_ns, "message", line):  # an NDJSON line reads as an SSE event's data
                    bearing += 1
            buffered = self._ndjson.buffered
        else:
            for ev in self._sse.feed(data):
                if self._on_event(t_ns, ev.event, ev.data):
                    bearing += 1
            buffered = self._sse.buffered
        if bearing > 1:
            self.multi_event_reads += 1
        if buffered > EVENT_PARSE_LIMIT:  # an endless line: bound the recorder's memory
            self._too_large = True
            self._sse = SSEDecoder()
            self._ndjson = NDJSONDecoder() if self._ndjson is not None else None

    def _whole_events(self, t_ns: int, data: bytes) -> bool:
        """The plain lane: a read of whole events of one LF-framed ``data:`` line each, which the SSE decoder would
        split into those lines, taken without it; False (nothing read) for any other read."""
        if not (data.startswith(b"data: ") and data.endswith(b"\n\n") and self._sse.between_events):
            return False
        parts = data[6:-2].split(b"\n\ndata: ")
        if data.count(b"\n") != 2 * len(parts) or b"\r" in data:
            return False
        bearing = 0
        for payload in parts:
            if self._on_payload(t_ns, payload):
                bearing += 1
        if bearing > 1:
            self.multi_event_reads += 1
        return True

    def _on_payload(self, t_ns: int, payload: bytes) -> bool:
        """One ``data:`` event's payload, read by the plain lane where it is the common chunk (the bookkeeper's most
        frequent event): what the whole reading (:meth:`_on_event`) would make of it, in fewer steps."""
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self._on_event(t_ns, "message", payload.decode("utf-8", errors="replace"))
        f = plain_fields(obj) if type(obj) is dict else None
        if f is None:
            # another shape: the dialect's whole reading of the object already parsed (what its event() does, which
            # for the plain dialects is parse and json(), without parsing the text again)
            return self._on_parsed(t_ns, self.dialect.json(obj))
        self.events += 1
        text, role, finish, prompt_tokens, completion_tokens, rid, index = f
        if rid and self._id is None:
            self._id = rid
        if index > 0:
            self.several_choices = True
        if finish is not None and self._finish is None:
            self._finish = finish
        if prompt_tokens is not None or completion_tokens is not None:
            self._final_usage = (prompt_tokens, completion_tokens)
        n, source = self._tokens.count(
            has_choices=True,
            completion_tokens=completion_tokens,
            n_token_ids=None,
            text=text,
            finish_reason=finish,
            role=role,
        )
        return self._add(t_ns, n, source, text, False)

    def _on_event(self, t_ns: int, event: str, data: str) -> bool:
        return self._on_parsed(t_ns, self.dialect.event(event, data))

    def _on_parsed(self, t_ns: int, c: StreamChunk) -> bool:
        self.events += 1
        if c.kind == "done":
            self.done = True
            return False
        if c.kind == "non_json":
            self.non_json += 1
            return False
        if c.kind == "error":
            self._error = c.error
            return False
        return self._on_chunk(t_ns, c)

    def _on_chunk(self, t_ns: int, c: StreamChunk) -> bool:
        if c.id and self._id is None:
            self._id = c.id
        if c.engine is not None:
            self._engine = c.engine
        if c.engine_timings:
            self._engine_timings = c.engine_timings
        if c.final:
            self.done = True
        if c.max_index > 0:
            self.several_choices = True
        if c.finish_reason and self._finish is None:
            self._finish = c.finish_reason
        if c.spec is not None:
            self._spec = c.spec
        if c.llama_timings is not None:
            self._timings = c.llama_timings
        self._bad_usage = self._bad_usage or c.bad_usage
        if c.prompt_tokens is not None or c.completion_tokens is not None:
            self._final_usage = (c.prompt_tokens, c.completion_tokens)
        if c.cached_tokens is not None:
            self._cached = c.cached_tokens
        n, source = self._tokens.count(
            has_choices=c.has_choices,
            completion_tokens=c.completion_tokens,
            n_token_ids=c.n_token_ids,
            text=c.text,
            finish_reason=c.finish_reason,
            role=c.role,
        )
        return self._add(t_ns, n, source, c.text, c.tool)

    def _add(self, t_ns: int, n: int, source: TokenSource, text: str, tool: bool) -> bool:
        """A chunk's tokens and text: whether it was a chunk of the timeline (tokens, or text of none)."""
        if self._keep_text and text:
            if self._text_len < TEXT_CAPTURE_LIMIT:
                self._text.append(text)
                self._text_len += len(text)
            else:
                self._text_cut = True
        if n <= 0 and not text:
            return False
        if n > 0:
            self._sources[source] += 1
            if source != "usage" and source != "token_ids":
                self._inexact = True
            self._sum_tokens += n
            if self.first_token_ns is None:
                self.first_token_ns = t_ns
            self.last_token_ns = t_ns
        self.chunks.append(((t_ns - self.start_ns) / 1e9, n))
        self.span_codes.append(self._spans.feed(text, tool))
        return True

    # -- result ------------------------------------------------------------------------------------------------------
    def result(self, end_ns: int) -> TimelineResult:
        if self.stream:
            if self._ndjson is not None:
                for line in self._ndjson.flush():  # a last line without its newline still counts
                    self._on_event(end_ns, "message", line)
            for ev in self._sse.flush():  # an event cut off by the end of the stream: what arrived still counts
                self._on_event(end_ns, ev.event, ev.data)
        elif self._body and not self._body_over:
            self._parse_body(end_ns)
        prompt_tokens, usage_completion = self._final_usage
        completion = usage_completion if usage_completion is not None else (self._sum_tokens or None)
        chunk_source: TokenSource = "none"
        if self._sources:
            chunk_source = self._sources.most_common(1)[0][0]  # type: ignore[assignment]
        source = chunk_source
        flags: list[str] = []
        chunks = self.chunks
        if self.stream and chunk_source not in ("usage", "token_ids"):
            if usage_completion is not None:
                # the final usage alone (stream_options.include_usage): the total is the server's, exact; the split
                # over chunks is the tokenizer's, scaled to add up to it
                source = "usage"
                scaled = scaled_counts(chunks, usage_completion)
                if scaled is not None and scaled != chunks:
                    chunks = scaled
                    flags.append("chunk_counts_scaled")
            else:
                flags.append("no_usage")
        elif usage_completion is not None and chunk_source == "none":
            source = "usage"  # a non-streamed body: its usage is its only count
        if self.multi_event_reads:
            flags.append("multi_event_reads")
        if self.non_json:
            flags.append("non_json_events")
        if self._body_over:
            flags.append("body_not_parsed")
        if self.several_choices:
            flags.append("several_choices")
        if self._inflate_failed:
            flags.append("compressed_not_parsed")
        if self._too_large:
            flags.append("event_too_large")
        if self._bad_usage:
            flags.append("bad_usage")
        ttft = ttft_s(self.start_ns, self.first_token_ns)
        rate = decode_tok_s(chunks) if self.stream else None
        tpot = None
        if self.stream and self.first_token_ns is not None and self.last_token_ns:
            tpot = tpot_s((self.last_token_ns - self.first_token_ns) / 1e9, completion)
        return TimelineResult(
            stream=self.stream,
            chunks=chunks,
            token_source=source,
            chunk_token_source=chunk_source,
            ttft_s=ttft,
            decode_tok_s=rate,
            tpot_s=tpot,
            last_token_s=(self.last_token_ns - self.start_ns) / 1e9 if self.last_token_ns is not None else None,
            completion_tokens=completion,
            completion_from_usage=usage_completion is not None,
            prompt_tokens=prompt_tokens,
            cached_tokens=self._cached,
            finish_reason=self._finish,
            upstream_id=self._id,
            server_spec=self._spec,
            llama_timings=self._timings,
            error=self._error,
            done=self.done,
            events=self.events,
            reads=self.reads,
            multi_event_reads=self.multi_event_reads,
            buffer_sized_reads=self.buffer_sized_reads,
            keepalives=self._sse.comments,
            non_json_events=self.non_json,
            response_text="".join(self._text) if self._keep_text else None,
            text_complete=self._keep_text and not self._text_cut,
            flags=flags,
            dialect=self.dialect.name,
            engine_hint=self._engine,
            engine_timings=self._engine_timings,
            span_codes=bytes(self.span_codes),
        )

    def _parse_body(self, end_ns: int) -> None:
        try:
            obj = orjson.loads(self._body)
        except orjson.JSONDecodeError:
            self.non_json += 1
            return
        c = self.dialect.json(obj)
        if c.engine is not None:
            self._engine = c.engine
        if c.kind == "error":
            self._error = c.error
            return
        if c.kind != "chunk":
            return
        self.done = True
        self._engine_timings = c.engine_timings
        self._id = c.id
        self._finish = c.finish_reason
        self._spec = c.spec
        self._timings = c.llama_timings
        self._bad_usage = c.bad_usage
        self._final_usage = (c.prompt_tokens, c.completion_tokens)
        self._cached = c.cached_tokens
        if self._keep_text:
            self._text.append(c.text[:TEXT_CAPTURE_LIMIT])
            self._text_cut = len(c.text) > TEXT_CAPTURE_LIMIT
        if c.completion_tokens:
            self.first_token_ns = self.last_token_ns = end_ns


def timeline_for(
    start_ns: int,
    *,
    path: str,
    content_type: str | None,
    tokenizer: Tokenizer | None = None,
    keep_text: bool = False,
    content_encoding: str | None = None,
) -> ResponseTimeline:
    """The timeline of a response to ``path`` whose headers say ``content_type``: streamed when it is an event stream
    (SSE) or NDJSON, read in the dialect of its path (:func:`specproxy.core.dialects.dialect_for`)."""
    framing = stream_framing(content_type)
    return ResponseTimeline(
        start_ns,
        stream=framing is not None,
        tokenizer=tokenizer,
        keep_text=keep_text,
        content_encoding=content_encoding,
        dialect=dialect_for(path),
        framing=framing or "sse",
    )


def scaled_counts(chunks: list[tuple[float, int]], total: int) -> list[tuple[float, int]] | None:
    """``chunks`` with their token counts scaled to add up to ``total`` (an exact count of the whole), or None when
    ``total`` contradicts them (below the number of token-bearing chunks). Each token-bearing chunk keeps at least one
    token (it was an engine step), and the rest is shared in proportion to the tokens each had beyond that one,
    largest remainders first."""
    bearing = [i for i, (_, n) in enumerate(chunks) if n > 0]
    if not bearing or total < len(bearing):
        return None
    out = list(chunks)
    extra = [chunks[i][1] - 1 for i in bearing]
    weights = extra if sum(extra) > 0 else [1] * len(bearing)
    spare = total - len(bearing)
    wsum = sum(weights)
    shares = [spare * w / wsum for w in weights]
    counts = [1 + int(s) for s in shares]
    left = total - sum(counts)
    for j in sorted(range(len(bearing)), key=lambda j: shares[j] - int(shares[j]), reverse=True)[:left]:
        counts[j] += 1
    for i, n in zip(bearing, counts, strict=True):
        out[i] = (out[i][0], n)
    return out


def with_counted_total(tl: TimelineResult, total: int, source: TokenSource) -> TimelineResult:
    """The timeline with its completion counted again as a whole (the engine's ``/tokenize`` over the response text):
    ``completion_tokens`` becomes ``total``, and the chunk counts, which a per-chunk tokenizer gave on the relay path,
    are scaled to add up to it (:func:`scaled_counts`). A total below the number of token-bearing chunks contradicts
    the chunks: then only ``completion_tokens`` changes."""
    chunks = scaled_counts(tl.chunks, total) or list(tl.chunks)
    rate = decode_tok_s(chunks) if tl.stream else None
    tpot = None
    if tl.stream and tl.ttft_s is not None and tl.last_token_s is not None:
        tpot = tpot_s(tl.last_token_s - tl.ttft_s, total)
    return dataclasses.replace(
        tl, chunks=chunks, completion_tokens=total, token_source=source, decode_tok_s=rate, tpot_s=tpot
    )
