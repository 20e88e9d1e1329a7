"""``specproxy bench --soak`` at a chosen request rate: ``--soak-rate`` paces the requests, ``--soak-tokens`` sets
their length, and the result says each process's RSS at start, peak and end and the rate reached."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specproxy.bench.soak import render_soak


def _soak(*args: str, fmt: str = "json") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", "bench", "--soak", *args, "--format", fmt],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_a_paced_soak_starts_no_more_requests_than_its_rate_and_prints_each_processs_rss() -> None:
    p = _soak("4", "--soak-streams", "8", "--soak-rate", "25", "--soak-tokens", "4-8", "--steps-per-s", "200")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["config"]["rate"] == 25 and (r["config"]["min_tokens"], r["config"]["max_tokens"]) == (4, 8)
    assert 50 <= r["requests"] <= 4 * 25 + 1  # the 8 streams could start hundreds a second: the pace held them
    assert r["rate"] is not None and r["rate"] <= 26 and r["seconds"] >= 4
    assert r["records"] == r["requests"] and r["every_request_one_record"] and r["outcomes_match"], r
    for name, proc in r["processes"].items():
        assert 1 < proc["base_mb"] <= proc["max_mb"] and 1 < proc["end_mb"] <= proc["max_mb"], name
    text = render_soak(r)
    assert "achieved:" in text and "requests/s (target 25)" in text
    assert all(f"  {name}" in text for name in r["processes"]) and "peak" in text and "2nd half" in text


@pytest.mark.parametrize("tokens", ["1-8", "8-4", "x", "4-"])
def test_soak_tokens_that_cannot_be_taken_get_one_line_and_exit_2(tokens: str) -> None:
    p = _soak("1", "--soak-tokens", tokens)
    assert p.returncode == 2 and "--soak-tokens" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_negative_soak_rate_gets_one_line_and_exit_2() -> None:
    p = _soak("1", "--soak-rate", "-5")
    assert p.returncode == 2 and "--soak-rate" in p.stderr and "Traceback" not in p.stderr, p.stderr
