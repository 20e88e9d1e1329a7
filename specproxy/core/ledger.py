"""Counter deltas shared among overlapping requests.

The engine's ``/metrics`` counters are exact but global. The recorder scrapes them around requests and every
~250 ms while requests are in flight; each scrape interval's deltas are shared among the requests whose decode steps
fell in it. Three things make that work also when many requests overlap:

- **Alignment.** The engine counts a whole batch step at once and observes its inter-token latency histogram once per
  request per decode step, so the histogram's count delta says exactly how many decode chunks belong to the interval.
  The interval is cut after that many decode chunks in arrival order, wherever the scrape landed in time; when our
  chunks do not add up (another client uses the engine too) the cut falls back to the middle of the scrape.
- **Exact members first.** A request whose token counts are exact (usage or token ids) accepted exactly
  tokens - steps in the interval.
- **A per-workload acceptance model for the rest.** Without exact counts, each interval's remaining accepted tokens
  are explained across intervals by each workload's decode steps and approximate text (:class:`AcceptanceModel`).
  An interval's remainder is split between workloads by that model, and within a workload by each request's text
  (more text per step, more accepted).

Shares are computed when a request ends, with the model as it stands then; the recorder may hold a record until the
model is stable (``AcceptanceModel.stable``). Drafts and draft tokens are shared in proportion to decode steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from specproxy.core.attribution import SpecEstimate
from specproxy.core.prom import SpecCounters


@dataclass(slots=True)
class _Activity:
    steps: float = 0.0  # decode steps (the prefill chunk is not a speculative step)
    tokens: float = 0.0  # tokens of the decode chunks, as counted (exactly or approximately)
    exact: bool = True  # every count came from usage or token ids
    per_position: list[float] = field(default_factory=list)  # steps that accepted position i (from chunk sizes)
    multi: float = 0.0  # steps that brought more than one token: they certainly drafted


@dataclass(slots=True)
class _Interval:
    """One settled scrape interval; its accepted-token delta is shared out when each member request ends."""

    accepted: float
    per_position: list[float]
    members: dict[str, _Activity]
    workloads: dict[str, str]
    drafts: float = 0.0
    draft_tokens: float = 0.0
    # the engine's own decode steps in the interval, when known and more than our chunks show: steps of requests we
    # did not stream (another client, a non-streamed request) share the delta, so ours take only their part
    foreign_steps: float = 0.0
    truncated: set[str] = field(default_factory=set)  # members that ended cut by max_tokens

    def known_drafted(self, a: _Activity) -> float:
        return a.multi if a.exact else 0.0

    def draft_share(self, rid: str, q: Mapping[str, float], partial: bool) -> tuple[float, float]:
        """This request's drafts and draft tokens in the interval.

        When every step drafts (MTP, EAGLE, draft models) drafts follow steps. When only some do (ngram), a step
        that brought several tokens certainly drafted; the remaining drafts go to the other steps as each
        workload's fitted drafting rate ``q`` predicts them (:class:`DraftModel`). Draft tokens follow drafts.
        """
        me = self.members[rid]
        steps = sum(a.steps for a in self.members.values())
        if not partial or (len(self.members) == 1 and not self.foreign_steps):
            total_steps = steps + self.foreign_steps
            mine = self.drafts * me.steps / total_steps if total_steps else 0.0
        else:
            known = sum(self.known_drafted(a) for a in self.members.values())
            rest = max(0.0, self.drafts - known)
            weights = {
                m: q.get(self.workloads.get(m, ""), 1.0) * (a.steps - self.known_drafted(a))
                for m, a in self.members.items()
            }
            total = sum(weights.values())
            if total <= 0:
                weights = {m: a.steps - self.known_drafted(a) for m, a in self.members.items()}
                total = sum(weights.values())
            mine = min(me.steps, self.known_drafted(me) + (rest * weights[rid] / total if total > 0 else 0.0))
        tokens = self.draft_tokens * mine / self.drafts if self.drafts else 0.0
        return mine, tokens

    def attribute(self, rid: str, coef: Mapping[str, tuple[float, float]]) -> tuple[float, list[float]]:
        """This request's accepted tokens and per-position counts in the interval.

        Exact members (usage or token ids) accepted exactly tokens - steps, at the positions their chunks show.
        What remains of the delta goes to the inexact members: between workloads as the model predicts them here
        (or by steps without a model), within a workload by text beyond one token per step (an approximate count,
        but the same tokenizer for the same kind of text), else by steps. With no inexact member, what remains is
        the unemitted tail of a max_tokens cut, when a member ended so.
        """
        k = len(self.per_position)
        me = self.members[rid]
        exact_ids = [m for m, a in self.members.items() if a.exact]
        rest = self.accepted - sum(max(0.0, self.members[m].tokens - self.members[m].steps) for m in exact_ids)
        rest_pos = [self.per_position[i] - sum(_pos(self.members[m], i) for m in exact_ids) for i in range(k)]
        inexact: dict[str, list[str]] = {}
        for m, a in self.members.items():
            if not a.exact:
                inexact.setdefault(self.workloads.get(m, ""), []).append(m)
        if me.exact:
            accepted = max(0.0, me.tokens - me.steps)
            pos = [_pos(me, i) for i in range(k)]
            cut = [m for m in exact_ids if m in self.truncated]
            if not inexact and not self.foreign_steps and rid in cut and rest > 0:
                # the unemitted drafts of the last step: at most k tokens per request cut
                extra = min(rest / len(cut), float(k)) if k else rest / len(cut)
                f = extra / rest
                accepted += extra
                pos = [p + max(0.0, r) * f for p, r in zip(pos, rest_pos, strict=True)]
            return accepted, pos
        if rest <= 0:
            return 0.0, [0.0] * k
        if self.foreign_steps:  # the remainder is also the foreign steps': keep only our inexact steps' part
            ours = sum(a.steps for a in self.members.values() if not a.exact)
            f = ours / (ours + self.foreign_steps) if ours + self.foreign_steps else 0.0
            rest *= f
            rest_pos = [r * f for r in rest_pos]
        model: dict[str, float] = {}
        for w, ids in inexact.items():
            steps = sum(self.members[m].steps for m in ids)
            w_text = sum(self.members[m].tokens for m in ids)
            coef_steps, coef_text = coef.get(w, (1.0, 0.0))
            model[w] = max(0.0, coef_steps * steps + coef_text * w_text)
        if sum(model.values()) <= 0:
            model = {w: sum(self.members[m].steps for m in ids) for w, ids in inexact.items()}
        w = self.workloads.get(rid, "")
        ids = inexact[w]
        text = {m: max(0.0, self.members[m].tokens - self.members[m].steps) for m in ids}
        base = text if sum(text.values()) > 0 else {m: self.members[m].steps for m in ids}
        fraction = (model[w] / (sum(model.values()) or 1.0)) * (base[rid] / (sum(base.values()) or 1.0))
        return rest * fraction, [max(0.0, r) * fraction for r in rest_pos]


def _pos(a: _Activity, i: int) -> float:
    return a.per_position[i] if i < len(a.per_position) else 0.0


class AcceptanceModel:
    """Accepted tokens of each workload's inexact requests, fitted across scrape intervals.

    ``remainder_j ~= sum_w (a_w * steps_{w,j} + b_w * text_{w,j})``, where ``text`` is the approximate token count
    of the workload's chunks: steps carry the workload's typical acceptance, the text how much this
    interval's steps actually produced (more accepted tokens, more text), in units the approximate tokenizer gets
    wrong by a workload-dependent factor that ``b_w`` absorbs. Weighted least squares (an interval's variance grows
    with its steps), pulled gently towards the pooled acceptance per step. At most :data:`MAX_WORKLOADS` workloads
    get their own coefficients.
    """

    MAX_WORKLOADS = 16
    MIN_INTERVALS = 30
    MAX_SE = 0.03  # accepted tokens per step, one standard error

    def __init__(self) -> None:
        self._names: list[str] = []
        self._xtx: list[list[float]] = []  # columns: (a_0, b_0, a_1, b_1, ...)
        self._xty: list[float] = []
        self._yy = 0.0
        self._sum_y = 0.0
        self._sum_steps = 0.0
        self._steps: list[float] = []
        self._text: list[float] = []
        self.intervals = 0

    def _column(self, w: str) -> int | None:
        if w not in self._names:
            if len(self._names) >= self.MAX_WORKLOADS:
                return None
            self._names.append(w)
            self._steps.append(0.0)
            self._text.append(0.0)
            for row in self._xtx:
                row.extend((0.0, 0.0))
            n = 2 * len(self._names)
            self._xtx.extend(([0.0] * n, [0.0] * n))
            self._xty.extend((0.0, 0.0))
        return self._names.index(w)

    def add(self, activity: Mapping[str, tuple[float, float]], remainder: float) -> None:
        """``activity``: workload -> (decode steps, approximate tokens of those steps' chunks)."""
        x: list[tuple[int, float]] = []
        total = 0.0
        for w, (steps, text) in activity.items():
            if steps <= 0:
                continue
            i = self._column(w)
            if i is None:
                continue
            self._steps[i] += steps
            self._text[i] += text
            x.append((2 * i, steps))
            x.append((2 * i + 1, text))
            total += steps
        if not x:
            return
        self.intervals += 1
        wt = 1.0 / total
        self._yy += wt * remainder * remainder
        self._sum_y += remainder
        self._sum_steps += total
        for i, xi in x:
            self._xty[i] += wt * xi * remainder
            for j, xj in x:
                self._xtx[i][j] += wt * xi * xj

    def _fit(self) -> tuple[list[list[float]], list[float]] | None:
        n = 2 * len(self._names)
        if n == 0 or self._sum_steps <= 0:
            return None
        pooled = self._sum_y / self._sum_steps
        lam = 1e-4 * sum(self._xtx[i][i] for i in range(n)) / n + 1e-9
        a = [[self._xtx[i][j] + (lam if i == j else 0.0) for j in range(n)] for i in range(n)]
        b = [self._xty[i] + (lam * pooled if i % 2 == 0 else 0.0) for i in range(n)]
        sol = _solve(a, b)
        return None if sol is None else (a, sol)

    def coefficients(self) -> dict[str, tuple[float, float]]:
        fit = self._fit()
        if fit is None:
            return {}
        sol = fit[1]
        return {w: (sol[2 * i], sol[2 * i + 1]) for i, w in enumerate(self._names)}

    def stable(self) -> bool:
        """Whether each workload's mean accepted tokens per step is known to within :data:`MAX_SE` (one standard
        error), from at least :data:`MIN_INTERVALS` intervals."""
        n = 2 * len(self._names)
        fit = self._fit()
        if fit is None or self.intervals < max(self.MIN_INTERVALS, n + 2):
            return False
        a, sol = fit
        rss = self._yy - 2 * sum(s * y for s, y in zip(sol, self._xty, strict=True))
        rss += sum(sol[i] * self._xtx[i][j] * sol[j] for i in range(n) for j in range(n))
        sigma2 = max(0.0, rss) / (self.intervals - n)
        for i in range(len(self._names)):
            mean_text = self._text[i] / self._steps[i] if self._steps[i] else 0.0
            v = [0.0] * n
            v[2 * i], v[2 * i + 1] = 1.0, mean_text
            av = _solve(a, v)  # Var(v.sol) = sigma2 * v' A^-1 v
            if av is None:
                return False
            var = sigma2 * sum(vi * ai for vi, ai in zip(v, av, strict=True))
            if max(0.0, var) ** 0.5 > self.MAX_SE:
                return False
        return True


class DraftModel:
    """The share of a workload's decode steps that drafted, among those whose chunk does not show it (a step that
    brought one token may have drafted and had everything rejected, or not drafted at all: ngram proposes only when
    its lookup matches). ``remaining_drafts_j ~= sum_w q_w * unknown_steps_{w,j}``, weighted least squares across
    intervals, pulled towards the pooled rate."""

    MAX_WORKLOADS = 16

    def __init__(self) -> None:
        self._names: list[str] = []
        self._xtx: list[list[float]] = []
        self._xty: list[float] = []
        self._sum_y = 0.0
        self._sum_x = 0.0

    def add(self, unknown_steps: Mapping[str, float], remaining_drafts: float) -> None:
        cols = []
        for w, n in unknown_steps.items():
            if n <= 0:
                continue
            if w not in self._names:
                if len(self._names) >= self.MAX_WORKLOADS:
                    continue
                self._names.append(w)
                for row in self._xtx:
                    row.append(0.0)
                self._xtx.append([0.0] * len(self._names))
                self._xty.append(0.0)
            cols.append((self._names.index(w), n))
        if not cols:
            return
        total = sum(n for _, n in cols)
        wt = 1.0 / total
        self._sum_y += remaining_drafts
        self._sum_x += total
        for i, ai in cols:
            self._xty[i] += wt * ai * remaining_drafts
            for j, aj in cols:
                self._xtx[i][j] += wt * ai * aj

    def rates(self) -> dict[str, float]:
        n = len(self._names)
        if n == 0 or self._sum_x <= 0:
            return {}
        pooled = self._sum_y / self._sum_x
        lam = 1e-3 * sum(self._xtx[i][i] for i in range(n)) / n + 1e-9
        a = [[self._xtx[i][j] + (lam if i == j else 0.0) for j in range(n)] for i in range(n)]
        sol = _solve(a, [self._xty[i] + lam * pooled for i in range(n)])
        if sol is None:
            return {}
        return {w: min(1.0, max(0.0, v)) for w, v in zip(self._names, sol, strict=True)}


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


@dataclass(slots=True)
class _Attributed:
    workload: str = ""
    accepted: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    per_position: list[float] = field(default_factory=list)
    intervals: int = 0
    shared: bool = False  # some interval held other requests' steps, not all with exact token counts
    overlapped: bool = False  # some interval held other requests' steps
    incomplete: bool = False  # some steps fell where no counter delta could be had
    reset: bool = False
    ended: bool = False
    open_intervals: list[_Interval] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CounterAttribution:
    estimate: SpecEstimate  # ``exact``: no reset, nothing missed, and any overlap only with exact token counts
    intervals: int
    overlapped: bool  # shared an interval with another request (drafts are then split by steps)
    reset: bool


Event = tuple[int, str, int, bool, bool]  # (t_ns, request id, tokens, decode step?, exact count?)


class CounterLedger:
    """The recorder calls :meth:`tokens` for every token-bearing chunk with its arrival time (``decode=False`` for
    the prefill chunk), :meth:`settle` when a scrape returns with the delta since the previous good one (a failed
    scrape leaves its activity for the next good one: counters are cumulative), and :meth:`pop` when a request
    ended and its closing scrape settled."""

    def __init__(self) -> None:
        self._events: deque[Event] = deque()
        self._req: dict[str, _Attributed] = {}
        self.model = AcceptanceModel()
        self.drafting = DraftModel()
        self.unattributed = _Attributed()  # deltas that fell in intervals with no request of ours
        self.total = _Attributed()
        self.settled_steps = 0.0  # decode steps seen in intervals that got a delta
        self._truncated: set[str] = set()
        self._owed = 0  # decode steps counted by the engine whose chunks arrived after their interval was cut
        self.aligned = 0  # intervals cut by the engine's step count
        self.time_cut = 0  # intervals cut by time

    def begin(self, rid: str, workload: str = "") -> None:
        self._req[rid] = _Attributed(workload=workload)

    MAX_EVENT_AGE_NS = 120 * 10**9

    def tokens(self, rid: str, n: int, t_ns: int, *, exact: bool, decode: bool = True) -> None:
        ev = self._events
        ev.append((t_ns, rid, n, decode, exact))
        # Without good scrapes (the engine's /metrics down for long) nothing settles: forget chunks older than
        # two minutes rather than grow without bound; their requests' counter figures are then incomplete.
        if len(ev) % 4096 == 0:
            cutoff = t_ns - self.MAX_EVENT_AGE_NS
            while ev and ev[0][0] < cutoff:
                r = self._req.get(ev.popleft()[1])
                if r is not None:
                    r.incomplete = True

    def end(self, rid: str, *, truncated: bool = False) -> None:
        """The request finished. ``truncated``: cut by max_tokens, so the engine counted accepted drafts of its last
        step that were never emitted (measured on real vLLM): an interval's unexplained accepted tokens are its."""
        r = self._req.get(rid)
        if r is not None:
            r.ended = True
            if truncated:
                self._truncated.add(rid)

    def _take(self, boundary_ns: int, quota: int | None) -> dict[str, _Activity]:
        merged: dict[str, _Activity] = {}
        ev = self._events
        if quota is None:
            self.time_cut += 1
        else:
            self.aligned += 1
        taken = 0
        while ev:
            t, rid, n, decode, exact = ev[0]
            if quota is not None:
                if taken >= quota:
                    break
            elif t > boundary_ns:
                break
            ev.popleft()
            act = merged.get(rid)
            if act is None:
                act = merged[rid] = _Activity()
            if decode:
                act.steps += 1
                act.tokens += n
                taken += 1
                if n > 1:  # a step that brought n tokens accepted positions 0 .. n-2
                    act.multi += 1
                    if len(act.per_position) < n - 1:
                        act.per_position.extend([0.0] * (n - 1 - len(act.per_position)))
                    for i in range(n - 1):
                        act.per_position[i] += 1
            if not exact:
                act.exact = False
        return merged

    def baseline(self, boundary_ns: int) -> None:
        """The first good scrape: activity before it has no delta, so those requests' counter figures are incomplete."""
        for rid in self._take(boundary_ns, None):
            r = self._req.get(rid)
            if r is not None:
                r.incomplete = True

    def _available(self, until_ns: int) -> int:
        return sum(1 for e in self._events if e[3] and e[0] <= until_ns)

    def settle(self, boundary_ns: int, delta: SpecCounters, *, reset: bool = False, slack_ns: int = 0) -> None:
        _add(
            self.total, delta.accepted or 0.0, delta.drafts or 0.0, delta.draft_tokens or 0.0, list(delta.per_position)
        )
        quota = None
        foreign = 0.0
        if delta.decode_steps is not None and not reset:
            quota = round(delta.decode_steps) + self._owed
            self._owed = 0
            short = quota - self._available(boundary_ns + slack_ns)
            if short > 0:
                if short <= max(1, self.in_flight()):
                    # the chunk of the last counted step of a streaming request can still be on its way (one per
                    # request at most): take what is here, and count the rest into the next interval
                    quota -= short
                    self._owed = short
                else:
                    # more steps than our streams can explain: another client, or a non-streamed request whose
                    # steps show no chunks, uses the engine too. Cut by time; what no chunk explains stays
                    # unattributed, and this interval's members are approximate.
                    quota = None
        merged = self._take(boundary_ns, quota)
        if quota is None and delta.decode_steps is not None and not reset:
            foreign = max(0.0, delta.decode_steps - sum(a.steps for a in merged.values()))
        accepted = delta.accepted or 0.0
        drafts = delta.drafts or 0.0
        draft_tokens = delta.draft_tokens or 0.0
        per_pos = list(delta.per_position)
        steps = sum(a.steps for a in merged.values())
        self.settled_steps += steps
        if steps <= 0:
            _add(self.unattributed, accepted, drafts, draft_tokens, per_pos)
            return
        workloads = {rid: self._req[rid].workload for rid in merged if rid in self._req}
        if not reset and not all(a.exact for a in merged.values()):
            remainder = accepted - sum(max(0.0, a.tokens - a.steps) for a in merged.values() if a.exact)
            by_w: dict[str, tuple[float, float]] = {}
            for rid, a in merged.items():
                if not a.exact:
                    w = workloads.get(rid, "")
                    w_steps, w_text = by_w.get(w, (0.0, 0.0))
                    by_w[w] = (w_steps + a.steps, w_text + a.tokens)
            self.model.add(by_w, remainder)
        interval = _Interval(accepted, per_pos, merged, workloads, drafts, draft_tokens, foreign)
        if not reset and drafts > 0:
            known = sum(interval.known_drafted(a) for a in merged.values())
            unknown: dict[str, float] = {}
            for rid, a in merged.items():
                w = workloads.get(rid, "")
                unknown[w] = unknown.get(w, 0.0) + a.steps - interval.known_drafted(a)
            self.drafting.add(unknown, drafts - known)
        # sharing an interval only makes a request's figure approximate when some member's tokens are approximate:
        # exact members' accepted tokens are known (tokens - steps)
        stepped = [a for a in merged.values() if a.steps > 0]
        overlapped = len(stepped) > 1 or foreign > 0
        shared = (len(stepped) > 1 and not all(a.exact for a in stepped)) or foreign > 0
        for rid in merged:
            r = self._req.get(rid)
            if r is None:
                continue
            r.intervals += 1
            r.shared = r.shared or shared
            r.overlapped = r.overlapped or overlapped
            r.reset = r.reset or reset
            r.open_intervals.append(interval)

    PARTIAL_DRAFTING_BELOW = 0.95  # drafts per decode step under this: the method drafts on some steps only

    @property
    def partial_drafting(self) -> bool:
        fraction = self.draft_fraction
        return fraction is not None and fraction < self.PARTIAL_DRAFTING_BELOW

    @property
    def draft_fraction(self) -> float | None:
        """Drafts per decode step seen so far: about 1 when every step drafts (MTP, EAGLE, draft models), lower
        when the method drafts only on some steps (ngram misses), where chunk-derived drafts overcount."""
        if self.settled_steps < 20:
            return None
        return self.total.drafts / self.settled_steps

    def pending_for(self, rid: str) -> bool:
        """Whether some chunk of ``rid`` still waits for a counter delta."""
        return any(e[1] == rid for e in self._events)

    def needs_model(self, rid: str) -> bool:
        """Whether this request's share of accepted tokens rests on the acceptance model (inexact counts, shared)."""
        r = self._req.get(rid)
        if r is None:
            return False
        return any(len(iv.members) > 1 and not all(a.exact for a in iv.members.values()) for iv in r.open_intervals)

    def pop(self, rid: str) -> CounterAttribution | None:
        """Final figures for an ended request (None when none of its steps was ever covered by a delta)."""
        r = self._req.pop(rid, None)
        if r is not None and self.pending_for(rid):
            r.incomplete = True  # some of its steps were never covered by a delta
        if r is None or r.intervals == 0:
            return None
        coef = self.model.coefficients()
        partial = self.partial_drafting
        q = self.drafting.rates() if partial else {}
        if rid in self._truncated:
            self._truncated.discard(rid)
            for interval in r.open_intervals:
                interval.truncated.add(rid)
        for interval in r.open_intervals:
            drafts, draft_tokens = interval.draft_share(rid, q, partial)
            r.drafts += drafts
            r.draft_tokens += draft_tokens
            accepted, pos = interval.attribute(rid, coef)
            r.accepted += accepted
            if len(r.per_position) < len(pos):
                r.per_position.extend([0.0] * (len(pos) - len(r.per_position)))
            for i, v in enumerate(pos):
                r.per_position[i] += v
        r.open_intervals.clear()
        k = r.draft_tokens / r.drafts if r.drafts else None
        est = SpecEstimate(
            accepted=r.accepted,
            drafts=r.drafts,
            draft_tokens=r.draft_tokens,
            per_position=tuple(r.per_position),
            k=k,
            # with partial drafting, an overlapped request's drafts are modelled, not known
            exact=not (r.shared or r.incomplete or r.reset or (partial and r.overlapped)),
        )
        return CounterAttribution(est, r.intervals, r.overlapped, r.reset)

    def in_flight(self) -> int:
        return sum(1 for r in self._req.values() if not r.ended)


def _add(a: _Attributed, accepted: float, drafts: float, draft_tokens: float, per_pos: list[float]) -> None:
    a.accepted += accepted
    a.drafts += drafts
    a.draft_tokens += draft_tokens
    if len(a.per_position) < len(per_pos):
        a.per_position.extend([0.0] * (len(per_pos) - len(a.per_position)))
    for i, v in enumerate(per_pos):
        a.per_position[i] += v
