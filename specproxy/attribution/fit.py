"""The two models that counter attribution learns across scrape intervals, on one shared weighted regression.

- :class:`AcceptanceModel`: accepted tokens of each workload's requests whose token counts are approximate.
- :class:`DraftModel`: how often a workload's drafting steps accept their first draft, for methods that draft on
  some steps only (ngram proposes only when its lookup matches): what says how many drafts its one-token steps hide.

Each interval is one observation, weighted by 1 / its decode steps (an interval's variance grows with its steps), and
each coefficient is pulled gently towards the pooled figure, so a workload seen in few intervals borrows from the
rest. At most :data:`MAX_WORKLOADS` workloads get their own coefficients; later ones fall back to the pooled
figure at the point of use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from specproxy.attribution.intervals import DraftWeights, Evidence, drafts_at_rate
from specproxy.attribution.wls import WeightedLeastSquares, combination_variance, solve

MAX_WORKLOADS = 16


class _Columns:
    """Workload names mapped to their first column in a regression of ``width`` columns per workload."""

    def __init__(self, wls: WeightedLeastSquares, width: int) -> None:
        self.names: list[str] = []
        self._wls = wls
        self._width = width

    def index(self, w: str) -> int | None:
        """The workload's index (its columns start at ``index * width``); None past :data:`MAX_WORKLOADS`."""
        if w not in self.names:
            if len(self.names) >= MAX_WORKLOADS:
                return None
            self.names.append(w)
            self._wls.add_columns(self._width)
        return self.names.index(w)


def _pinned(
    wls: WeightedLeastSquares,
    fit: tuple[list[list[float]], list[float]] | None,
    combos: list[list[float]],
    min_intervals: int,
    max_se: float,
) -> bool:
    """Whether every combination of the fitted coefficients in ``combos`` has a standard error of at most
    ``max_se``, from at least ``min_intervals`` observations (and more than the coefficients)."""
    if fit is None or wls.observations < max(min_intervals, wls.columns + 2):
        return False
    a, sol = fit
    sigma2 = wls.residual_variance(sol)
    if sigma2 is None:
        return False
    for v in combos:
        var = combination_variance(a, v, sigma2)
        if var is None or max(0.0, var) ** 0.5 > max_se:
            return False
    return True


class AcceptanceModel:
    """``remainder_j ~= sum_w (a_w * steps_{w,j} + b_w * text_{w,j})``.

    ``remainder_j`` is interval j's accepted-token delta less what its exact members accepted; ``steps`` and
    ``text`` are the decode steps and approximate token count of each workload's inexact chunks in it. Steps carry
    the workload's typical acceptance, the text how much this interval's steps actually produced (more accepted
    tokens, more text), in units the approximate tokenizer gets wrong by a workload-dependent factor that ``b_w``
    absorbs. The prior pulls ``a_w`` towards the pooled accepted tokens per step and ``b_w`` towards 0.
    """

    MIN_INTERVALS = 30
    MAX_SE = 0.03  # accepted tokens per step, one standard error
    RIDGE = 1e-4

    def __init__(self) -> None:
        self._wls = WeightedLeastSquares()
        self._cols = _Columns(self._wls, 2)
        self._steps: list[float] = []
        self._text: list[float] = []
        self._sum_y = 0.0
        self._sum_steps = 0.0

    @property
    def intervals(self) -> int:
        return self._wls.observations

    def add(self, activity: Mapping[str, tuple[float, float]], remainder: float) -> None:
        """``activity``: workload -> (decode steps, approximate tokens of those steps' chunks)."""
        row: list[tuple[int, float]] = []
        total = 0.0
        for w, (steps, text) in activity.items():
            if steps <= 0:
                continue
            i = self._cols.index(w)
            if i is None:
                continue
            if i == len(self._steps):
                self._steps.append(0.0)
                self._text.append(0.0)
            self._steps[i] += steps
            self._text[i] += text
            row.append((2 * i, steps))
            row.append((2 * i + 1, text))
            total += steps
        if not row:
            return
        self._sum_y += remainder
        self._sum_steps += total
        self._wls.add(row, remainder, 1.0 / total)

    def _fit(self) -> tuple[list[list[float]], list[float]] | None:
        n = self._wls.columns
        if n == 0 or self._sum_steps <= 0:
            return None
        pooled = self._sum_y / self._sum_steps
        a, b = self._wls.system(self.RIDGE, [pooled if i % 2 == 0 else 0.0 for i in range(n)])
        sol = solve(a, b)
        return None if sol is None else (a, sol)

    def coefficients(self) -> dict[str, tuple[float, float]]:
        """workload -> (accepted per step, accepted per approximate token beyond the steps' own)."""
        fit = self._fit()
        if fit is None:
            return {}
        sol = fit[1]
        return {w: (sol[2 * i], sol[2 * i + 1]) for i, w in enumerate(self._cols.names)}

    def stable(self) -> bool:
        """Whether each workload's mean accepted tokens per step is known to within :data:`MAX_SE` (one standard
        error), from at least :data:`MIN_INTERVALS` intervals."""
        n = self._wls.columns
        combos = []
        for i in range(len(self._cols.names)):
            mean_text = self._text[i] / self._steps[i] if self._steps[i] else 0.0
            v = [0.0] * n
            v[2 * i], v[2 * i + 1] = 1.0, mean_text  # accepted per step at the workload's mean text per step
            combos.append(v)
        return _pinned(self._wls, self._fit(), combos, self.MIN_INTERVALS, self.MAX_SE)


@dataclass(slots=True)
class _DraftRow:
    hidden: float  # drafts beyond the steps known to have drafted
    steps: float  # decode steps: the observation's weight is 1 / steps
    members: list[tuple[str, float, Evidence]]  # workload, steps not known to have drafted, evidence (shared, growing)


class DraftModel:
    """``hidden_drafts_j ~= sum_w beta_w * sum_{r in w} one_token_steps_{r,j} * f_r / (1 - f_r)
    + sum_w rho_w * inexact_steps_{w,j}``, for methods that draft on some steps only.

    A request drafts on a share ``p`` of its steps; a drafting step accepts its first draft with probability ``a``
    (its workload's) and then brings several tokens (known to have drafted), else one (its draft hidden among the
    steps that did not draft). So a request brings several tokens on ``f = p a`` of its steps, and of its one-token
    steps ``p (1 - a) / (1 - f)`` drafted: ``beta_w * f / (1 - f)`` with ``beta_w = (1 - a) / a``, linear in
    ``beta_w`` (:meth:`~specproxy.attribution.intervals.Evidence.hidden_rate`). A request whose token counts are
    inexact shows no multi-token steps, nor does any request of a workload whose drafts are all rejected (a draft
    model that never agrees with the target on that traffic, a broken quantisation): their steps draft at their
    workload's rate ``rho_w``. ``hidden_drafts`` is an interval's drafts less the steps known to have drafted; each
    interval is one observation, weighted by 1 / its decode steps. The last :data:`MAX_ROWS` intervals are kept (fewer
    past :data:`MAX_MEMBERS` members among them) and
    the fit is made from them with each request's evidence as it stands, not as it stood when the interval settled:
    a request's first steps say little about how often it drafts.

    Each ``beta_w`` is pulled towards the pooled figure by a prior worth a fixed amount of evidence: the pooled
    figure within :data:`PRIOR_SPREAD` of each workload's, one standard deviation (``rho_w`` likewise), so a dozen
    noisy intervals cannot move a workload's figure far (a scale-free ridge would let them). The prior gives way as
    intervals accumulate.
    """

    MIN_INTERVALS = 30
    MAX_SE = 0.15  # a workload's beta, one standard error, relative to the pooled beta
    PRIOR_SPREAD = 0.3  # relative to the pooled figure, where no second workload says more
    MIN_SPREAD = 0.1  # relative to the pooled figure
    MAX_ROWS = 256  # intervals kept for the fit
    # A refit costs in proportion to the members of the intervals kept. Beyond this many members kept, the fit waits
    # for as many more intervals as that is times over: its cost per interval stays that of a fit at concurrency 64,
    # and the weights are at most that many intervals old (keeping fewer intervals instead would cost accuracy).
    FIT_MEMBERS = 64 * MAX_ROWS
    # Members kept across the intervals, at most: the oldest intervals go first past it, so that memory stays bounded
    # however many requests an interval holds; every interval is kept up to concurrency 256.
    MAX_MEMBERS = 4 * FIT_MEMBERS
    PASSES = 4

    def __init__(self, workloads: Mapping[str, Evidence] | None = None) -> None:
        """``workloads``: each workload's steps and multi-token steps (exact counts), kept up to date by the ledger;
        a request's own share of multi-token steps is shrunk towards its workload's."""
        self._rows: deque[_DraftRow] = deque()
        self._members = 0  # members of the rows kept
        self._unfitted = 0  # intervals added since the last fit
        self._names: list[str] = []
        self._fitted: tuple[WeightedLeastSquares, list[list[float]], list[float], list[float]] | None = None
        self._stale = False
        self._workloads: Mapping[str, Evidence] = {} if workloads is None else workloads
        self._multi: dict[str, float] = {}

    @property
    def intervals(self) -> int:
        return len(self._rows)

    def add(self, hidden: float, steps: float, members: list[tuple[str, float, Evidence]]) -> None:
        """One interval (:meth:`~specproxy.attribution.intervals.Interval.draft_observation`)."""
        if steps <= 0:
            return
        for w, _, _ in members:
            if w not in self._names and len(self._names) < MAX_WORKLOADS:
                self._names.append(w)
        rows = self._rows
        rows.append(_DraftRow(hidden, steps, members))
        self._members += len(members)
        while len(rows) > 1 and (len(rows) > self.MAX_ROWS or self._members > self.MAX_MEMBERS):
            self._members -= len(rows.popleft().members)
        self._unfitted += 1
        self._stale = True

    def evidence_grew(self) -> None:
        """Requests' evidence moved on (an interval settled, with drafts or not): the next use fits anew."""
        self._stale = True

    def current(self) -> DraftWeights:
        """:meth:`weights`, fitted anew first if intervals or evidence moved on since the last fit (one fit per
        settled interval, however many requests and stability checks ask; fewer with many members, see
        :data:`FIT_MEMBERS`)."""
        if self._stale and (self._fitted is None or self._unfitted * self.FIT_MEMBERS >= self._kept_members()):
            self.refit()
        return self.weights()

    def _kept_members(self) -> int:
        return self._members

    def refit(self) -> None:
        """Fit anew from the kept intervals, each request's odds from its evidence as it stands now.

        A one-token step drafted with probability ``beta_w * odds`` but at most 1 (a request that brings several
        tokens on more of its steps than its workload accepts first drafts drafts on every step): a request whose
        odds reach ``1 / beta_w`` of the previous pass is taken as hiding one draft in each one-token step, and the
        rest are fitted again, over :data:`PASSES` passes. (Uncapped, the requests that draft on every step would read
        as hiding more drafts than they have steps, and their workload's beta would come out low.)"""
        self._multi = {w: e.multi / e.steps for w, e in self._workloads.items() if e.steps > 0}
        self._stale = False
        self._unfitted = 0
        self._fitted = None
        caps: list[float] | None = None
        capped = 0
        for _ in range(self.PASSES):
            solved = self._solve(caps)
            if solved is None:
                return
            self._fitted, now_capped = solved
            if caps is not None and now_capped == capped:
                return  # the same requests capped: the fit stands
            capped = now_capped
            caps = [1.0 / max(beta, 1e-9) for beta in self._fitted[2][0::2]]

    def _solve(
        self, caps: list[float] | None
    ) -> tuple[tuple[WeightedLeastSquares, list[list[float]], list[float], list[float]], int] | None:
        """The fit with each request's odds capped at ``caps`` (its workload's), and how many members were."""
        n = len(self._names)
        if n == 0:
            return None
        index = {w: i for i, w in enumerate(self._names)}
        wls = WeightedLeastSquares()
        wls.add_columns(2 * n)
        # per kind of column (exact, inexact): x and y of the intervals with that kind alone, and of all
        alone = [[0.0, 0.0], [0.0, 0.0]]
        sum_x = sum_y = 0.0
        capped = 0
        for row in self._rows:
            xs = [0.0] * (2 * n)
            hidden = row.hidden
            for w, unknown, ev in row.members:
                i = index.get(w)
                if i is None:
                    continue
                if drafts_at_rate(ev, self._multi.get(w)):
                    xs[2 * i + 1] += unknown
                elif (odds := ev.multi_odds(self._multi.get(w))) is not None:
                    if caps is not None and odds >= caps[i]:
                        hidden -= unknown  # drafts on every step: each of its one-token steps hides one
                        capped += 1
                    else:
                        xs[2 * i] += unknown * odds
            if not any(xs) and hidden <= 0:
                continue
            wls.add([(i, x) for i, x in enumerate(xs) if x > 0], hidden, 1.0 / row.steps)
            kinds = (sum(xs[0::2]), sum(xs[1::2]))
            for kind in (0, 1):
                if kinds[kind] > 0 and kinds[1 - kind] == 0:
                    alone[kind][0] += kinds[kind]
                    alone[kind][1] += hidden
            sum_x += kinds[0] + kinds[1]
            sum_y += hidden
        if sum_x <= 0:
            return None
        pooled = [max(0.0, y) / x if x > 0 else max(0.0, sum_y) / sum_x for x, y in alone]
        prior = [pooled[i % 2] for i in range(2 * n)]
        a, b = wls.system(1e-3, prior)  # nearly free: its residuals say how far intervals scatter
        sol = solve(a, b)
        if sol is None:
            return None
        sigma2 = wls.residual_variance(sol)
        if sigma2 is not None:
            lam = [max(sigma2, 1e-12) / spread2 for spread2 in self._spreads(wls, a, sol, prior, sigma2)]
            a, b = wls.system(0.0, prior, lam=lam)
            sol = solve(a, b)
            if sol is None:
                return None
        return (wls, a, sol, prior), capped

    def _spreads(
        self, wls: WeightedLeastSquares, a: list[list[float]], sol: list[float], prior: list[float], sigma2: float
    ) -> list[float]:
        """Each column's prior variance around the pooled figure, from how far the workloads' nearly free figures
        lie from it beyond their own standard errors (empirical Bayes, per kind of column): workloads that truly
        differ keep their figures, workloads that differ by noise alone are pulled together. At least
        :data:`MIN_SPREAD` of the pooled figure; :data:`PRIOR_SPREAD` with a single workload to compare."""
        n = len(sol)
        out = [(self.PRIOR_SPREAD * max(p, 0.05)) ** 2 for p in prior]
        for kind in (0, 1):
            seen = [i for i in range(kind, n, 2) if wls.xtx[i][i] > 0]
            if len(seen) < 2:
                continue
            excess = []
            for i in seen:
                var = combination_variance(a, [1.0 if j == i else 0.0 for j in range(n)], sigma2)
                excess.append((sol[i] - prior[i]) ** 2 - max(0.0, var or 0.0))
            floor = (self.MIN_SPREAD * max(prior[kind], 0.05)) ** 2
            spread2 = max(floor, sum(excess) / len(excess))
            for i in range(kind, n, 2):
                out[i] = spread2
        return out

    def weights(self) -> DraftWeights:
        """Each workload's first draft position's acceptance ``1 / (1 + beta_w)`` and inexact drafting rate, as
        last fitted (:meth:`refit`); empty before any fit."""
        if self._fitted is None:
            return DraftWeights(workload_multi=self._multi)
        sol = self._fitted[2]
        accept = {w: 1.0 / (1.0 + max(0.0, sol[2 * i])) for i, w in enumerate(self._names)}
        inexact = {w: max(0.0, sol[2 * i + 1]) for i, w in enumerate(self._names)}
        return DraftWeights(accept, inexact, self._multi)

    def stable(self) -> bool:
        """Whether each workload's figures are known to within :data:`MAX_SE` of the pooled figure (one standard
        error), from at least :data:`MIN_INTERVALS` intervals. Before that the figures swing with the few intervals
        seen."""
        self.current()
        if self._fitted is None:
            return False
        wls, a, sol, prior = self._fitted
        n = wls.columns
        seen = [i for i in range(n) if wls.xtx[i][i] > 0]  # a kind of column never seen has nothing to pin
        return bool(seen) and all(
            _pinned(
                wls,
                (a, sol),
                [[1.0 if j == i else 0.0 for j in range(n)]],
                self.MIN_INTERVALS,
                self.MAX_SE * max(prior[i], 0.05),
            )
            for i in seen
        )
