"""How close counter attribution comes to the simulator's truth, for one mixed ja_chat / code_agent run.

    python -m benchmarks.attribution_accuracy --concurrency 32 --requests 160 --seed 7 --spec-method ngram
    python -m benchmarks.attribution_accuracy --concurrency 16 --requests 48 --speed 40 \
        --profiles benchmarks/profiles/gpu-smollm2-ngram.json     # shaped like the GPU run (docs/real-engine.md)

The same run as ``tests/test_proxy_sim_attribution.py``'s (the simulator in its own process, the proxy in this one),
with the figures the test bounds printed: per-workload acceptance from the records against the truth, and the mean
error of each request's attributed drafts against its true drafts, over all drafts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from specproxy.sim import load_profiles
from tests.test_proxy_sim_attribution import _mixed_run, _rates


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.attribution_accuracy", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--spec-method", default="ngram")
    p.add_argument("--no-usage", action="store_true", help="clients that do not ask for usage (approximate counts)")
    p.add_argument("--speed", type=float, default=1.0, help="the simulator's time compression (GPU-like: 20-40)")
    p.add_argument("--profiles", help="the simulator's acceptance profiles (JSON; see specproxy sim --profiles)")
    p.add_argument(
        "--output-lag-ms",
        type=float,
        default=0.0,
        help="the simulator's writer away this long after each chunk: steps merged into chunks, as a saturated "
        "API server merges them",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of the lines (for the tests)")
    a = p.parse_args()
    if a.profiles:
        try:  # the simulator would refuse them in its own process; say why here, in one line
            load_profiles(Path(a.profiles))
        except ValueError as e:
            p.error(f"--profiles: {e}")
    with tempfile.TemporaryDirectory() as d:
        measured, true, recs, truths = await _mixed_run(
            Path(d),
            usage=not a.no_usage,
            concurrency=a.concurrency,
            n=a.requests,
            seed=a.seed,
            sim_args=(
                "--spec-method",
                a.spec_method,
                "--speed",
                str(a.speed),
                *(("--profiles", a.profiles) if a.profiles else ()),
                "--output-lag-ms",
                str(a.output_lag_ms),
            ),
        )
    m, t = _rates(measured), _rates(true)
    counted = [r for r in recs if r["spec"]["estimates"].get("counters")]
    err = sum(abs(r["spec"]["estimates"]["counters"]["drafts"] - truths[r["upstream_id"]]["drafts"]) for r in counted)
    total = sum(truths[r["upstream_id"]]["drafts"] for r in counted)
    if a.json:
        doc = {
            "measured": m,
            "truth": t,
            "records": len(recs),
            "sources": sorted({str(r["spec"]["source"]) for r in recs}),
            "steps_unmerged": sum(1 for r in recs if "steps_unmerged" in r["flags"]),
            "partial_drafting_flagged": all("partial_drafting" in r["flags"] for r in recs),
            "drafts_error_share": err / total if total else None,
        }
        print(json.dumps(doc))
        return
    # the counters' share alone, whichever source the records chose (a real engine's ngram records take it)
    by_w: dict[str, dict[str, float]] = {}
    for r in counted:
        c = by_w.setdefault(r["workload"], {"accepted": 0.0, "draft_tokens": 0.0})
        c["accepted"] += r["spec"]["estimates"]["counters"]["accepted"]
        c["draft_tokens"] += r["spec"]["estimates"]["counters"]["draft_tokens"]
    shares = _rates(by_w)
    unchosen = sum(1 for r in recs if r["spec"]["accepted"] is None)
    if unchosen:
        print(f"{unchosen} of {len(recs)} records chose no figure (chunks merged steps), left out of 'acceptance'")
    for w in sorted(t):
        chosen = (
            f"acceptance {m[w]:.4f}  truth {t[w]:.4f}  off by {100 * (m[w] - t[w]):+.1f} points"
            if w in m
            else "no record chose a figure"
        )
        share = f"  (counters' share {shares[w]:.4f}, {100 * (shares[w] - t[w]):+.1f})" if w in shares else ""
        print(f"{w:12s} {chosen}{share}")
    if total:
        print(f"per-request drafts: mean error {err / len(counted):.2f}, {100 * err / total:.1f} % of all drafts")


if __name__ == "__main__":
    asyncio.run(main())
