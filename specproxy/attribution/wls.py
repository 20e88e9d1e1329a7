"""Weighted least squares, accumulated one observation at a time, with a ridge pull towards a prior.

Both models of counter attribution (:mod:`specproxy.attribution.fit`) explain an interval's counter delta by the
activity of each workload in it, and learn across many intervals. They share this solver: normal equations
``X'WX b = X'Wy`` kept as running sums (columns are added when a new workload appears), a ridge term
``lam * (b - prior)`` that keeps a workload seen in few intervals near the pooled figure, and the variance of a
linear combination of the coefficients for a stability test. Plain Python: at most a few dozen columns.
"""

from __future__ import annotations

from collections.abc import Sequence


class WeightedLeastSquares:
    def __init__(self) -> None:
        self.xtx: list[list[float]] = []
        self.xty: list[float] = []
        self.yy = 0.0  # weighted sum of squared responses, for the residual variance
        self.observations = 0

    @property
    def columns(self) -> int:
        return len(self.xty)

    def add_columns(self, n: int) -> None:
        for row in self.xtx:
            row.extend([0.0] * n)
        width = len(self.xty) + n
        self.xtx.extend([0.0] * width for _ in range(n))
        self.xty.extend([0.0] * n)

    def add(self, row: Sequence[tuple[int, float]], y: float, weight: float) -> None:
        """One observation: ``row`` lists (column, value) of its non-zero regressors."""
        self.observations += 1
        self.yy += weight * y * y
        for i, xi in row:
            self.xty[i] += weight * xi * y
            for j, xj in row:
                self.xtx[i][j] += weight * xi * xj

    def system(
        self, ridge: float, prior: Sequence[float], lam: Sequence[float] | None = None
    ) -> tuple[list[list[float]], list[float]]:
        """The regularised system ``(X'WX + Lam) b = X'Wy + Lam prior``, with ``Lam`` diagonal: ``lam`` per column
        as given (a prior worth a fixed amount of evidence) or ``ridge`` times the mean diagonal (scale-free), plus
        a floor that keeps an empty column solvable."""
        n = self.columns
        if lam is None:
            lam = [ridge * sum(self.xtx[i][i] for i in range(n)) / n] * n
        lams = [v + 1e-9 for v in lam]
        a = [[self.xtx[i][j] + (lams[i] if i == j else 0.0) for j in range(n)] for i in range(n)]
        b = [self.xty[i] + lams[i] * prior[i] for i in range(n)]
        return a, b

    def residual_variance(self, coef: Sequence[float]) -> float | None:
        """Weighted residual sum of squares per degree of freedom; None without more observations than columns."""
        n = self.columns
        dof = self.observations - n
        if dof <= 0:
            return None
        rss = self.yy - 2 * sum(s * y for s, y in zip(coef, self.xty, strict=True))
        rss += sum(coef[i] * self.xtx[i][j] * coef[j] for i in range(n) for j in range(n))
        return max(0.0, rss) / dof


def combination_variance(a: Sequence[Sequence[float]], v: Sequence[float], sigma2: float) -> float | None:
    """Var(v . b) = sigma2 * v' A^-1 v for the solution b of ``A b = ...``; None when ``a`` is singular."""
    av = solve(a, v)
    if av is None:
        return None
    return sigma2 * sum(vi * ai for vi, ai in zip(v, av, strict=True))


def solve(a: Sequence[Sequence[float]], b: Sequence[float]) -> list[float] | None:
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
