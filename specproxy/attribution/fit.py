"""The two models that counter attribution learns across scrape intervals, on one shared weighted regression.

- :class:`AcceptanceModel`: accepted tokens of each workload's requests whose token counts are approximate.
- :class:`DraftModel`: the share of a workload's decode steps that drafted, for methods that draft on some steps
  only (ngram proposes only when its lookup matches).

Each interval is one observation, weighted by 1 / its decode steps (an interval's variance grows with its steps), and
each coefficient is pulled gently towards the pooled figure, so a workload seen in few intervals borrows from the
rest. At most :data:`MAX_WORKLOADS` workloads get their own coefficients; later ones fall back to the pooled
figure at the point of use.
"""

from __future__ import annotations

from collections.abc import Mapping

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


class DraftModel:
    """``remaining_drafts_j ~= sum_w q_w * unknown_steps_{w,j}``.

    ``unknown_steps`` are the decode steps whose chunk does not show whether they drafted (a step that brought one
    token may have drafted and had everything rejected, or not drafted at all), each weighted by its request's odds
    ratio (:meth:`~specproxy.attribution.intervals.Interval.draft_observation`); ``remaining_drafts`` is the
    interval's drafts less the steps known to have drafted. The prior pulls each ``q_w`` towards the pooled rate;
    rates are clamped to [0, 1].
    """

    RIDGE = 1e-3
    MIN_INTERVALS = 30
    MAX_SE = 0.05  # drafting rate of one-token steps, one standard error

    def __init__(self) -> None:
        self._wls = WeightedLeastSquares()
        self._cols = _Columns(self._wls, 1)
        self._sum_y = 0.0
        self._sum_x = 0.0

    @property
    def intervals(self) -> int:
        return self._wls.observations

    def add(self, unknown_steps: Mapping[str, float], remaining_drafts: float) -> None:
        row: list[tuple[int, float]] = []
        for w, n in unknown_steps.items():
            if n <= 0:
                continue
            i = self._cols.index(w)
            if i is not None:
                row.append((i, n))
        if not row:
            return
        total = sum(n for _, n in row)
        self._sum_y += remaining_drafts
        self._sum_x += total
        self._wls.add(row, remaining_drafts, 1.0 / total)

    def _fit(self) -> tuple[list[list[float]], list[float]] | None:
        n = self._wls.columns
        if n == 0 or self._sum_x <= 0:
            return None
        a, b = self._wls.system(self.RIDGE, [self._sum_y / self._sum_x] * n)
        sol = solve(a, b)
        return None if sol is None else (a, sol)

    def rates(self) -> dict[str, float]:
        fit = self._fit()
        if fit is None:
            return {}
        return {w: min(1.0, max(0.0, v)) for w, v in zip(self._cols.names, fit[1], strict=True)}

    def stable(self) -> bool:
        """Whether each workload's rate is known to within :data:`MAX_SE` (one standard error), from at least
        :data:`MIN_INTERVALS` intervals. Before that the rates swing with the few intervals seen: on the real CPU
        vLLM (ngram k = 3, 16 requests of two workloads at concurrency 4) shares taken from the rates as they stood
        when each request ended put a workload 0-7 points off, from the final rates 1-5 points, steadily."""
        n = self._wls.columns
        combos = [[1.0 if j == i else 0.0 for j in range(n)] for i in range(n)]
        return _pinned(self._wls, self._fit(), combos, self.MIN_INTERVALS, self.MAX_SE)
