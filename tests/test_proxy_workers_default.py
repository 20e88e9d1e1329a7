"""How many relays ``--workers`` defaults to (specproxy.proxy.workers.default_workers): one per core this process
may run on, at least one and at most MAX_DEFAULT_WORKERS."""

from __future__ import annotations

import os

import pytest

from specproxy.proxy.workers import MAX_DEFAULT_WORKERS, default_workers


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (3, 3), (MAX_DEFAULT_WORKERS, MAX_DEFAULT_WORKERS), (64, 8)])
def test_one_relay_per_allowed_core_up_to_the_maximum(
    monkeypatch: pytest.MonkeyPatch, cores: int, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert default_workers() == expected


@pytest.mark.parametrize(("count", "expected"), [(None, 1), (2, 2), (100, MAX_DEFAULT_WORKERS)])
def test_without_affinity_the_cpu_count_is_used(
    monkeypatch: pytest.MonkeyPatch, count: int | None, expected: int
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: count)
    assert default_workers() == expected
