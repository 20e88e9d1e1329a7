"""specproxy.attribution.wls and .fit: the shared weighted regression and the two models learned on it."""

from __future__ import annotations

import random

import pytest

from specproxy.attribution.fit import MAX_WORKLOADS, AcceptanceModel, DraftModel
from specproxy.attribution.wls import WeightedLeastSquares, combination_variance, solve


def test_solve_and_singular() -> None:
    assert solve([[2.0, 1.0], [1.0, 3.0]], [5.0, 10.0]) == pytest.approx([1.0, 3.0])
    assert solve([[0.0, 1.0], [1.0, 0.0]], [2.0, 3.0]) == pytest.approx([3.0, 2.0])  # needs a pivot
    assert solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0]) is None


def test_wls_recovers_exact_coefficients_and_weights_rows() -> None:
    wls = WeightedLeastSquares()
    wls.add_columns(2)
    rng = random.Random(1)
    for _ in range(20):
        x0, x1 = rng.uniform(1, 10), rng.uniform(1, 10)
        wls.add([(0, x0), (1, x1)], 2 * x0 + 3 * x1, weight=1 / (x0 + x1))
    a, b = wls.system(1e-9, [0.0, 0.0])
    coef = solve(a, b)
    assert coef == pytest.approx([2.0, 3.0], rel=1e-6)
    assert wls.residual_variance(coef) == pytest.approx(0.0, abs=1e-9)  # noise-free
    assert wls.observations == 20 and wls.columns == 2


def test_ridge_pulls_an_unseen_column_to_its_prior() -> None:
    wls = WeightedLeastSquares()
    wls.add_columns(2)
    wls.add([(0, 4.0)], 8.0, weight=1.0)  # column 1 never observed
    coef = solve(*wls.system(1e-3, [0.0, 0.7]))
    assert coef is not None and coef[0] == pytest.approx(2.0, rel=1e-2) and coef[1] == pytest.approx(0.7)


def test_residual_variance_needs_more_rows_than_columns() -> None:
    wls = WeightedLeastSquares()
    wls.add_columns(2)
    wls.add([(0, 1.0), (1, 1.0)], 1.0, weight=1.0)
    assert wls.residual_variance([0.5, 0.5]) is None


def test_variance_of_a_combination() -> None:
    # Var(b0) for A = I * 4, sigma2 = 2: 2 * 1/4
    assert combination_variance([[4.0, 0.0], [0.0, 4.0]], [1.0, 0.0], 2.0) == pytest.approx(0.5)
    assert combination_variance([[0.0, 0.0], [0.0, 0.0]], [1.0, 0.0], 2.0) is None


def _acceptance_intervals(n: int, noise: float, seed: int = 3) -> AcceptanceModel:
    """Intervals of two workloads: ja accepts 0.4 per step and 0.1 per token of text, code 1.2 and 0.3."""
    rng = random.Random(seed)
    model = AcceptanceModel()
    for _ in range(n):
        act = {}
        y = 0.0
        for w, (a, b) in {"ja": (0.4, 0.1), "code": (1.2, 0.3)}.items():
            steps, text = float(rng.randint(5, 40)), rng.uniform(0, 60)
            act[w] = (steps, text)
            y += a * steps + b * text
        model.add(act, y + rng.gauss(0, noise))
    return model


def test_acceptance_model_recovers_each_workload() -> None:
    coef = _acceptance_intervals(60, noise=0.0).coefficients()
    assert coef["ja"] == pytest.approx((0.4, 0.1), abs=2e-3)
    assert coef["code"] == pytest.approx((1.2, 0.3), abs=2e-3)


def test_acceptance_model_is_stable_only_with_enough_intervals_and_little_noise() -> None:
    assert not AcceptanceModel().stable() and AcceptanceModel().coefficients() == {}
    assert not _acceptance_intervals(AcceptanceModel.MIN_INTERVALS - 1, noise=0.1).stable()
    assert _acceptance_intervals(200, noise=0.1).stable()
    assert not _acceptance_intervals(40, noise=50.0).stable()


def test_acceptance_model_skips_empty_activity_and_caps_workloads() -> None:
    model = AcceptanceModel()
    model.add({"ja": (0.0, 5.0)}, 3.0)
    assert model.intervals == 0
    for i in range(MAX_WORKLOADS + 3):
        model.add({f"w{i}": (10.0, 12.0)}, 5.0)
    assert len(model.coefficients()) == MAX_WORKLOADS
    assert model.intervals == MAX_WORKLOADS  # intervals of workloads beyond the cap teach nothing


def test_draft_model_recovers_the_drafting_rate_of_each_workload() -> None:
    rng = random.Random(5)
    model = DraftModel()
    for _ in range(80):
        ja, code = float(rng.randint(1, 30)), float(rng.randint(1, 30))
        model.add({"ja": ja, "code": code}, 0.25 * ja + 0.8 * code)
    rates = model.rates()
    assert rates["ja"] == pytest.approx(0.25, abs=0.01) and rates["code"] == pytest.approx(0.8, abs=0.01)


def test_draft_rates_are_clamped_and_empty_without_data() -> None:
    assert DraftModel().rates() == {}
    model = DraftModel()
    for n in (5.0, 9.0, 14.0):
        model.add({"ja": n}, 2 * n)  # more drafts than steps: nonsense data, a rate still within [0, 1]
    assert model.rates() == {"ja": 1.0}


def _draft_intervals(n: int, noise: float) -> DraftModel:
    rng = random.Random(11)
    model = DraftModel()
    for _ in range(n):
        ja, code = float(rng.randint(1, 30)), float(rng.randint(1, 30))
        model.add({"ja": ja, "code": code}, 0.25 * ja + 0.8 * code + rng.gauss(0, noise))
    return model


def test_draft_model_is_stable_only_with_enough_intervals_and_little_noise() -> None:
    assert not DraftModel().stable()
    assert not _draft_intervals(DraftModel.MIN_INTERVALS - 1, noise=0.1).stable()  # too few, however clean
    assert _draft_intervals(200, noise=0.5).stable()
    assert not _draft_intervals(40, noise=30.0).stable()  # enough intervals, rates not pinned down
    assert _draft_intervals(DraftModel.MIN_INTERVALS + 5, noise=0.1).intervals == DraftModel.MIN_INTERVALS + 5
