"""``SPECPROXY_TRACEMALLOC=DIR`` (:mod:`specproxy.proxy.memtrace`): off unless set; when set, a process's report
names what grew after warm-up and logs traced memory beside RSS."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from specproxy.proxy import allocator, memtrace

KEPT: list[bytes] = []


def test_off_unless_the_variable_names_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memtrace.ENV, raising=False)
    assert memtrace.from_env("sp-relay-0") is None


def test_only_the_processes_named_are_traced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(memtrace.ENV, str(tmp_path / "traces"))
    monkeypatch.setenv(memtrace.ENV + "_PROCESSES", "sp-bookkeeper, main")
    assert memtrace.from_env("sp-relay-0") is None
    trace = memtrace.from_env("main")
    tracemalloc.stop()
    assert trace is not None


def test_the_report_names_what_grew_since_warm_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(memtrace.ENV, str(tmp_path / "traces"))
    assert not tracemalloc.is_tracing()
    trace = memtrace.from_env("sp-bookkeeper")
    assert trace is not None
    try:
        trace.mark_warm()
        KEPT.extend(bytes(1000) for _ in range(2000))  # 2 MB that stays
        trace.report()
    finally:
        tracemalloc.stop()
        KEPT.clear()
    (log,) = (tmp_path / "traces").glob("sp-bookkeeper-*.log")
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 and all(len(f) == 3 for f in lines)
    traced = [float(f[1]) for f in lines]
    assert traced[1] - traced[0] > 1.5  # MB: the bytes kept, seen by tracemalloc
    (txt,) = (tmp_path / "traces").glob("sp-bookkeeper-*.txt")
    first = txt.read_text().split(" KiB,")[0]
    assert float(first) > 1500 and "test_memtrace.py" in txt.read_text().split(" KiB,")[1]


def test_one_arena_leaves_a_users_malloc_arena_max_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(allocator.ENV, "4")
    assert allocator.one_arena() is False
