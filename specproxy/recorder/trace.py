"""One request as the recorder follows it: what the request was (:class:`RequestMeta`) and its response as it
arrives (:class:`Trace`), whose token-bearing chunks are reported to the counter ledger as they come.

:meth:`Trace.feed` runs once per upstream read: in the proxy's bookkeeper, fed by the relays' events (with the
times the relay took), in the load generator right after each read.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specproxy.attribution.ledger import CounterLedger
from specproxy.core.timeline import ResponseTimeline, timeline_for
from specproxy.core.tokens import Tokenizer


@dataclass(slots=True)
class RequestMeta:
    method: str
    path: str
    workload: str
    model: str | None = None
    body: Any = None  # the parsed JSON body, kept only per --capture
    body_bytes: int | None = None  # set for a body over capture_max_bytes, which was neither parsed nor kept
    stream_requested: bool = False
    replay_of: str | None = None
    shadow_of: str | None = None  # a shadow's live request (proxy --shadow)
    repeat: int | None = None
    conversation: str | None = None  # a multi-turn request's conversation (load generator)
    turn: int | None = None  # its turn, from 1
    trace_parent: str | None = None  # the client's valid W3C traceparent, when spans are exported (OTLP)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    started_at: float = field(default_factory=time.time)
    start_ns: int = field(default_factory=time.perf_counter_ns)


class Trace:
    """One request's side of the recorder: its timeline, and its chunks reported to the counter ledger."""

    __slots__ = (
        "_keep_text",
        "_ledger",
        "_on_first_token",
        "_token_chunks",
        "_tokenizer",
        "flags",
        "headers_ns",
        "meta",
        "overhead_count",
        "overhead_max_ns",
        "overhead_ns",
        "passthrough",
        "status",
        "timeline",
    )

    def __init__(
        self,
        meta: RequestMeta,
        *,
        tokenizer: Tokenizer | None,
        keep_text: bool,
        ledger: CounterLedger | None,
        passthrough: bool = False,
        on_first_token: Callable[[], None] | None = None,
    ) -> None:
        self.meta = meta
        self.passthrough = passthrough  # not inference (core.inference): relayed and counted, never read or recorded
        self._tokenizer = tokenizer
        self._keep_text = keep_text
        self._ledger = ledger  # None when the engine's counters are not scraped
        self._on_first_token = on_first_token  # called once: at the first token, or at the end when none came
        self.status: int | None = None
        self.headers_ns: int | None = None
        self.timeline: ResponseTimeline | None = None
        self._token_chunks = 0
        self.overhead_ns = 0
        self.overhead_max_ns = 0
        self.overhead_count = 0
        self.flags: list[str] = []  # set by whoever feeds the trace (bookkeeping_shed), carried into the record

    @property
    def token_chunks(self) -> int:
        """Token-bearing chunks seen so far: the first is the prefill step, the rest decode steps."""
        return self._token_chunks

    def response_started(
        self, status: int, content_type: str | None, content_encoding: str | None = None, *, t_ns: int | None = None
    ) -> None:
        """The response head arrived (at ``t_ns``, default now)."""
        self.status = status
        self.headers_ns = time.perf_counter_ns() if t_ns is None else t_ns
        if self.passthrough:
            return
        self.timeline = timeline_for(  # the path picks the wire dialect, the content type whether it streams
            self.meta.start_ns,
            path=self.meta.path,
            content_type=content_type,
            tokenizer=self._tokenizer,
            keep_text=self._keep_text,
            content_encoding=content_encoding,
        )

    def feed(self, t_ns: int, data: bytes) -> None:
        tl = self.timeline
        if tl is None:
            return
        before = len(tl.chunks)
        tl.feed(t_ns, data)
        chunks = tl.chunks
        if len(chunks) == before:
            return
        ledger = self._ledger
        if self._on_first_token is not None and self._token_chunks == 0:
            self.prefill_over()
        tokens = [n for _, n in chunks[before:] if n > 0]
        if not tokens:
            return
        # the first token-bearing chunk is the prefill step: tokens, but no speculative step
        first_decode = self._token_chunks > 0
        self._token_chunks += len(tokens)
        if ledger is not None:
            ledger.record_read(self.meta.request_id, tokens, t_ns, exact=tl.exact_counts, first_decode=first_decode)

    def prefill_over(self) -> None:
        """The request's first token arrived (or it ended): tell whoever waits for that, once."""
        done, self._on_first_token = self._on_first_token, None
        if done is not None:
            done()
