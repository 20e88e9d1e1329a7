"""Speculative acceptance per request, from every source available, each kept.

- **server**: vLLM's per-request ``metrics.speculative_decoding`` (exact), or llama.cpp's ``timings``.
- **chunks**: one SSE chunk is one engine step carrying 1 + accepted tokens, so accepted = sum over the chunks after
  the first (the prefill token) of (tokens - 1), and decode steps = those chunks. Exact while chunks are steps and
  token counts are exact (measured on real vLLM: equal to the counter delta for every request that stopped by itself).
- **counters**: the engine's ``/metrics`` deltas, shared among the requests active in each scrape interval
  (:class:`CounterLedger`). Exact when requests do not overlap.

vLLM's definitions (vllm/v1/spec_decode/metrics.py): acceptance rate = accepted / draft tokens; mean acceptance length
= 1 + accepted / drafts; per-position rate = accepted_per_pos[i] / drafts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specproxy.core.prom import SpecCounters


@dataclass(frozen=True, slots=True)
class SpecEstimate:
    accepted: float
    drafts: float
    draft_tokens: float | None
    per_position: tuple[float, ...] = ()
    k: float | None = None
    exact: bool = True

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": _num(self.accepted),
            "drafts": _num(self.drafts),
            "draft_tokens": _num(self.draft_tokens),
            "per_position": [_num(v) for v in self.per_position],
            "k": _num(self.k),
            "exact": self.exact,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


def _num(v: float | None) -> float | int | None:
    if v is None:
        return None
    r = round(v)
    return int(r) if abs(v - r) < 1e-9 else round(v, 4)


def _per_position_from_steps(accepted_per_step: Iterable[int], k: int) -> tuple[float, ...]:
    """A step that accepted a tokens accepted positions 0..a-1 (a position counts only if the previous did)."""
    pos = [0.0] * k
    for a in accepted_per_step:
        for i in range(min(a, k)):
            pos[i] += 1
    return tuple(pos)


def from_server(spec: Mapping[str, Any]) -> SpecEstimate | None:
    """vLLM ``metrics.speculative_decoding`` (0.29+), summary or detailed."""
    try:
        accepted = float(spec["num_accepted_draft_tokens"])
        drafts = float(spec["num_spec_steps"])
        draft_tokens = float(spec["num_draft_tokens"])
    except (KeyError, TypeError, ValueError):
        return None
    k_raw = spec.get("num_spec_tokens")
    k = int(k_raw) if isinstance(k_raw, int) else None
    per_pos: tuple[float, ...] = ()
    steps = spec.get("per_step_accepted")
    hist = spec.get("acceptance_histogram")
    if isinstance(steps, list) and k:
        per_pos = _per_position_from_steps((int(a) for a in steps), k)
    elif isinstance(hist, list) and len(hist) > 1:
        # histogram[i] = steps that accepted exactly i drafts; position i was accepted by steps with more than i
        per_pos = tuple(float(sum(hist[i + 1 :])) for i in range(len(hist) - 1))
    return SpecEstimate(accepted, drafts, draft_tokens, per_pos, float(k) if k else None)


def from_llama_timings(timings: Mapping[str, Any]) -> SpecEstimate | None:
    """llama.cpp's ``timings.draft_n`` / ``draft_n_accepted`` (no step count: drafts unknown)."""
    n, acc = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not isinstance(n, int | float) or not isinstance(acc, int | float) or n <= 0:
        return None
    return SpecEstimate(float(acc), 0.0, float(n))


def from_chunks(tokens_per_chunk: Sequence[int], k: float | None) -> SpecEstimate | None:
    """Chunks are steps: ``tokens_per_chunk`` lists token-bearing chunks in order, the first being prefill."""
    decode = [n for n in tokens_per_chunk[1:] if n > 0]
    if not tokens_per_chunk:
        return None
    accepted_per_step = [n - 1 for n in decode]
    kk = round(k) if k else (max(accepted_per_step) if accepted_per_step else 0)
    return SpecEstimate(
        accepted=float(sum(accepted_per_step)),
        drafts=float(len(decode)),
        draft_tokens=float(k * len(decode)) if k else None,
        per_position=_per_position_from_steps(accepted_per_step, kk) if kk else (),
        k=k,
    )


def tokens_per_step_histogram(tokens_per_chunk: Sequence[int]) -> dict[str, int]:
    hist: dict[str, int] = {}
    for n in tokens_per_chunk[1:]:
        if n > 0:
            hist[str(n)] = hist.get(str(n), 0) + 1
    return hist


# -- counters shared among overlapping requests -----------------------------------------------------------------------


@dataclass(slots=True)
class _Activity:
    steps: float = 0.0  # decode steps (the prefill chunk is not a speculative step)
    tokens: float = 0.0  # tokens of every chunk, prefill included, as counted (exactly or approximately)
    exact: bool = True  # every count came from usage or token ids


@dataclass(slots=True)
class _Attributed:
    workload: str = ""
    accepted: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    per_position: list[float] = field(default_factory=list)
    intervals: int = 0
    shared: bool = False  # some interval held another request's steps too
    incomplete: bool = False  # some steps fell where no counter delta could be had
    reset: bool = False
    ended: bool = False
    open_intervals: list[_Interval] = field(default_factory=list)


@dataclass(slots=True)
class _Interval:
    """One settled scrape interval: its accepted-token delta waits here until each member request ends, so the
    share is computed with the token calibration as it stands then (more intervals seen, better scales)."""

    accepted: float
    per_position: list[float]
    members: dict[str, _Activity]
    workloads: dict[str, str]

    def share(self, rid: str, scales: Mapping[str, float]) -> float:
        weights: dict[str, float] = {}
        for member, act in self.members.items():
            scale = 1.0 if act.exact else scales.get(self.workloads.get(member, ""), 1.0)
            weights[member] = max(0.0, act.tokens * scale - act.steps)
        total = sum(weights.values())
        if total <= 0:  # no token estimate at all: by steps
            steps = sum(a.steps for a in self.members.values())
            return self.members[rid].steps / steps if steps else 0.0
        return weights.get(rid, 0.0) / total


@dataclass(frozen=True, slots=True)
class CounterAttribution:
    estimate: SpecEstimate
    intervals: int
    shared: bool
    reset: bool


class TokenCalibration:
    """Per-workload scale from approximate token counts to the engine's, fitted across scrape intervals.

    Without usage a chunk's tokens come from a tokenizer that is not the model's (on Japanese text cl100k or the
    character approximation can be off by 2x or more), and differently so per workload. The engine's
    ``generation_tokens`` counter is exact per interval, so ``generation_j ~= sum_w scale_w * approx_{w,j}`` over
    many intervals gives each workload's scale (least squares, pulled gently towards 1 so that a workload seen in
    few intervals keeps its raw counts).
    """

    MAX_WORKLOADS = 16

    def __init__(self) -> None:
        self._names: list[str] = []
        self._xtx: list[list[float]] = []
        self._xty: list[float] = []
        self.intervals = 0

    def add(self, approx_by_workload: Mapping[str, float], generation_tokens: float) -> None:
        cols = []
        for w, a in approx_by_workload.items():
            if a <= 0:
                continue
            if w not in self._names:
                if len(self._names) >= self.MAX_WORKLOADS:
                    continue
                self._names.append(w)
                for row in self._xtx:
                    row.append(0.0)
                self._xtx.append([0.0] * len(self._names))
                self._xty.append(0.0)
            cols.append((self._names.index(w), a))
        if not cols:
            return
        self.intervals += 1
        for i, ai in cols:
            self._xty[i] += ai * generation_tokens
            for j, aj in cols:
                self._xtx[i][j] += ai * aj

    def scales(self) -> dict[str, float]:
        n = len(self._names)
        if n == 0:
            return {}
        trace = sum(self._xtx[i][i] for i in range(n))
        lam = 1e-3 * trace / n  # ridge towards scale 1
        a = [[self._xtx[i][j] + (lam if i == j else 0.0) for j in range(n)] for i in range(n)]
        b = [self._xty[i] + lam for i in range(n)]
        sol = _solve(a, b)
        if sol is None:
            return {}
        return {w: min(10.0, max(0.1, v)) for w, v in zip(self._names, sol, strict=True)}


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


class CounterLedger:
    """Shares each scrape interval's counter deltas among the requests that stepped in it.

    The recorder calls :meth:`tokens` for every token-bearing chunk it sees (``decode=False`` for the prefill
    chunk), :meth:`cut` when it issues a scrape (the interval closes there), then :meth:`settle` with the delta
    between that scrape and the previous good one, or :meth:`fail` when the scrape failed: counters are cumulative,
    so the failed interval's activity simply joins the next one. Drafts and draft tokens are shared in proportion to
    decode steps; accepted tokens (and per-position counts) in proportion to each request's accepted tokens there,
    estimated as tokens minus steps, with approximate token counts first calibrated per workload against the
    engine's generation counter (:class:`TokenCalibration`).
    """

    def __init__(self) -> None:
        self._current: dict[str, _Activity] = {}
        self._pending: list[tuple[int, dict[str, _Activity]]] = []
        self._seq = 0
        self._req: dict[str, _Attributed] = {}
        self.calibration = TokenCalibration()
        self.unattributed = _Attributed()  # deltas that fell in intervals with no request of ours
        self.total = _Attributed()
        self.settled_steps = 0.0  # decode steps seen in intervals that got a delta

    def begin(self, rid: str, workload: str = "") -> None:
        self._req[rid] = _Attributed(workload=workload)

    def tokens(self, rid: str, n: int, *, exact: bool, decode: bool = True) -> None:
        act = self._current.get(rid)
        if act is None:
            act = self._current[rid] = _Activity()
        if decode:
            act.steps += 1
        act.tokens += n
        if not exact:
            act.exact = False

    def end(self, rid: str) -> None:
        r = self._req.get(rid)
        if r is not None:
            r.ended = True

    def cut(self) -> int:
        self._seq += 1
        self._pending.append((self._seq, self._current))
        self._current = {}
        return self._seq

    def fail(self, seq: int) -> None:
        """The scrape for ``seq`` failed: its interval's activity waits for the next good delta."""

    def baseline(self, seq: int) -> None:
        """The first good scrape: activity before it has no delta, so those requests' counter figures are incomplete."""
        for _, bucket in self._take(seq):
            for rid in bucket:
                r = self._req.get(rid)
                if r is not None:
                    r.incomplete = True

    def settle(self, seq: int, delta: SpecCounters, *, reset: bool = False) -> None:
        merged: dict[str, _Activity] = {}
        for _, bucket in self._take(seq):
            for rid, act in bucket.items():
                m = merged.setdefault(rid, _Activity())
                m.steps += act.steps
                m.tokens += act.tokens
                m.exact = m.exact and act.exact
        accepted = delta.accepted or 0.0
        drafts = delta.drafts or 0.0
        draft_tokens = delta.draft_tokens or 0.0
        per_pos = list(delta.per_position)
        _add(self.total, accepted, drafts, draft_tokens, per_pos, 1.0)
        steps = sum(a.steps for a in merged.values())
        self.settled_steps += steps
        if steps <= 0:
            _add(self.unattributed, accepted, drafts, draft_tokens, per_pos, 1.0)
            return
        if not all(a.exact for a in merged.values()) and delta.generation_tokens is not None and not reset:
            approx: dict[str, float] = {}
            for rid, act in merged.items():
                w = self._req[rid].workload if rid in self._req else ""
                approx[w] = approx.get(w, 0.0) + act.tokens
            self.calibration.add(approx, delta.generation_tokens)
        interval = _Interval(
            accepted, per_pos, merged, {rid: self._req[rid].workload for rid in merged if rid in self._req}
        )
        shared = len(merged) > 1
        for rid, act in merged.items():
            r = self._req.get(rid)
            if r is None:
                continue
            ws = act.steps / steps
            r.drafts += drafts * ws
            r.draft_tokens += draft_tokens * ws
            r.intervals += 1
            r.shared = r.shared or shared
            r.reset = r.reset or reset
            r.open_intervals.append(interval)

    @property
    def draft_fraction(self) -> float | None:
        """Drafts per decode step seen so far: about 1 when every step drafts (MTP, EAGLE, draft models), lower
        when the method drafts only on some steps (ngram misses), where chunk-derived drafts overcount."""
        if self.settled_steps < 20:
            return None
        return self.total.drafts / self.settled_steps

    def pop(self, rid: str) -> CounterAttribution | None:
        """Final figures for an ended request (None when none of its steps was ever covered by a delta)."""
        r = self._req.pop(rid, None)
        if self._current.pop(rid, None) is not None and r is not None:
            r.incomplete = True
        for _, bucket in self._pending:
            if bucket.pop(rid, None) is not None and r is not None:
                r.incomplete = True
        if r is None or r.intervals == 0:
            return None
        # accepted tokens are shared with the calibration as it stands now, over every interval of this request
        scales = self.calibration.scales()
        for interval in r.open_intervals:
            share = interval.share(rid, scales)
            r.accepted += interval.accepted * share
            if len(r.per_position) < len(interval.per_position):
                r.per_position.extend([0.0] * (len(interval.per_position) - len(r.per_position)))
            for i, v in enumerate(interval.per_position):
                r.per_position[i] += v * share
        r.open_intervals.clear()
        k = r.draft_tokens / r.drafts if r.drafts else None
        est = SpecEstimate(
            accepted=r.accepted,
            drafts=r.drafts,
            draft_tokens=r.draft_tokens,
            per_position=tuple(r.per_position),
            k=k,
            exact=not (r.shared or r.incomplete or r.reset),
        )
        return CounterAttribution(est, r.intervals, r.shared, r.reset)

    def in_flight(self) -> int:
        return sum(1 for r in self._req.values() if not r.ended)

    def _take(self, seq: int) -> list[tuple[int, dict[str, _Activity]]]:
        taken = [p for p in self._pending if p[0] <= seq]
        self._pending = [p for p in self._pending if p[0] > seq]
        return taken


def _add(a: _Attributed, accepted: float, drafts: float, draft_tokens: float, per_pos: list[float], w: float) -> None:
    a.accepted += accepted * w
    a.drafts += drafts * w
    a.draft_tokens += draft_tokens * w
    if len(a.per_position) < len(per_pos):
        a.per_position.extend([0.0] * (len(per_pos) - len(a.per_position)))
    for i, v in enumerate(per_pos):
        a.per_position[i] += v * w


def reconciliation(attributed: Iterable[SpecEstimate], ledger: CounterLedger) -> dict[str, Any]:
    """How far the chosen per-request figures are from the counter totals over the same time."""
    acc = sum(e.accepted for e in attributed)
    total = ledger.total.accepted
    return {
        "attributed_accepted": _num(acc),
        "counter_accepted": _num(total),
        "unattributed_accepted": _num(ledger.unattributed.accepted),
        "gap": (acc - total) / total if total else None,
    }
