"""What shadowing costs the live path: TTFT and inter-chunk gaps of live requests through a proxy that shadows a
share of them to a candidate, against one that does not, in front of one live engine, interleaved in one run.

The relays do not change with ``--shadow`` (the bookkeeper sends the shadows), so what could cost the live requests
is the bookkeeper's extra work and, where the candidate shares the machine with the live engine (as the two
simulators do here, on the same cores), the candidate's load. Both proxies are ``specproxy proxy --workers 1``,
recording; rounds alternate which goes first (ABBA); per concurrency the figures are medians over every live
request of the side, from the client.

    python -m benchmarks.shadow                      # base simulator live, MTP k=3 candidate, share 0.25
    python -m benchmarks.shadow --share 1 --concurrency 1,16
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.observer import ab_arguments, ab_levels, abba, proxy_child, run_ab, side_by_side
from specproxy.bench.procs import python_child


async def _shadows_sent(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url + "/specproxy/status") as r:
        doc = await r.json()
    return sum(int(c.get("sent", 0)) for c in doc.get("shadow", {}).get("candidates", {}).values())


async def measure(
    live: str, candidate: str, *, share: float, levels: Sequence[int], requests: int, rounds: int, max_tokens: int
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="specproxy-shadowcost-") as tmp:
        shadow_args = ("--shadow", f"cand={candidate}", "--shadow-share", str(share), "--shadow-max-inflight", "64")
        async with (
            proxy_child(live, Path(tmp) / "on.jsonl", *shadow_args) as on,
            proxy_child(live, Path(tmp) / "off.jsonl") as off,
        ):
            return await abba(on.url, off.url, lambda: _shadows_sent(on.url), side="shadowing", counted="shadows",
                              model="sim-model", levels=levels, requests=requests, rounds=rounds,
                              max_tokens=max_tokens, usage=True)  # fmt: skip


def render(rows: Sequence[dict[str, Any]], what: str) -> str:
    title = f"shadowing's cost to live requests: {what}; two proxies (--workers 1), one with --shadow, rounds " \
            "interleaved (ABBA)"  # fmt: skip
    return side_by_side(rows, title, side="shadowing", counted="shadows", added="shadowing")


async def _main(a: argparse.Namespace) -> int:
    levels = a.levels
    sim = ["-m", "specproxy", "sim", "--listen", "127.0.0.1:0", "--speed", str(a.speed)]
    async with (
        python_child(*sim, "--spec-method", "none") as live,
        python_child(*sim, "--spec-method", "mtp", "-k", "3", "--per-request-spec-metrics", "summary") as cand,
    ):
        rows = await measure(live.url, cand.url, share=a.share, levels=levels, requests=a.requests,
                             rounds=a.rounds, max_tokens=a.max_tokens)  # fmt: skip
    what = f"base simulator live, MTP k=3 simulator candidate on the same machine, share {a.share}"
    sys.stdout.write(
        json.dumps({"what": what, "rows": rows}, indent=2) + "\n" if a.format == "json" else render(rows, what) + "\n"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.shadow", description=__doc__.split("\n\n")[0])
    p.add_argument("--share", type=float, default=0.25, help="--shadow-share of the shadowing proxy")
    ab_arguments(p)
    a = p.parse_args(argv)
    a.levels = ab_levels(p, a)
    if not 0.0 < a.share <= 1.0:
        p.error(f"--share must be in (0, 1], got {a.share}")
    return run_ab("shadow bench", _main(a))


if __name__ == "__main__":
    raise SystemExit(main())
