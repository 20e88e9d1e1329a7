"""specproxy.attribution.wls and .fit: the shared weighted regression and the two models learned on it."""

from __future__ import annotations

import random

import pytest

from specproxy.attribution.fit import MAX_WORKLOADS, AcceptanceModel, DraftModel
from specproxy.attribution.intervals import Evidence
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


def _requests(rng: random.Random, n: int, workload: str, a: float) -> list[tuple[str, float, Evidence]]:
    """``n`` requests of one workload, each drafting on its own share of steps, accepting first drafts at ``a``."""
    out = []
    for _ in range(n):
        p = rng.uniform(0.1, 0.9)
        out.append((workload, p, Evidence(steps=2000.0, multi=2000.0 * p * a)))  # evidence enough to pin f
    return out


def _simulated(
    intervals: int, accept: dict[str, float], seed: int = 5, exact_noise: bool = True
) -> tuple[DraftModel, dict[str, Evidence]]:
    """Intervals of 4 requests of two workloads (their membership varies), each request with 1-8 one-token steps
    in it; the drafts hidden among them drawn as the model says (each drafts with p (1 - a) / (1 - p a))."""
    rng = random.Random(seed)
    workloads: dict[str, Evidence] = {}
    model = DraftModel(workloads)
    pool = [r for w, a in accept.items() for r in _requests(rng, 40, w, a)]
    for w, a in accept.items():
        workloads[w] = Evidence(steps=1000.0, multi=1000.0 * 0.5 * a)
    for _ in range(intervals):
        members, hidden, steps = [], 0.0, 0.0
        for w, p, ev in rng.sample(pool, 4):
            a = accept[w]
            unknown = float(rng.randint(1, 8))
            q = p * (1 - a) / (1 - p * a)
            hidden += sum(1 for _ in range(int(unknown)) if rng.random() < q) if exact_noise else unknown * q
            members.append((w, unknown, ev))
            steps += unknown + rng.randint(0, 4)
        model.add(hidden, steps, members)
    return model, workloads


def test_draft_model_recovers_each_workloads_first_position_acceptance() -> None:
    model, _ = _simulated(200, {"code": 0.8, "ja": 0.4}, exact_noise=False)
    model.refit()
    got = model.weights().first_accept
    assert got["code"] == pytest.approx(0.8, abs=0.01) and got["ja"] == pytest.approx(0.4, abs=0.01)


def test_draft_model_with_noise_gets_close_and_a_few_intervals_lean_on_the_pooled_figure() -> None:
    model, _ = _simulated(400, {"code": 0.8, "ja": 0.4})
    model.refit()
    got = model.weights().first_accept
    assert got["code"] == pytest.approx(0.8, abs=0.05) and got["ja"] == pytest.approx(0.4, abs=0.05)
    # the same acceptance in both, 12 noisy intervals: the prior keeps them together where a free fit would not
    model, _ = _simulated(12, {"code": 0.6, "ja": 0.6}, seed=3)
    model.refit()
    got = model.weights().first_accept
    assert abs(got["code"] - got["ja"]) < 0.1, got


def test_draft_model_uses_each_requests_evidence_as_it_stands_at_the_fit() -> None:
    # one request, its one-token steps hiding 2 drafts in every interval. Seen so far: half its steps brought several
    # tokens. Later it brings one token on most: it drafts less often than it looked, so its first drafts must be
    # rejected more often to hide as many drafts (a lower a)
    ev = Evidence(steps=20.0, multi=10.0)
    workloads = {"w": Evidence(steps=20.0, multi=10.0)}
    model = DraftModel(workloads)
    for _ in range(40):
        model.add(2.0, 10.0, [("w", 5.0, ev)])
    model.refit()
    before = model.weights().first_accept["w"]
    ev.steps, ev.multi = 200.0, 20.0
    workloads["w"].steps, workloads["w"].multi = 200.0, 20.0
    model.refit()
    assert model.weights().first_accept["w"] < before - 0.2


def test_draft_weights_are_empty_without_data_and_a_negative_fit_reads_no_hidden_drafts() -> None:
    assert DraftModel().weights().first_accept == {}
    ev = Evidence(steps=20.0, multi=10.0)
    model = DraftModel({"ja": ev})
    for n in (5.0, 9.0, 14.0):
        model.add(-n, 20.0, [("ja", n, ev)])  # fewer drafts than the known ones (late chunks): nonsense
    model.refit()
    assert model.weights().first_accept == {"ja": 1.0}


def test_inexact_requests_get_their_workloads_drafts_per_step() -> None:
    rng = random.Random(2)
    model = DraftModel({})
    for _ in range(60):
        ja, code = float(rng.randint(1, 30)), float(rng.randint(1, 30))
        model.add(
            0.25 * ja + 0.8 * code,
            ja + code,
            [("ja", ja, Evidence(exact=False)), ("code", code, Evidence(exact=False))],
        )
    model.refit()
    rates = model.weights().inexact_rate
    assert rates["ja"] == pytest.approx(0.25, abs=0.01) and rates["code"] == pytest.approx(0.8, abs=0.01)


def test_draft_model_is_stable_only_with_enough_intervals_and_little_noise() -> None:
    assert not DraftModel().stable()
    assert not _simulated(DraftModel.MIN_INTERVALS - 1, {"code": 0.8, "ja": 0.4}, exact_noise=False)[0].stable()
    assert _simulated(400, {"code": 0.8, "ja": 0.4}, exact_noise=False)[0].stable()
    assert not _simulated(40, {"code": 0.8, "ja": 0.4})[0].stable()  # enough intervals, figures not pinned down
    model = _simulated(DraftModel.MIN_INTERVALS + 5, {"code": 0.8, "ja": 0.4})[0]
    assert model.intervals == DraftModel.MIN_INTERVALS + 5


def test_requests_that_draft_on_every_step_do_not_drag_their_workloads_figure() -> None:
    # half the requests draft on every step and accept 4 first drafts in 5 (f = 0.8): every one-token step of theirs
    # hides a draft, however high beta * odds would put it; the other half draft on half their steps, accepting 1 in
    # 2 (f = 0.25: a third of their one-token steps hide a draft), which pins a = 0.5 (beta = 1). Uncapped, the first
    # half would read as hiding 4 drafts per one-token step and pull a up
    every, half = Evidence(steps=1000.0, multi=800.0), Evidence(steps=1000.0, multi=250.0)
    model = DraftModel({"w": Evidence(steps=2000.0, multi=1050.0)})
    rng = random.Random(4)
    for _ in range(100):
        u_every, u_half = float(rng.randint(1, 6)), float(rng.randint(1, 6))
        model.add(u_every + u_half / 3, 2 * (u_every + u_half), [("w", u_every, every), ("w", u_half, half)])
    model.refit()
    assert model.weights().first_accept["w"] == pytest.approx(0.5, abs=0.02)


def test_workloads_that_truly_differ_keep_their_figures() -> None:
    # how far apart the workloads' figures may lie is read from the data: 60 noisy intervals of workloads that accept
    # first drafts 4 in 5 and 2 in 5 keep them apart (a prior of a fixed spread, 0.3 of the pooled figure, read 0.79
    # and 0.435), where intervals of workloads alike are kept together (above)
    model, _ = _simulated(60, {"code": 0.8, "ja": 0.4}, seed=1)
    model.refit()
    got = model.weights().first_accept
    assert got["code"] == pytest.approx(0.8, abs=0.025) and got["ja"] == pytest.approx(0.4, abs=0.025), got


def test_a_workload_whose_drafts_are_all_rejected_keeps_its_hidden_drafts() -> None:
    # code drafts on a share p of its steps and accepts first drafts at 0.6; "broken" drafts on half of its steps and
    # has every draft rejected, so none of its steps brings several tokens. Its drafts hide in its one-token steps
    # all the same: they are its own, not code's (whose first-draft acceptance would then read far too low)
    rng = random.Random(11)
    code = _requests(rng, 40, "code", 0.6)
    broken = Evidence(steps=2000.0, multi=0.0)
    workloads = {"code": Evidence(steps=1000.0, multi=1000.0 * 0.5 * 0.6), "broken": Evidence(steps=1000.0)}
    model = DraftModel(workloads)
    for _ in range(300):
        members, hidden, steps = [], 0.0, 0.0
        for w, p, ev in rng.sample(code, rng.randint(0, 3)):
            unknown = float(rng.randint(1, 8))
            hidden += unknown * p * (1 - 0.6) / (1 - p * 0.6)
            members.append((w, unknown, ev))
            steps += unknown
        for _ in range(rng.randint(0, 2)):
            unknown = float(rng.randint(1, 8))
            hidden += 0.5 * unknown
            members.append(("broken", unknown, broken))
            steps += unknown
        model.add(hidden, steps, members)
    model.refit()
    w = model.weights()
    assert w.first_accept["code"] == pytest.approx(0.6, abs=0.03)
    assert w.weight("broken", broken, 10.0) == pytest.approx(5.0, abs=0.3)  # half its one-token steps drafted
    # and a workload that drafts nothing is read so too
    model = DraftModel({"quiet": Evidence(steps=500.0)})
    for _ in range(40):
        model.add(0.0, 10.0, [("quiet", 10.0, Evidence(steps=50.0))])
    model.refit()
    assert model.weights().weight("quiet", Evidence(steps=50.0), 10.0) == pytest.approx(0.0, abs=0.05)


@pytest.mark.parametrize(("members", "every"), [(16, 1), (64 * 4, 4)])
def test_with_many_members_kept_the_draft_model_refits_every_few_intervals(members: int, every: int) -> None:
    """A refit costs in proportion to the members of the intervals kept: beyond FIT_MEMBERS of them, the weights
    are refitted every so many intervals (as many as FIT_MEMBERS is exceeded times over), else at every one."""
    rng = random.Random(3)
    pool = _requests(rng, 2 * members, "code", 0.8)
    model = DraftModel({"code": Evidence(steps=1000.0, multi=400.0)})

    def interval() -> None:
        picked = rng.sample(pool, members)
        model.add(rng.uniform(0.0, members), 4.0 * members, [(w, float(rng.randint(1, 8)), ev) for w, _, ev in picked])

    for _ in range(DraftModel.MAX_ROWS):  # every row kept is full
        interval()
    fits, last = 0, model.current().first_accept
    for _ in range(40):
        interval()
        now = model.current().first_accept
        fits += now != last
        last = now
    assert max(1, members * DraftModel.MAX_ROWS // DraftModel.FIT_MEMBERS) == every
    assert fits == 40 // every
