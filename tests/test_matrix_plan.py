"""The one request list of a matrix (specproxy.matrix.plan): exactly ``requests`` per workload and repeat, cycling
through a short file; warm-up from the mixed plan; bodies without a model until one is filled in; a fingerprint
that changes with any body or the order."""

from __future__ import annotations

from dataclasses import replace

from specproxy.matrix.plan import build_plan, with_model
from specproxy.matrix.spec import MatrixSpec
from specproxy.workloads import Workload, WorkloadItem


def _wl(name: str, n: int) -> Workload:
    items = tuple(
        WorkloadItem(id=f"{name}{i}", messages=({"role": "user", "content": f"{name} {i}"},)) for i in range(n)
    )
    return Workload(name=name, description="", max_tokens=16, items=items, source=name)


def _spec(**kw: object) -> MatrixSpec:
    base = MatrixSpec(configurations=(), workloads=("a", "b"), requests=5, warmup=3, repeats=2, concurrency=4)
    return replace(base, **kw)  # type: ignore[arg-type]


WLS = [_wl("a", 2), _wl("b", 7)]


def test_each_workload_gives_exactly_requests_cycling_through_a_short_file() -> None:
    plan = build_plan(_spec(), WLS)
    assert [name for name, _ in plan.per_workload] == ["a", "b"]
    a, b = (reqs for _, reqs in plan.per_workload)
    ids = [r.item_id for r in a]
    # shuffled per pass with the seed: each pass through the file holds every item once
    assert len(ids) == 5 and sorted(ids[:2]) == sorted(ids[2:4]) == ["a0", "a1"] and ids[4] in ("a0", "a1")
    assert len(b) == 5 and {r.workload for r in b} == {"b"} and len({r.item_id for r in b}) == 5
    assert plan.measured == 2 * 10
    assert (plan.repeats, plan.concurrency, len(plan.warmup)) == (2, 4, 3)


def test_bodies_leave_the_model_to_each_configuration() -> None:
    plan = build_plan(_spec(max_tokens=9), WLS)
    bodies = [r.body for r in plan.warmup] + [r.body for _, reqs in plan.per_workload for r in reqs]
    assert all(b.get("model") == "" for b in bodies)
    named = with_model(plan.per_workload[0][1], "llama")
    assert [r.body["model"] for r in named] == ["llama"] * 5
    assert [{**r.body, "model": ""} for r in named] == [r.body for r in plan.per_workload[0][1]]
    assert plan.per_workload[0][1][0].body["model"] == ""  # the plan itself is untouched


def test_equal_plans_have_equal_fingerprints_and_any_difference_changes_it() -> None:
    fp = build_plan(_spec(), WLS).fingerprint()
    assert fp == build_plan(_spec(), [_wl("a", 2), _wl("b", 7)]).fingerprint() and len(fp) == 16
    others = [
        build_plan(_spec(seed=1), WLS),  # another shuffle
        build_plan(_spec(repeats=3), WLS),
        build_plan(_spec(concurrency=1), WLS),
        build_plan(_spec(warmup=2), WLS),
        build_plan(_spec(requests=4), WLS),
        build_plan(_spec(max_tokens=5), WLS),
        build_plan(_spec(), [_wl("b", 7), _wl("a", 2)]),
        build_plan(_spec(), [_wl("a", 3), _wl("b", 7)]),
    ]
    assert len({fp, *(p.fingerprint() for p in others)}) == 1 + len(others)
