"""``python -m specproxy.bench.observer``: what scraping costs the engine, side by side, in one run; and with
``--engine-alone`` the engine's own floor (no proxy, one /metrics per request after its first token). Real processes
(the simulator, two proxies) on real sockets; the figures are the host's, so only the structure and the counts are
asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _observer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy.bench.observer", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_observer_measures_both_sides_and_the_engines_own_floor() -> None:
    p = _observer("--speed", "20", "--requests", "3", "--rounds", "3", "--concurrency", "1,2", "--max-tokens", "6",
                  "--engine-alone", "--format", "json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    docs = json.loads(p.stdout)
    # the simulator without and with its per-request figures, each through the proxies and then alone
    assert [bool(d.get("alone")) for d in docs] == [False, True, False, True]
    for doc in docs:
        assert [row["concurrency"] for row in doc["rows"]] == [1, 2]
        for row in doc["rows"]:
            on, off = row["scraping_on"], row["scraping_off"]
            assert on["requests"] == off["requests"] == 3 * 3 and not on["failed"] and not off["failed"]
            assert row["ttft_added_p50_ms"] == pytest.approx(on["ttft_p50_ms"] - off["ttft_p50_ms"], abs=0.011)
            lo, hi = row["ttft_added_p50_ci_ms"]  # how far the run's noise alone could move it
            assert lo <= hi
            if doc.get("alone"):  # the client itself read /metrics once per request, after its first token
                assert on["scrapes"] == 3 * 3


def test_bad_observer_options_are_one_line_errors() -> None:
    p = _observer("--concurrency", "1,x")
    assert p.returncode == 2 and "--concurrency must be integers" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.unit
def test_the_added_ttft_comes_with_the_interval_the_runs_noise_allows() -> None:
    from specproxy.bench.observer import added_interval

    on = [[0.110 + 0.0001 * (i % 7) for i in range(12)] for _ in range(4)]  # seconds: 10 ms slower, steady waves
    off = [[0.100 + 0.0001 * (i % 5) for i in range(12)] for _ in range(4)]
    ci = added_interval(on, off)
    assert ci is not None and 9.0 < ci[0] <= ci[1] < 11.0
    # each wave's requests move together (a queue, the machine's moment): the waves, not the requests, say how far
    drifting = [[0.100 + 0.020 * w + 0.0001 * i for i in range(12)] for w in range(4)]
    wide = added_interval(drifting, list(reversed(drifting)))
    assert wide is not None and wide[0] < 0.0 < wide[1] and wide[1] - wide[0] > 10.0
    assert added_interval(on[:2], off) is None  # two waves say nothing of the drift between them
    # drift that falls on both waves of a round (ABBA) cancels: rounds are resampled as pairs
    shifted = [[t + 0.005 for t in w] for w in drifting]
    paired = added_interval(shifted, drifting)
    assert paired is not None and 4.0 < paired[0] <= paired[1] < 6.0


@pytest.mark.unit
def test_the_verdict_passes_or_fails_only_what_the_interval_clears() -> None:
    from specproxy.bench.observer import verdict

    assert verdict(0.5, [-0.2, 0.8], 1.0) == "pass"
    assert verdict(5.0, [2.0, 8.0], 1.0) == "FAIL"
    assert verdict(-4.86, [-20.0, 15.0], 1.0).startswith("cannot tell")  # an interval holding both sides of the target
    assert verdict(24.97, [-3.0, 50.0], 1.0).startswith("cannot tell")
    assert verdict(0.5, None, 1.0) == "pass" and verdict(2.0, None, 1.0) == "FAIL" and verdict(None, None, 1.0) == "-"
    assert verdict(-34.5, [-43.3, -6.2], 1.0) == "pass"
