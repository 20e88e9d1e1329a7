"""One scrape interval: which decode steps of which requests fell in it, and how its counter delta is shared.

The engine counts a whole batch step at once; the recorder scrapes its counters around requests. Between two good
scrapes the counters grew by a delta; the chunks that arrived in between are the interval's *activity*. This module
cuts the stream of chunks into intervals (:func:`cut`) and shares one interval's delta among its members
(:meth:`Interval.accepted_share`, :meth:`Interval.draft_share`). The models those shares use are learned across
intervals (:mod:`specproxy.attribution.fit`); :meth:`Interval.acceptance_observation` and
:meth:`Interval.draft_observation` are what each interval teaches them. Pure: numbers in, numbers out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from specproxy.attribution.counts import SpecCounts


@dataclass(slots=True)  # not frozen: made per event, and a frozen __init__ is several times slower
class Chunk:
    """A token-bearing chunk as the ledger keeps it until an interval takes it."""

    t_ns: int
    request_id: str
    tokens: int
    decode: bool  # a decode step (the first token-bearing chunk is prefill: tokens, but no speculative step)
    exact: bool  # the token count came from usage or token ids


@dataclass(slots=True)
class Activity:
    """One request's chunks within one interval."""

    steps: float = 0.0  # decode steps (the prefill chunk is not a speculative step)
    tokens: float = 0.0  # tokens of the decode chunks, as counted (exactly or approximately)
    exact: bool = True  # every count came from usage or token ids
    per_position: list[float] = field(default_factory=list)  # steps that accepted position i (from chunk sizes)
    multi: float = 0.0  # steps that brought more than one token: they certainly drafted
    chunks: int = 0  # every chunk, the prefill's too

    def add(self, tokens: int, *, decode: bool, exact: bool) -> None:
        self.chunks += 1
        if decode:
            self.steps += 1
            self.tokens += tokens
            if tokens > 1:  # a step that brought n tokens accepted positions 0 .. n-2
                self.multi += 1
                if len(self.per_position) < tokens - 1:
                    self.per_position.extend([0.0] * (tokens - 1 - len(self.per_position)))
                for i in range(tokens - 1):
                    self.per_position[i] += 1
        if not exact:
            self.exact = False

    @property
    def extra_tokens(self) -> float:
        """Tokens beyond one per decode step: the accepted tokens, exactly so when the count is exact (every step
        brought 1 + accepted tokens), else an approximate measure of them."""
        return max(0.0, self.tokens - self.steps)

    @property
    def known_drafted(self) -> float:
        """Steps known to have drafted: a step that brought several tokens did (only trusted with exact counts)."""
        return self.multi if self.exact else 0.0

    @property
    def unknown(self) -> float:
        """Steps whose chunk does not show whether they drafted."""
        return self.steps - self.known_drafted

    def position(self, i: int) -> float:
        return self.per_position[i] if i < len(self.per_position) else 0.0


@dataclass(slots=True)
class Evidence:
    """A request's decode steps over every interval settled so far, and how many of them are known to have drafted:
    how often *this* request drafts, where only some steps do (ngram drafts on a match, and a reply that repeats its
    context matches far more often than one that does not)."""

    steps: float = 0.0
    multi: float = 0.0
    exact: bool = True

    def add(self, a: Activity) -> None:
        self.steps += a.steps
        self.multi += a.multi
        self.exact = self.exact and a.exact

    def multi_odds(self, workload_multi: float | None) -> float | None:
        """The odds ``f / (1 - f)`` of this request's steps bringing several tokens, its own share shrunk towards its
        workload's (``workload_multi``) while it has few steps; None when not known (inexact counts show no
        multi-token steps, or no figure for its workload)."""
        if not self.exact or workload_multi is None:
            return None
        f = min(MAX_MULTI, (self.multi + PRIOR_STEPS * workload_multi) / (self.steps + PRIOR_STEPS))
        return f / (1.0 - f)

    def hidden_rate(self, workload_multi: float | None, first_accept: float | None) -> float | None:
        """How likely one of this request's one-token steps is to have drafted and had every draft rejected; None
        when not known (see :meth:`multi_odds`, or no ``first_accept``).

        A drafting step brings several tokens when its first draft is accepted (probability ``first_accept``, a).
        A request that drafts on a share p of its steps brings several tokens on f = p a of them and one token on
        the rest, of which p (1 - a) drafted: q = p (1 - a) / (1 - f) = f / (1 - f) * (1 - a) / a, and 1 when
        f >= a (every step drafts).
        """
        odds = self.multi_odds(workload_multi)
        if odds is None or first_accept is None or not 0.0 < first_accept <= 1.0:
            return None
        return min(1.0, odds * (1.0 - first_accept) / first_accept)


def drafts_at_rate(ev: Evidence, workload_multi: float | None) -> bool:
    """Whether a request's one-token steps draft at its workload's rate rather than by its odds: no multi-token step
    to go by (its counts are inexact, or none of its workload's steps brought several tokens)."""
    return not ev.exact or workload_multi == 0.0


@dataclass(frozen=True, slots=True)
class DraftWeights:
    """What says how likely a one-token step is to have drafted, per workload: its first draft position's
    acceptance (for requests with exact counts, with their own evidence), its drafts per step (for requests whose
    counts are inexact, and for a workload none of whose steps brought several tokens: no multi-token steps to go
    by, whether it drafts nothing or has every draft rejected), and its share of multi-token steps (what a
    request's own is shrunk towards). A workload missing from a mapping: its one-token steps weigh 1 each."""

    first_accept: Mapping[str, float] = field(default_factory=dict)
    inexact_rate: Mapping[str, float] = field(default_factory=dict)
    workload_multi: Mapping[str, float] = field(default_factory=dict)

    def weight(self, workload: str, ev: Evidence, unknown: float) -> float:
        """A member's one-token steps in an interval, each weighted by how likely it is to have drafted."""
        if drafts_at_rate(ev, self.workload_multi.get(workload)):
            rate = self.inexact_rate.get(workload)
            return unknown if rate is None else unknown * min(1.0, rate)
        q = ev.hidden_rate(self.workload_multi.get(workload), self.first_accept.get(workload))
        return unknown if q is None else unknown * q


PRIOR_STEPS = 3.0  # a request's own drafting evidence counts as much as its workload's after this many steps
MAX_MULTI = 0.99  # a request that brought several tokens on every step: odds kept finite


def cut(chunks: deque[Chunk], *, boundary_ns: int, quota: int | None) -> dict[str, Activity]:
    """Take an interval's chunks off the front of ``chunks``: ``quota`` decode steps when the engine's step count
    is known (whatever their times), else every chunk that arrived by ``boundary_ns``."""
    merged: dict[str, Activity] = {}
    taken = 0
    while chunks:
        c = chunks[0]
        if quota is not None:
            if taken >= quota:
                break
        elif c.t_ns > boundary_ns:
            break
        chunks.popleft()
        act = merged.get(c.request_id)
        if act is None:
            act = merged[c.request_id] = Activity()
        act.add(c.tokens, decode=c.decode, exact=c.exact)
        if c.decode:
            taken += 1
    return merged


LATE_STEPS = 16  # steps a reader may be behind on each stream in flight before missing steps read as foreign


def unmerge(members: Mapping[str, Activity], delta: SpecCounts) -> dict[str, float]:
    """Steps that reached us merged into one chunk, put back: how many, per member (none when none is seen). Asked
    while the engine is merging steps (:class:`~specproxy.attribution.ledger.MergeWindow`), and for a request alone
    in its interval with fewer chunks than the engine's steps.

    An engine's HTTP task that falls behind its steps sends the steps it missed as one chunk (vLLM's output
    collector merges what its reader has not taken; at GPU speeds a busy API server does so often). Such a chunk
    looks like one step that accepted drafts, so the exact members' tokens beyond one per chunk add up to more than
    the accepted tokens the engine counted: the surplus is merged steps. It is shared by the members' chunks (every
    request in a batch steps at the same pace, and a lagging reader merges each stream alike), none taking more than
    its tokens beyond one per chunk. Each member then has those steps back, and its accepted tokens (tokens - steps)
    fall by as much, so that they add up to the delta's; its multi-token steps and accepted positions, read off
    chunk sizes, fall in proportion. (The engine's step count beyond our chunks says the same, but a chunk that
    straddles a scrape moves steps across it: the smaller of two such noisy figures would fall short each time.)"""
    exact = {m: a for m, a in members.items() if a.exact and a.steps > 0}
    beyond = {m: a.tokens - a.steps for m, a in exact.items()}
    surplus = sum(beyond.values()) - delta.accepted
    if surplus < 1.0:
        return {}
    parts = {m: v for m, v in fill(surplus, {m: a.steps for m, a in exact.items()}, beyond).items() if v > 0.0}
    for m, part in parts.items():
        a = exact[m]
        keep = 1.0 - part / beyond[m]
        a.steps += part
        a.multi *= keep
        a.per_position = [p * keep for p in a.per_position]
    return parts


def step_quota(engine_steps: float | None, owed: int, available: int, in_flight: int) -> tuple[int | None, int]:
    """How many of our decode chunks an interval takes, and how many it leaves owed to the next one.

    ``engine_steps`` is the engine's count of decode steps in the interval (the inter-token-latency histogram's
    count grows by one per request per step), ``owed`` the steps a previous interval counted whose chunks had not
    arrived, ``available`` our decode chunks that arrived by the scrape (with slack). Chunks of counted steps can
    still be on their way: take what is here and owe the rest, up to :data:`LATE_STEPS` per stream in flight (at
    least one, for the last step of a request whose end raced the scrape). A reader on a busy host falls several
    steps behind every stream; owed, its late chunks meet the next interval's cut, where counted as foreign they
    would take a share of the delta to nobody. More missing than that means steps our streams cannot explain
    (another client, a non-streamed request): None, cut by time. A stream whose end was read has no chunk on its way.
    """
    if engine_steps is None:
        return None, owed
    quota = round(engine_steps) + owed
    short = quota - available
    if short <= 0:
        return quota, 0
    if short <= max(1, LATE_STEPS * in_flight):
        return quota - short, short
    return None, 0


def fill(amount: float, shares: Mapping[str, float], caps: Mapping[str, float]) -> dict[str, float]:
    """``amount`` shared in proportion to ``shares``, none above its cap: what a member at its cap cannot take goes
    to the others, still in proportion to their shares (water filling), so the parts add up to ``amount`` unless
    every member is at its cap. Members are taken in order of cap per share, so it costs O(n log n)."""
    out = dict.fromkeys(shares, 0.0)
    left, weight = amount, sum(v for v in shares.values() if v > 0)
    order = sorted((m for m, v in shares.items() if v > 0), key=lambda m: max(0.0, caps[m]) / shares[m])
    for i, m in enumerate(order):
        if left <= 0 or weight <= 0:
            break
        part = left * shares[m] / weight
        cap = max(0.0, caps[m])
        if part < cap:  # the rest are further from their caps: each takes its proportion of what is left
            for r in order[i:]:
                out[r] = left * shares[r] / weight
            break
        out[m] = cap
        left -= cap
        weight -= shares[m]
    return out


@dataclass(slots=True)
class Interval:
    """One settled scrape interval; its delta is shared out when each member request ends."""

    delta: SpecCounts
    members: dict[str, Activity]
    workloads: dict[str, str]
    # the engine's own decode steps in the interval, when known and more than our chunks show: steps of requests we
    # did not stream (another client, a non-streamed request) share the delta, so ours take only their part
    foreign_steps: float = 0.0
    truncated: set[str] = field(default_factory=set)  # members that ended cut by max_tokens
    # each member's drafting evidence over its whole life (shared, growing objects: see Evidence)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    # what sharing needs, computed once per state of the models (``version``) rather than once per member: a member's
    # share is then a lookup, and an interval of n requests costs O(n), not O(n^2), to share out
    _draft_plan: tuple[int, dict[str, float]] | None = field(default=None, init=False, repr=False)
    # the drafts hidden in one-token steps not yet taken by a member that ended (None: none taken yet), and who took:
    # each member takes its part once, at the models' state when it ends, and the next share what is left, so the
    # members' drafts add up to the delta's even when the models moved between their ends
    _draft_pool: float | None = field(default=None, init=False, repr=False)
    _draft_taken: set[str] = field(default_factory=set, init=False, repr=False)
    # the same for the accepted tokens the inexact members share: what is left of them (total, per position)
    _accept_pool: tuple[float, list[float]] | None = field(default=None, init=False, repr=False)
    _accept_taken: set[str] = field(default_factory=set, init=False, repr=False)
    _accept_plan: tuple[int, _AcceptPlan] | None = field(default=None, init=False, repr=False)
    steps: float = field(init=False)  # the members' decode steps
    known_drafted: float = field(init=False)  # ... of them known to have drafted
    all_exact: bool = field(init=False)

    def __post_init__(self) -> None:
        # summed once (the members are fixed once cut): each member asks as it ends, and a sum per ask would make
        # sharing out n requests cost O(n^2)
        acts = self.members.values()
        self.steps, self.known_drafted = sum(a.steps for a in acts), sum(a.known_drafted for a in acts)
        self.all_exact = all(a.exact for a in acts)

    @property
    def overlapped(self) -> bool:
        """Some member shared the interval with another request's steps (ours or foreign)."""
        return sum(1 for a in self.members.values() if a.steps > 0) > 1 or self.foreign_steps > 0

    @property
    def shared(self) -> bool:
        """Sharing makes a member's figure approximate: exact members' accepted tokens are known (tokens - steps),
        so only an overlap with an inexact member, or with foreign steps, does."""
        stepped = [a for a in self.members.values() if a.steps > 0]
        return (len(stepped) > 1 and not all(a.exact for a in stepped)) or self.foreign_steps > 0

    @property
    def needs_model(self) -> bool:
        """Whether the members' shares of accepted tokens rest on the acceptance model."""
        return len(self.members) > 1 and not self.all_exact

    # -- what the interval teaches the models ----------------------------------------------------------------------
    def acceptance_observation(self) -> tuple[dict[str, tuple[float, float]], float] | None:
        """(workload -> (steps, approximate tokens) of inexact members, accepted delta less exact members' part);
        None when every member is exact (nothing to learn)."""
        if self.all_exact:
            return None
        remainder = self.delta.accepted - sum(a.extra_tokens for a in self.members.values() if a.exact)
        by_w: dict[str, tuple[float, float]] = {}
        for rid, a in self.members.items():
            if not a.exact:
                w = self.workloads.get(rid, "")
                w_steps, w_text = by_w.get(w, (0.0, 0.0))
                by_w[w] = (w_steps + a.steps, w_text + a.tokens)
        return by_w, remainder

    def draft_observation(self) -> tuple[float, float, list[tuple[str, float, Evidence]]] | None:
        """(drafts beyond the steps known to have drafted, decode steps, each member's workload, steps not known to
        have drafted and evidence): what teaches the drafting model
        (:class:`~specproxy.attribution.fit.DraftModel`); None without drafts. An interval cut by time can hold
        foreign steps: mostly our own late chunks when a busy reader falls behind, so it teaches all the same (left
        out, a busy reader's model would have little to learn from)."""
        if self.delta.drafts <= 0:
            return None
        members = [
            (self.workloads.get(rid, ""), a.unknown, self.evidence.get(rid) or Evidence(exact=a.exact))
            for rid, a in self.members.items()
        ]
        return self.delta.drafts - self.known_drafted, self.steps, members

    # -- shares ----------------------------------------------------------------------------------------------------
    def draft_share(
        self, rid: str, weights: DraftWeights | None, partial: bool, version: int | None = None, take: bool = False
    ) -> tuple[float, float]:
        """This request's drafts and draft tokens in the interval.

        When every step drafts (MTP, EAGLE, draft models) drafts follow steps. When only some do (``partial``:
        ngram), a step that brought several tokens certainly drafted, and the remaining drafts (all rejected) belong
        to one-token steps. How likely a one-token step is to have drafted differs by request: it follows from the
        share of the request's steps that brought several tokens and its workload's first draft position's
        acceptance (``weights``, fitted across intervals: :class:`~specproxy.attribution.fit.DraftModel`; see
        :meth:`Evidence.hidden_rate`). The remaining drafts are shared by one-token steps weighted so, with each
        member's evidence as it stands now (its whole life, for a member that has ended), none taking more than its
        one-token steps: what one cannot take goes to the others (:func:`fill`); where the steps known to have drafted
        outnumber the delta's drafts, the known parts shrink to it. ``take``: the member has ended and
        keeps this share; those after it share what it left, so the members' drafts add up to the delta's however the
        models moved between their ends. Draft tokens follow drafts. ``version``: the models' state; the weights are
        computed once per version (a member taking its part leaves the others' parts as they were: water filling
        what remains gives each the same).
        """
        drafts = self.delta.drafts
        me = self.members[rid]
        if not partial or (len(self.members) == 1 and not self.foreign_steps):
            total_steps = self.steps + self.foreign_steps
            mine = drafts * me.steps / total_steps if total_steps else 0.0
        else:
            plan = self._draft_plan
            if plan is None or version is None or plan[0] != version:
                rest = self._hidden_left()
                open_ = {m: a for m, a in self.members.items() if m not in self._draft_taken}
                w = weights or DraftWeights()
                shares = {
                    m: w.weight(self.workloads.get(m, ""), self.evidence.get(m) or Evidence(exact=a.exact), a.unknown)
                    for m, a in open_.items()
                }
                if sum(shares.values()) <= 0:
                    shares = {m: a.unknown for m, a in open_.items()}
                caps = {m: a.unknown for m, a in open_.items()}
                plan = self._draft_plan = (-1 if version is None else version, fill(rest, shares, caps))
            extra = plan[1].get(rid, 0.0)
            if take and rid not in self._draft_taken:
                self._draft_pool = max(0.0, self._hidden_left() - extra)
                self._draft_taken.add(rid)
            # more steps known to have drafted than the engine counted drafts: some of those steps' drafts were
            # counted in a neighbouring interval (a busy reader stamps chunks late), where they will be missing.
            # The delta is the truth here: the known parts shrink to it, so the shares still add up to it
            known = me.known_drafted * min(1.0, drafts / self.known_drafted) if self.known_drafted else 0.0
            mine = known + extra
        tokens = self.delta.draft_tokens * mine / drafts if drafts else 0.0
        return mine, tokens

    def _hidden_left(self) -> float:
        """The drafts hidden in one-token steps that no ended member has taken yet."""
        if self._draft_pool is None:
            return max(0.0, self.delta.drafts - self.known_drafted)
        return self._draft_pool

    def accepted_share(
        self, rid: str, coef: Mapping[str, tuple[float, float]], version: int | None = None, take: bool = False
    ) -> tuple[float, list[float]]:
        """This request's accepted tokens and per-position counts in the interval.

        Exact members (usage or token ids) accepted exactly tokens - steps, at the positions their chunks show.
        What remains of the delta goes to the inexact members: between workloads as the acceptance model ``coef``
        predicts them here (or by steps without a model), within a workload by text beyond one token per step (an
        approximate count, but the same tokenizer for the same kind of text), else by steps. With no inexact
        member, what remains is the unemitted tail of a max_tokens cut, when a member ended so. ``version``: the
        acceptance model's state; what does not depend on the member is computed once per version. ``take``: an
        inexact member has ended and keeps its share; those after it share what it left (as with drafts), so the
        shares add up to the delta however the model moved between their ends.
        """
        k = len(self.delta.per_position)
        me = self.members[rid]
        cached = self._accept_plan
        if cached is None or version is None or cached[0] != version:
            cached = self._accept_plan = (-1 if version is None else version, self._plan_acceptance(coef))
        plan = cached[1]
        if me.exact:
            accepted = me.extra_tokens
            pos = [me.position(i) for i in range(k)]
            rest = plan.exact_rest
            if not plan.fractions and not self.foreign_steps and rid in self.truncated and rest > 0:
                # the unemitted drafts of the last step: at most k tokens per request cut
                cut = sum(1 for m in self.truncated if self.members[m].exact)
                extra = min(rest / cut, float(k)) if k else rest / cut
                f = extra / rest
                accepted += extra
                pos = [p + max(0.0, r) * f for p, r in zip(pos, plan.exact_rest_pos, strict=True)]
            return accepted, pos
        fraction = plan.fractions.get(rid, 0.0)
        accepted, pos = plan.rest * fraction, [max(0.0, r) * fraction for r in plan.rest_pos]
        if take and rid not in self._accept_taken:
            # within one version the plan stays: the others' fractions of the whole are their parts of what is left
            rest, rest_pos = self._accept_pool or (plan.rest, plan.rest_pos)
            self._accept_pool = (rest - accepted, [r - p for r, p in zip(rest_pos, pos, strict=True)])
            self._accept_taken.add(rid)
        return accepted, pos

    def _plan_acceptance(self, coef: Mapping[str, tuple[float, float]]) -> _AcceptPlan:
        per_position = self.delta.per_position
        k = len(per_position)
        exact_ids = [m for m, a in self.members.items() if a.exact]
        exact_rest = self.delta.accepted - sum(self.members[m].extra_tokens for m in exact_ids)
        exact_rest_pos = [per_position[i] - sum(self.members[m].position(i) for m in exact_ids) for i in range(k)]
        inexact: dict[str, list[str]] = {}
        for m, a in self.members.items():
            if not a.exact and m not in self._accept_taken:
                inexact.setdefault(self.workloads.get(m, ""), []).append(m)
        if not inexact:
            # (every inexact member took its part: the remainder was theirs, not a max_tokens cut's tail)
            return _AcceptPlan(exact_rest, exact_rest_pos, dict.fromkeys(self._accept_taken, 0.0), 0.0, [0.0] * k)
        if exact_rest <= 0:  # nothing left for the inexact members
            return _AcceptPlan(
                exact_rest, exact_rest_pos, {m: 0.0 for ids in inexact.values() for m in ids}, 0.0, [0.0] * k
            )
        rest, rest_pos = exact_rest, exact_rest_pos
        if self.foreign_steps:  # the remainder is also the foreign steps': keep only our inexact steps' part
            ours = sum(a.steps for a in self.members.values() if not a.exact)
            f = ours / (ours + self.foreign_steps) if ours + self.foreign_steps else 0.0
            rest *= f
            rest_pos = [r * f for r in rest_pos]
        if self._accept_pool is not None:  # what the members that took theirs left
            rest, rest_pos = self._accept_pool
        model: dict[str, float] = {}
        for w, ids in inexact.items():
            steps = sum(self.members[m].steps for m in ids)
            w_text = sum(self.members[m].tokens for m in ids)
            coef_steps, coef_text = coef.get(w, (1.0, 0.0))
            model[w] = max(0.0, coef_steps * steps + coef_text * w_text)
        if sum(model.values()) <= 0:
            model = {w: sum(self.members[m].steps for m in ids) for w, ids in inexact.items()}
        model_total = sum(model.values()) or 1.0
        fractions: dict[str, float] = {}
        for w, ids in inexact.items():
            text = {m: self.members[m].extra_tokens for m in ids}
            base = text if sum(text.values()) > 0 else {m: self.members[m].steps for m in ids}
            base_total = sum(base.values()) or 1.0
            for m in ids:
                fractions[m] = (model[w] / model_total) * (base[m] / base_total)
        return _AcceptPlan(exact_rest, exact_rest_pos, fractions, rest, rest_pos)


@dataclass(frozen=True, slots=True)
class _AcceptPlan:
    """One interval's accepted-token remainder and how it is split, for one state of the acceptance model."""

    exact_rest: float  # the delta less the exact members' own accepted tokens
    exact_rest_pos: list[float]  # the same per position
    fractions: dict[str, float]  # inexact member -> its fraction of ``rest`` (empty: every member is exact)
    rest: float  # what the inexact members share (the foreign steps' part taken out)
    rest_pos: list[float]
