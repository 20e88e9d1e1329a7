"""What shadowing costs the live path: TTFT and inter-chunk gaps of live requests through a proxy that shadows a
share of them to a candidate, against one that does not, in front of one live engine, interleaved in one run.

The relays do not change with ``--shadow`` (the bookkeeper sends the shadows), so what could cost the live requests
is the bookkeeper's extra work and, where the candidate shares the machine with the live engine (as the two
simulators do here, on the same cores), the candidate's load. Both proxies are ``specproxy proxy --workers 1``,
recording; rounds alternate which goes first (ABBA); per concurrency the figures are medians over every live
request of the side, from the client.

    python -m specproxy.bench.shadow                      # base simulator live, MTP k=3 candidate, share 0.25
    python -m specproxy.bench.shadow --share 1 --concurrency 1,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.observer import Side, cell, proxy_child, summary, wave
from specproxy.bench.procs import StartError, python_child


async def _shadows_sent(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url + "/specproxy/status") as r:
        doc = await r.json()
    return sum(int(c.get("sent", 0)) for c in doc.get("shadow", {}).get("candidates", {}).values())


async def measure(
    live: str, candidate: str, *, share: float, levels: Sequence[int], requests: int, rounds: int, max_tokens: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="specproxy-shadowcost-") as tmp:
        shadow_args = ("--shadow", f"cand={candidate}", "--shadow-share", str(share), "--shadow-max-inflight", "64")
        async with (
            proxy_child(live, Path(tmp) / "on.jsonl", *shadow_args) as on,
            proxy_child(live, Path(tmp) / "off.jsonl") as off,
        ):
            for url in (on.url, off.url):  # warm both paths and the engines
                await wave(url, "sim-model", 1, 2, max_tokens, 0, Side(), True)
            for c in levels:
                sides = {"on": Side(), "off": Side()}
                sent = 0
                for r in range(rounds):
                    for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                        url = on.url if name == "on" else off.url
                        before = await _shadows_sent(on.url) if name == "on" else 0
                        await wave(url, "sim-model", c, requests, max_tokens, r * requests, sides[name], True)
                        if name == "on":
                            sent += await _shadows_sent(on.url) - before
                son, soff = summary(sides["on"]), summary(sides["off"])
                added = None
                if son["ttft_p50_ms"] is not None and soff["ttft_p50_ms"] is not None:
                    added = round(son["ttft_p50_ms"] - soff["ttft_p50_ms"], 2)
                rows.append({"concurrency": c, "shadowing_on": son, "shadowing_off": soff, "shadows_sent": sent,
                             "ttft_added_p50_ms": added})  # fmt: skip
    return rows


def render(rows: Sequence[dict[str, Any]], what: str) -> str:
    lines = [
        f"shadowing's cost to live requests: {what}; two proxies (--workers 1), one with --shadow, rounds "
        "interleaved (ABBA)",
        "",
        f"{'conc':>4}  {'shadowing':<9}  {'requests':>8}  {'shadows':>7}  {'TTFT p50':>9}  {'TTFT p90':>9}  "
        f"{'gap p50':>8}  {'gap p99':>8}",
    ]
    for row in rows:
        for name in ("on", "off"):
            s = row[f"shadowing_{name}"]
            fails = f" ({s['failed']} failed)" if s["failed"] else ""
            shadows = row["shadows_sent"] if name == "on" else "-"
            lines.append(
                f"{row['concurrency']:>4}  {name:<9}  {s['requests']:>8}  {shadows:>7}  {cell(s['ttft_p50_ms'])}  "
                f"{cell(s['ttft_p90_ms'])}  {cell(s['gap_p50_ms'], 8)}  {cell(s['gap_p99_ms'], 8)}{fails}"
            )
        added = row["ttft_added_p50_ms"]
        lines.append(f"      live TTFT p50 added by shadowing: {'-' if added is None else f'{added:+.2f} ms'}")
    lines.append("  times in ms, from the client: TTFT is send to first token-bearing read, gap between such reads")
    return "\n".join(lines)


async def _main(a: argparse.Namespace) -> int:
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
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
    p = argparse.ArgumentParser(prog="python -m specproxy.bench.shadow", description=__doc__.split("\n\n")[0])
    p.add_argument("--share", type=float, default=0.25, help="--shadow-share of the shadowing proxy")
    p.add_argument("--concurrency", default="1,16", help="levels, comma-separated")
    p.add_argument("--requests", type=int, default=24, help="requests per side per round")
    p.add_argument("--rounds", type=int, default=4, help="rounds; each runs both sides, alternating which first")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--speed", type=float, default=1.0, help="the simulators' time compression")
    p.add_argument("--format", choices=("table", "json"), default="table")
    a = p.parse_args(argv)
    try:
        levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    except ValueError:
        p.error(f"--concurrency must be integers separated by commas, got {a.concurrency!r}")
    if not levels or min(levels) < 1 or a.requests < 1 or a.rounds < 1 or a.max_tokens < 1:
        p.error("--concurrency levels, --requests, --rounds and --max-tokens must be at least 1")
    if not 0.0 < a.share <= 1.0:
        p.error(f"--share must be in (0, 1], got {a.share}")
    try:
        return asyncio.run(_main(a))
    except StartError as e:
        sys.stderr.write(f"shadow bench: a process did not start: {e}\n")
        return 1
    except (aiohttp.ClientError, OSError) as e:
        sys.stderr.write(f"shadow bench: {e}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
