"""benchmarks.cpuspeed: a pinned loop on k CPUs at once, each CPU's median printed; bad arguments exit 2."""

from __future__ import annotations

import os
import re

import pytest

from benchmarks.cpuspeed import main, medians

pytestmark = pytest.mark.unit


def test_each_cpu_asked_for_gets_a_median_of_its_own() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    got = medians(cpus, 0.05)
    assert list(got) == cpus and all(m > 0 for m in got.values())


def test_the_printout_has_a_line_per_round_and_count(capsys: pytest.CaptureFixture[str]) -> None:
    cpu = min(os.sched_getaffinity(0))
    assert main(["--cpus", str(cpu), "--counts", "1", "--seconds", "0.05", "--rounds", "2"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("round")]
    assert [x.split()[:3] for x in lines] == [["round", "1", "k=1"], ["round", "2", "k=1"]]
    assert all(re.search(rf" {cpu}:\d+ ", x) for x in lines)


@pytest.mark.parametrize(
    "args", [["--cpus", "x"], ["--counts", "0"], ["--counts", "999"], ["--cpus", "4096"], ["--seconds", "0"]]
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
