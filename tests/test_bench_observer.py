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
    p = _observer("--speed", "20", "--requests", "3", "--rounds", "2", "--concurrency", "1,2", "--max-tokens", "6",
                  "--engine-alone", "--format", "json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    docs = json.loads(p.stdout)
    # the simulator without and with its per-request figures, each through the proxies and then alone
    assert [bool(d.get("alone")) for d in docs] == [False, True, False, True]
    for doc in docs:
        assert [row["concurrency"] for row in doc["rows"]] == [1, 2]
        for row in doc["rows"]:
            on, off = row["scraping_on"], row["scraping_off"]
            assert on["requests"] == off["requests"] == 3 * 2 and not on["failed"] and not off["failed"]
            assert row["ttft_added_p50_ms"] == pytest.approx(on["ttft_p50_ms"] - off["ttft_p50_ms"], abs=0.011)
            if doc.get("alone"):  # the client itself read /metrics once per request, after its first token
                assert on["scrapes"] == 3 * 2


def test_bad_observer_options_are_one_line_errors() -> None:
    p = _observer("--concurrency", "1,x")
    assert p.returncode == 2 and "--concurrency must be integers" in p.stderr and "Traceback" not in p.stderr
