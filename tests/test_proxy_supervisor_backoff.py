"""The supervisor's decisions that need no child process: the restart backoff and its limit per role, how a child's
end is said, and the records found written after all for requests counted lost with a dead bookkeeper
(tests/test_proxy_supervisor.py kills real processes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from specproxy.proxy import supervisor
from specproxy.proxy.supervisor import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    RESTART_LIMIT,
    RESTART_WINDOW_S,
    _how,
    _written_after_all,
    recent_deaths,
    restart_delay,
)


def test_the_backoff_doubles_per_death_from_the_first_delay() -> None:
    assert [restart_delay(n) for n in range(1, RESTART_LIMIT + 1)] == pytest.approx(
        [BACKOFF_FIRST_S * 2**i for i in range(RESTART_LIMIT)]
    )
    assert [restart_delay(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])


def test_past_the_limit_a_role_is_not_restarted() -> None:
    assert restart_delay(RESTART_LIMIT) is not None
    assert restart_delay(RESTART_LIMIT + 1) is None
    assert restart_delay(100) is None


def test_the_backoff_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "RESTART_LIMIT", 1000)
    assert restart_delay(7) == pytest.approx(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 64))
    assert restart_delay(30) == BACKOFF_MAX_S


def test_only_deaths_within_the_window_count_and_this_one_is_added() -> None:
    now = 1000.0
    old = now - RESTART_WINDOW_S  # exactly a window ago: out
    assert recent_deaths([old, now - 30.0, now - 1.0], now) == [now - 30.0, now - 1.0, now]
    assert recent_deaths([], now) == [now]


def test_a_role_dying_steadily_more_slowly_than_the_window_is_restarted_forever() -> None:
    deaths: list[float] = []
    for i in range(50):
        deaths = recent_deaths(deaths, i * (RESTART_WINDOW_S / 2))
        assert restart_delay(len(deaths)) is not None
    # and one that dies faster reaches the limit at its (RESTART_LIMIT + 1)-th death
    deaths = []
    for i in range(RESTART_LIMIT + 1):
        deaths = recent_deaths(deaths, float(i))
    assert restart_delay(len(deaths)) is None


def test_how_a_child_ended_is_said() -> None:
    assert _how(None) == "not reaped yet"
    assert _how(3 << 8) == "exit status 3"  # a wait status: the exit code in the high byte
    assert _how(0) == "exit status 0"
    assert _how(int(signal.SIGKILL)) == "killed by SIGKILL"


RID_A, RID_B, RID_C = "a" * 16, "b" * 16, "c" * 16


def test_records_written_before_the_death_are_found_in_the_file_and_its_rotated_one(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    (tmp_path / "records.jsonl.1").write_text(f'{{"v":1,"request_id":"{RID_A}"}}\n')
    path.write_text(f'{{"v":1,"request_id":"{RID_B}","x":1}}\n{{"request_id":"{RID_B}"}}\nnot a record\n')
    assert _written_after_all(str(path), [RID_A, RID_B, RID_C]) == 2  # each found once, C not written
    assert _written_after_all(str(path), [RID_C]) == 0
    assert _written_after_all(str(path), []) == 0
    assert _written_after_all(None, [RID_A]) == 0


def test_a_record_path_that_is_no_file_finds_nothing(tmp_path: Path) -> None:
    assert _written_after_all(str(tmp_path / "absent.jsonl"), [RID_A]) == 0
    assert _written_after_all(os.devnull, [RID_A]) == 0
