"""The counter ledger: the engine's ``/metrics`` deltas shared among overlapping requests.

The recorder tells the ledger about every token-bearing chunk (:meth:`CounterLedger.record_chunk`), and about each
scrape that returned (:meth:`CounterLedger.settle`, with the delta since the previous good scrape: a failed scrape
leaves its activity for the next good one, counters being cumulative). Each settled delta becomes an
:class:`~specproxy.attribution.intervals.Interval` of the requests whose decode steps fell in it:

- **Alignment.** The engine counts a whole batch step at once and observes its inter-token latency histogram once per
  request per decode step, so the histogram's count delta says exactly how many decode chunks belong to the interval
  (:func:`~specproxy.attribution.intervals.step_quota`). When our chunks do not add up (another client uses the
  engine too) the cut falls back to the middle of the scrape.
- **Exact members first, a model for the rest** (:mod:`specproxy.attribution.fit`), learned from every interval.

Shares are computed when a request has ended and its closing scrape settled (:meth:`CounterLedger.pop`), with the
models as they stand then; the recorder may hold a record until the acceptance model is stable. Pure bookkeeping:
times come in as numbers, nothing here reads a clock or does IO.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from specproxy.attribution.counts import SpecCounts
from specproxy.attribution.estimates import SpecEstimate
from specproxy.attribution.fit import AcceptanceModel, DraftModel
from specproxy.attribution.intervals import (
    Activity,
    Chunk,
    DraftWeights,
    Evidence,
    Interval,
    cut,
    step_quota,
    unmerge,
)
from specproxy.core.prom import SpecCounters

PARTIAL_DRAFTING_BELOW = 0.95  # drafts per decode step under this: the method drafts on some steps only
MAX_CHUNK_AGE_NS = 120 * 10**9  # without good scrapes, chunks older than this are forgotten
# ... and past this many waiting chunks, the oldest: an age bound alone holds as many as the event rate brings in that
# time. A chunk is a few fixed-size fields, so the count bounds its bytes.
MAX_CHUNKS = 2**18


@dataclass(slots=True)
class _Request:
    workload: str = ""
    intervals: list[Interval] = field(default_factory=list)
    shared: bool = False  # some interval held other requests' steps, not all with exact token counts
    overlapped: bool = False  # some interval held other requests' steps
    incomplete: bool = False  # some steps fell where no counter delta could be had
    reset: bool = False
    ended: bool = False
    truncated: bool = False  # ended cut by max_tokens
    evidence: Evidence = field(default_factory=Evidence)  # how often it drafts, from its settled chunks
    last_read_ns: int | None = None  # when its previous token-bearing read was taken
    unmerged: bool = False  # some of its chunks were found to carry several steps, and were split (unmerge)


@dataclass(frozen=True, slots=True)
class CounterAttribution:
    estimate: SpecEstimate  # ``exact``: no reset, nothing missed, and any overlap only with exact token counts
    intervals: int
    overlapped: bool  # shared an interval with another request (drafts are then split by steps)
    reset: bool
    # the share rested on a per-workload model (acceptance of inexact counts, or ngram's hidden drafts) that too few
    # intervals had pinned down when the request was shared out: each workload's figure may be several points off
    unsettled: bool = False
    # some of its chunks carried several engine steps (a lagging HTTP task merged them), and the share counted them
    # as steps, from the engine's step count (intervals.unmerge): its share does not rest on chunks being steps
    unmerged: bool = False


def _read_at(c: Chunk) -> int:
    return c.t_ns


def read_times(prev_ns: int | None, t_ns: int, n: int) -> list[int]:
    """The times of ``n`` steps that one read at ``t_ns`` brought, the previous read of the same stream having been
    at ``prev_ns``: evenly spaced after it, the last at ``t_ns``.

    The engine emits a step's chunk for every running request at once, step after step. A reader that falls behind
    (a busy host) finds several steps of a stream in one read, taken at one time; stamped alike and sorted by time,
    one stream's steps t and t+1 come before another's step t, and a cut at the engine's step count between t and
    t+1 takes the wrong chunks: multi-token steps move between intervals, and with them the drafts that ngram
    hides in one-token steps. Spread over the gap since the previous read, the steps sort as the engine emitted
    them.
    """
    if n <= 1 or prev_ns is None or prev_ns >= t_ns:
        return [t_ns] * n
    gap = t_ns - prev_ns
    return [prev_ns + gap * (i + 1) // n for i in range(n)]


class MergeWindow:
    """Whether the engine has lately been sending several steps in one chunk: over the last :data:`WINDOW`
    intervals, the engine counted more decode steps than our chunks show, beyond those owed to a late reader.

    Lateness evens out: a step counted in one interval and read in the next is owed there, and taken. Merged steps
    never arrive: what the engine counted beyond our chunks and the change in what is owed grows with every interval
    (and an interval that finds more missing than a late reader explains is cut by time, its owed steps dropped).
    One interval alone cannot tell the two apart; a run of them can. Numbers in, a verdict out."""

    WINDOW: ClassVar[int] = 16
    MIN_STEPS: ClassVar[float] = 64.0  # engine steps in the window before any verdict
    MIN_SHARE: ClassVar[float] = 0.02  # of the engine's steps, missing for good

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: deque[tuple[float, float, int, int]] = deque(maxlen=self.WINDOW)

    def add(self, engine_steps: float, chunk_steps: float, owed_before: int, owed_after: int) -> bool:
        """One interval's steps: the engine's, our chunks', and what was owed before and after it. Whether steps
        are being merged now."""
        self._rows.append((engine_steps, chunk_steps, owed_before, owed_after))
        engine = sum((r[0] for r in self._rows), 0.0)
        if engine < self.MIN_STEPS:
            return False
        missing = engine - sum((r[1] for r in self._rows), 0.0) - (self._rows[-1][3] - self._rows[0][2])
        return missing > self.MIN_SHARE * engine


def counts_of(delta: SpecCounters) -> SpecCounts:
    """The four speculative counts of a counter delta (a family the engine does not publish counts 0)."""
    return SpecCounts(delta.accepted or 0.0, delta.drafts or 0.0, delta.draft_tokens or 0.0, delta.per_position)


# the models' state, the acceptance model's coefficients, whether drafting is partial, the drafting model's weights
_Params = tuple[int, dict[str, tuple[float, float]], bool, DraftWeights | None]


class CounterLedger:
    def __init__(self) -> None:
        self._chunks: deque[Chunk] = deque()
        self._waiting: dict[str, int] = {}  # chunks of each request in _chunks: pending_for without a scan of them
        self._unordered = False  # a chunk arrived read earlier than the last one: sort before the next cut
        self._req: dict[str, _Request] = {}
        self.model = AcceptanceModel()
        self.unattributed = SpecCounts()  # deltas that fell in intervals with no request of ours
        self.total = SpecCounts()
        self.settled_steps = 0.0  # decode steps seen in intervals that got a delta
        self._owed = 0  # decode steps counted by the engine whose chunks arrived after their interval was cut
        self._carried = SpecCounts()  # deltas of intervals whose every step was owed: the next cut's to share
        self.aligned = 0  # intervals cut by the engine's step count
        self.time_cut = 0  # intervals cut by time
        self.unmerged = 0.0  # steps found merged into chunks (a lagging HTTP task at the engine) and put back
        self._merge_window = MergeWindow()
        self._multi: dict[str, Evidence] = {}  # workload -> its steps and multi-token steps, exact counts only
        self.drafting = DraftModel(self._multi)
        # the models' state: it moves on with every settled interval; shares computed for one state are reused
        self._version = 0
        self._params: _Params | None = None
        self._stable: list[AcceptanceModel | DraftModel] = []  # the models found stable so far (see settled)

    # -- what the recorder reports ---------------------------------------------------------------------------------
    def begin(self, rid: str, workload: str = "") -> None:
        self._req[rid] = _Request(workload=workload)

    def record_chunk(self, rid: str, tokens: int, t_ns: int, *, exact: bool, decode: bool = True) -> None:
        """A token-bearing chunk of ``rid`` arrived at ``t_ns`` (``decode=False`` for the prefill chunk)."""
        chunks = self._chunks
        if chunks and chunks[-1].t_ns > t_ns:
            self._unordered = True  # another relay's batch came later than its reads: sorted before the next cut
        chunks.append(Chunk(t_ns, rid, tokens, decode, exact))
        self._waiting[rid] = self._waiting.get(rid, 0) + 1
        # Without good scrapes (the engine's /metrics down for long) nothing settles: forget chunks older than
        # two minutes, or the oldest past MAX_CHUNKS, rather than grow without bound; their requests' counter
        # figures are then incomplete.
        if len(chunks) % 4096 == 0:
            cutoff = t_ns - MAX_CHUNK_AGE_NS
            while chunks and (chunks[0].t_ns < cutoff or len(chunks) > MAX_CHUNKS):
                old = chunks.popleft().request_id
                self._taken(old, 1)
                r = self._req.get(old)
                if r is not None:
                    r.incomplete = True

    def record_read(self, rid: str, tokens: list[int], t_ns: int, *, exact: bool, first_decode: bool) -> None:
        """One read of ``rid`` brought these token-bearing chunks (``first_decode``: the first of them is a decode
        step, not the prefill). Several chunks in one read are steps the reader was late for: each is dated
        between the request's previous read and this one (:func:`read_times`), so a late read of one stream does
        not sort all its steps ahead of other streams' earlier steps at the next cut."""
        r = self._req.get(rid)
        prev = None
        if r is not None:
            prev, r.last_read_ns = r.last_read_ns, t_ns
        if len(tokens) == 1:  # the usual read: one step, at its read time (no times to spread, no lists)
            self.record_chunk(rid, tokens[0], t_ns, exact=exact, decode=first_decode)
            return
        for i, (n, at) in enumerate(zip(tokens, read_times(prev, t_ns, len(tokens)), strict=True)):
            self.record_chunk(rid, n, at, exact=exact, decode=first_decode or i > 0)

    @property
    def pending_chunks(self) -> int:
        return len(self._chunks)

    def end(self, rid: str, *, truncated: bool = False) -> None:
        """The request finished. ``truncated``: cut by max_tokens, so the engine counted accepted drafts of its last
        step that were never emitted (measured on real vLLM): an interval's unexplained accepted tokens are its."""
        r = self._req.get(rid)
        if r is not None:
            r.ended = True
            r.truncated = r.truncated or truncated

    # -- what the scraper reports ----------------------------------------------------------------------------------
    def _in_order(self) -> None:
        """An interval takes its quota of chunks off the front: the earliest read. Chunks of several relays reach
        one bookkeeper batch by batch, one relay's behind another's by its flush delay (more on a busy host); cut in
        arrival order, an interval would take more of one relay's streams than were read in it and move drafts
        between workloads. A few interleaved runs: timsort merges them in about linear time."""
        if self._unordered:
            self._chunks = deque(sorted(self._chunks, key=_read_at))
            self._unordered = False

    def baseline(self, boundary_ns: int) -> None:
        """The first good scrape: activity before it has no delta, so those requests' counter figures are incomplete."""
        self.time_cut += 1
        self._in_order()
        for rid in self._cut(boundary_ns, None):
            r = self._req.get(rid)
            if r is not None:
                r.incomplete = True

    def settle(self, boundary_ns: int, delta: SpecCounters, *, reset: bool = False, slack_ns: int = 0) -> None:
        self._in_order()
        counts = counts_of(delta)
        self.total = self.total + counts
        engine_steps = None if reset else delta.decode_steps
        available = 0
        if engine_steps is not None:
            available = sum(1 for c in self._chunks if c.decode and c.t_ns <= boundary_ns + slack_ns)
        owed_before = self._owed
        quota, self._owed = step_quota(engine_steps, self._owed, available, self.in_flight())
        if quota is None:
            self.time_cut += 1
        else:
            self.aligned += 1
        members = self._cut(boundary_ns, quota)
        unmerged: dict[str, float] = {}
        if engine_steps is not None:
            chunk_steps = sum(a.steps for a in members.values())
            merging = self._merge_window.add(engine_steps, chunk_steps, owed_before, self._owed)
            # A request alone in its interval with fewer chunks than the engine's steps and more tokens beyond one per
            # chunk than it accepted had steps merged: a late reader leaves the first short and the second long, or
            # the other way round, never both (unmerge checks the second)
            alone = sum(1 for a in members.values() if a.steps > 0) == 1
            if merging or (alone and engine_steps > chunk_steps):
                unmerged = unmerge(members, counts)
        for rid, part in unmerged.items():
            self.unmerged += part
            if (req := self._req.get(rid)) is not None:
                req.unmerged = True
        steps = sum(a.steps for a in members.values())  # the merged steps put back included
        foreign = 0.0
        if quota is None and engine_steps is not None:
            foreign = max(0.0, engine_steps - steps)
        workloads = {rid: self._req[rid].workload for rid in members if rid in self._req}
        if steps <= 0 and self._owed > 0:
            # every step it counted is owed (a reader behind all its streams): its delta goes with them
            self._carried = self._carried + counts
            return
        counts, self._carried = counts + self._carried, SpecCounts()
        interval = Interval(counts, members, workloads, foreign)
        self._version += 1
        self.settled_steps += steps
        if steps <= 0:
            self.unattributed = self.unattributed + counts
            return
        overlapped, shared = interval.overlapped, interval.shared
        for rid, act in members.items():
            r = self._req.get(rid)
            if r is None:
                continue
            r.evidence.add(act)
            interval.evidence[rid] = r.evidence
            if act.exact:
                self._multi.setdefault(r.workload, Evidence()).add(act)
            r.shared = r.shared or shared
            r.overlapped = r.overlapped or overlapped
            r.reset = r.reset or reset
            r.intervals.append(interval)
        self.drafting.evidence_grew()
        if not reset:
            if (obs := interval.acceptance_observation()) is not None:
                self.model.add(*obs)
            if (drafted := interval.draft_observation()) is not None:
                self.drafting.add(*drafted)

    # -- what the recorder asks ------------------------------------------------------------------------------------
    @property
    def draft_fraction(self) -> float | None:
        """Drafts per decode step seen so far: about 1 when every step drafts (MTP, EAGLE, draft models), lower
        when the method drafts only on some steps (ngram misses), where chunk-derived drafts overcount."""
        if self.settled_steps < 20:
            return None
        return self.total.drafts / self.settled_steps

    @property
    def partial_drafting(self) -> bool:
        fraction = self.draft_fraction
        return fraction is not None and fraction < PARTIAL_DRAFTING_BELOW

    def _models(self) -> _Params:
        """The fitted models as they stand, solved once per state (many requests end between two scrapes)."""
        if self._params is None or self._params[0] != self._version:
            partial = self.partial_drafting
            self._params = (
                self._version,
                self.model.coefficients(),
                partial,
                self.drafting.current() if partial else None,
            )
        return self._params

    def pending_for(self, rid: str) -> bool:
        """Whether some chunk of ``rid`` still waits for a counter delta. (A scan of the chunks waiting was, under
        bursts, a twentieth of the bookkeeper's time: each request ending asks, and many end together.)"""
        return rid in self._waiting

    def _cut(self, boundary_ns: int, quota: int | None) -> dict[str, Activity]:
        members = cut(self._chunks, boundary_ns=boundary_ns, quota=quota)
        for rid, act in members.items():
            self._taken(rid, act.chunks)
        return members

    def _taken(self, rid: str, n: int) -> None:
        left = self._waiting.get(rid, 0) - n
        if left > 0:
            self._waiting[rid] = left
        else:
            self._waiting.pop(rid, None)

    def needs_model(self, rid: str) -> bool:
        """Whether this request's share of accepted tokens rests on the acceptance model (inexact counts, shared)."""
        r = self._req.get(rid)
        return r is not None and self._rests_on_model(r)

    def needs_draft_model(self, rid: str) -> bool:
        """Whether this request's drafts rest on the drafting model: the engine drafts, on some steps only, and the
        request shared an interval, so its share of the drafts hidden in one-token steps is modelled. (An engine
        that never drafted reads as drafting on no step: nothing to model.)"""
        r = self._req.get(rid)
        return r is not None and self._rests_on_drafting(r)

    @staticmethod
    def _rests_on_model(r: _Request) -> bool:
        return any(iv.needs_model for iv in r.intervals)

    def _rests_on_drafting(self, r: _Request) -> bool:
        return r.overlapped and self.total.drafts > 0 and self.partial_drafting

    def in_flight(self) -> int:
        return sum(1 for r in self._req.values() if not r.ended)

    def pop(self, rid: str) -> CounterAttribution | None:
        """Final figures for an ended request (None when none of its steps was ever covered by a delta)."""
        r = self._req.pop(rid, None)
        if r is None:
            return None
        r.incomplete = r.incomplete or self.pending_for(rid)  # some of its steps were never covered by a delta
        return self._share(rid, r, r.incomplete, take=True)

    def peek(self, rid: str) -> CounterAttribution | None:
        """The figures :meth:`pop` would give now, the request kept: what a record written before its model is
        stable says, to be corrected once it is."""
        r = self._req.get(rid)
        return None if r is None else self._share(rid, r, r.incomplete or self.pending_for(rid))

    def _share(self, rid: str, r: _Request, incomplete: bool, take: bool = False) -> CounterAttribution | None:
        """This request's figures; ``take``: it is leaving the ledger, and its part of each interval's modelled
        drafts and accepted tokens is its for good (:meth:`Interval.draft_share`, :meth:`Interval.accepted_share`)."""
        if not r.intervals:
            return None
        version, coef, partial, weights = self._models()
        if r.truncated and not incomplete:
            # (Incomplete: its last step's interval never settled, and no interval may take the tail for it.)
            # The unemitted drafts of a max_tokens cut are counted in the step that sent its last chunk, so only
            # the interval holding that step may give them to it. An earlier interval's unexplained remainder is not
            # its: it kept streaming after (and on a busy machine late stamps leave remainders of both signs).
            r.intervals[-1].truncated.add(rid)
        mine = SpecCounts()
        for interval in r.intervals:
            drafts, draft_tokens = interval.draft_share(rid, weights, partial, version, take)
            accepted, pos = interval.accepted_share(rid, coef, version, take)
            mine = mine + SpecCounts(accepted, drafts, draft_tokens, tuple(pos))
        est = SpecEstimate(
            mine,
            k=mine.draft_tokens / mine.drafts if mine.drafts else None,
            # with partial drafting, an overlapped request's drafts are modelled, not known
            exact=not (r.shared or incomplete or r.reset or (partial and r.overlapped)),
        )
        unsettled = (self._rests_on_model(r) and not self.settled(self.model)) or (
            self._rests_on_drafting(r) and not self.settled(self.drafting)
        )
        return CounterAttribution(est, len(r.intervals), r.overlapped, r.reset, unsettled, r.unmerged)

    def settled(self, model: AcceptanceModel | DraftModel) -> bool:
        """Whether ``model`` (:attr:`model` or :attr:`drafting`) has been stable: it stays so, more intervals only pin
        it further, so it is not asked again once it was. What the recorder holds records for, and what a record's
        ``unsettled`` says was not yet so."""
        if model not in self._stable:
            if not model.stable():
                return False
            self._stable.append(model)
        return True
