"""The run summary names the output rate as what it is: one figure of the whole run, with each workload's share of
it, never a per-workload "output tok/s" that reads like a speed."""

from __future__ import annotations

import pytest

from specproxy.core.record import Record
from specproxy.loadgen.summary import format_summary, summarize_run
from tests.analysisutil import T0, make_record


def _rec(i: int, workload: str, start: float, tokens: int) -> Record:
    # one request at a time, about 1 s each: the workloads interleave over a 3 s run
    return make_record(
        f"r{i}", workload=workload, started_at=T0 + start, plain_steps=tokens - 1, step_s=0.95 / (tokens - 1)
    )


def test_output_rate_is_the_runs_and_shares_are_named_as_shares() -> None:
    records = [_rec(0, "a", 0.0, 20), _rec(1, "b", 1.0, 40), _rec(2, "a", 2.0, 20)]
    span = max((r["started_at"] or 0) + (r["e2e_s"] or 0) for r in records) - T0
    assert 2.9 < span < 3.1
    s = summarize_run(records, order=["a", "b"])
    assert s.output_tok_s is not None and s.output_tok_s.value == pytest.approx(80 / span)
    text = format_summary(s)
    header = text.splitlines()[0]
    assert "output tok/s" not in header and "decode tok/s" in header
    assert f"output of the whole run: {80 / span:.1f} tok/s" in text
    # a: 40 of 80 tokens, b: 40 of 80: each half the run's rate, labelled as a share, not as a speed
    half = f"{40 / span:.1f}"
    own = "`report`'s output tok/s is over each workload's own span"
    assert f"share of it (not its speed, which is decode tok/s; {own}): a {half}, b {half}" in text
    # the workload's own speed is far above its share: b decodes 39 tokens in 0.95 s
    (b,) = [w for w in s.workloads if w.get("workload") == "b"]
    assert b.figure("decode_tok_s_p50") == pytest.approx(39 / 0.95)
