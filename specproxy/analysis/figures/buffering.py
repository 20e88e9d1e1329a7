"""Whether a buffering hop sits between the engine and the recorder: a proxy or load balancer that holds an event
stream back and releases it in clumps (nginx with ``proxy_buffering on`` or ``gzip`` on ``text/event-stream``).

Behind such a hop every latency figure is the hop's, not the engine's: the first token waits for a buffer to fill
(TTFT rises), the tokens in one clump arrive together (inter-token gaps collapse to zero), and a short response comes
whole at its end. What tells a hop apart from a direct path, even a busy one:

- *events per read*: on a direct path the recorder reads each event (one engine step) as it is sent; a speculative
  step brings several tokens, but in *one* event, and a busy recorder coalesces two or three events into one read
  now and then. Behind a hop most reads carry many events (the median read, not the odd one).
- *reads of a buffer's size*: a hop releases a buffer when it fills, so reads cluster at 4 or 8 KiB exactly
  (``buffer_sized_reads`` in the record); a direct read is as long as the events it holds, any size.
- *responses in one or two reads*: a hop also releases what it holds when the upstream response ends, so responses
  shorter than its buffer arrive whole.

Many events per read without either of the hop's marks is *clumped*: the recorder read late (a busy host, a slow
client holding the proxy back), said apart from a hop. Pure: records in (:func:`response_reads`), a
:class:`Verdict` out; :class:`BufferingInput` feeds it from ``specproxy report``'s stream, per run label, and
:class:`BufferingTracker` from the proxy's last records, for ``/specproxy/status``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from specproxy.analysis.figures.records import key_value
from specproxy.analysis.inputs.scan import ChunkBatch, Item, typed_chunks
from specproxy.core.record import Record

MIN_EVENTS = 8  # token events a response needs to say how its reads were cut
MIN_RESPONSES = 3  # such responses a verdict needs
CLUMP = 4  # token events in one read that make it a clump: more than a busy reader coalesces
SIZED_SHARE = 0.2  # share of reads at a buffer's size that marks a hop (a direct path: almost none)
WHOLE_SHARE = 0.5  # share of responses that came in one or two reads that marks a hop
MAX_RESPONSES = 5_000  # per label in a report: a path's verdict needs no more, and the chunks cost to parse
RECENT = 200  # the proxy's status judges its last this many responses
MAX_LABELS = 100

VERDICTS = ("buffered", "clumped", "unbuffered", "unknown")


@dataclass(frozen=True, slots=True)
class ResponseReads:
    """How one streamed response's token events were cut into reads, as its record tells."""

    per_read: tuple[tuple[int, int], ...]  # (token events in a read, reads with that many), reads with any
    reads: int  # every read of the body, with token events or not
    buffer_sized: int | None  # reads of a buffer's size; None: the record does not count them (before schema 6)

    @property
    def events(self) -> int:
        return sum(n * c for n, c in self.per_read)

    @property
    def data_reads(self) -> int:
        return sum(c for _, c in self.per_read)


def response_reads(rec: Record, offsets: Sequence[float] | None = None) -> ResponseReads | None:
    """The reads of a streamed response with :data:`MIN_EVENTS` token events or more, else None. Events of one read
    share its time to the microsecond, so a run of equal chunk offsets (``offsets``: the chunks') is one read."""
    ts = [t for t, _ in rec["chunks"]] if offsets is None else offsets
    if not rec["stream"] or len(ts) < MIN_EVENTS:
        return None
    if len(set(ts)) == len(ts):  # a read per event, as on a direct path: the common case, counted at once
        per_read: tuple[tuple[int, int], ...] = ((1, len(ts)),)
    else:
        sizes: Counter[int] = Counter()
        run, last = 0, None
        for t in ts:
            if t == last:
                run += 1
                continue
            if run:
                sizes[run] += 1
            run, last = 1, t
        sizes[run] += 1
        per_read = tuple(sorted(sizes.items()))
    return ResponseReads(per_read, rec["reads"], rec["buffer_sized_reads"])


def _offsets(seg: bytes) -> list[float]:
    """The chunk offsets of a record's timeline as :mod:`specproxy.analysis.inputs.scan` hands it on (JSON bytes):
    parsed plainly (a tenth of the cost of typing every pair), typed only when a pair is not one."""
    try:
        return [float(c[0]) for c in orjson.loads(seg)]
    except (TypeError, IndexError, ValueError, orjson.JSONDecodeError):
        return [t for t, _ in typed_chunks(seg)]


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str  # one of VERDICTS
    message: str  # one line for a user
    evidence: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "message": self.message, "evidence": self.evidence}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@dataclass(slots=True)
class BufferingEvidence:
    """The evidence of many responses, added one at a time."""

    responses: int = 0
    whole: int = 0  # responses whose token events came in one or two reads
    per_read: Counter[int] = field(default_factory=Counter)
    reads: int = 0  # reads of the responses whose records count buffer-sized ones
    buffer_sized: int = 0

    def add(self, r: ResponseReads) -> None:
        self.responses += 1
        self.whole += r.data_reads <= 2
        self.per_read.update(dict(r.per_read))
        if r.buffer_sized is not None:
            self.reads += r.reads
            self.buffer_sized += r.buffer_sized

    def evidence(self) -> dict[str, Any]:
        data_reads = sum(self.per_read.values())
        events = sum(n * c for n, c in self.per_read.items())
        median = None
        if data_reads:
            seen, half = 0, data_reads / 2
            for n in sorted(self.per_read):
                seen += self.per_read[n]
                if seen >= half:
                    median = n
                    break
        gaps = events - self.responses  # gaps between a response's consecutive token events
        return {
            "responses": self.responses,
            "token_events": events,
            "median_events_per_read": median,
            "clumped_read_share": sum(c for n, c in self.per_read.items() if n >= CLUMP) / data_reads
            if data_reads
            else None,
            "buffer_sized_read_share": self.buffer_sized / self.reads if self.reads else None,
            "whole_response_share": self.whole / self.responses if self.responses else None,
            # gap collapse: the share of inter-token gaps that are zero, the two tokens having come in one read
            "same_read_gap_share": (events - data_reads) / gaps if gaps > 0 else None,
        }

    def verdict(self) -> Verdict:
        ev = self.evidence()
        if self.responses < MIN_RESPONSES:
            return Verdict(
                "unknown",
                f"too few streamed responses to tell whether the path buffers ({self.responses} with "
                f"{MIN_EVENTS}+ token events; {MIN_RESPONSES} needed)",
                ev,
            )
        median = ev["median_events_per_read"] or 0
        sized, whole = ev["buffer_sized_read_share"], ev["whole_response_share"]
        marks = []
        if sized is not None and sized >= SIZED_SHARE:
            marks.append(f"{_pct(sized)} of reads of a buffer's size")
        if whole >= WHOLE_SHARE:
            marks.append(f"{_pct(whole)} of responses in one or two reads")
        per = f"median {median} token events per read"
        if median >= CLUMP and marks:
            return Verdict(
                "buffered",
                f"the path looks buffered ({per}, {', '.join(marks)}): a hop between the engine and specproxy "
                "releases the stream in clumps, so TTFT and inter-token figures are the hop's, not the engine's; "
                "turn its buffering off for event streams (nginx: proxy_buffering off, no gzip on text/event-stream)",
                ev,
            )
        if median >= CLUMP:
            return Verdict(
                "clumped",
                f"reads carry many events ({per}) but not at a buffer's size: the recorder read late (a busy host, "
                "or a slow client holding the proxy back), so inter-token figures blur",
                ev,
            )
        return Verdict("unbuffered", f"the path streams unbuffered ({per})", ev)


class BufferingInput:
    """``specproxy report``'s feed: evidence per run label, from up to :data:`MAX_RESPONSES` responses each."""

    def __init__(self) -> None:
        self.labels: dict[str, BufferingEvidence] = {}

    def add(self, item: Item, _batch: ChunkBatch) -> None:
        rec = item.rec
        if not rec["stream"] or not item.seg:
            return
        label = key_value(rec, "label")
        acc = self.labels.get(label)
        if acc is None:
            if len(self.labels) >= MAX_LABELS:
                return
            acc = self.labels[label] = BufferingEvidence()
        if acc.responses >= MAX_RESPONSES:
            return
        r = response_reads(rec, _offsets(item.seg))
        if r is not None:
            acc.add(r)

    def verdicts(self) -> dict[str, Verdict]:
        return {label: acc.verdict() for label, acc in self.labels.items()}

    def paths(self) -> dict[str, dict[str, Any]]:
        """Per label, what ``report --format json`` says of its path."""
        return {label: {"buffering": v.as_json()} for label, v in self.verdicts().items()}

    def warnings(self) -> list[str]:
        """One line per label whose path buffers or clumps; the label is named when the report has several."""
        named = len(self.labels) > 1
        return [
            f"{label}: {v.message}" if named else v.message
            for label, v in self.verdicts().items()
            if v.verdict in ("buffered", "clumped")
        ]


class BufferingTracker:
    """The proxy's live verdict, over its last :data:`RECENT` streamed responses. O(reads) per record, off the relay
    path (the recorder calls :meth:`observe` as it writes a record)."""

    def __init__(self, recent: int = RECENT) -> None:
        self._recent: deque[ResponseReads] = deque(maxlen=recent)

    def observe(self, rec: Record) -> None:
        r = response_reads(rec)
        if r is not None:
            self._recent.append(r)

    def status(self) -> dict[str, Any]:
        acc = BufferingEvidence()
        for r in self._recent:
            acc.add(r)
        return acc.verdict().as_json()
