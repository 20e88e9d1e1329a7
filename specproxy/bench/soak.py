"""``specproxy bench --soak SECONDS``: streams through the proxy for minutes, with cancels and resets; is memory flat?

One upstream (the bench's, at ``--steps-per-s``), one ``specproxy proxy`` as users run it (default ``--workers``),
and one client process (``python -m specproxy.bench.soak SPEC``) that keeps ``streams`` streams in flight until the
time is up: each asks for a random length; a share is cancelled by the client mid-stream (the connection closed),
and a share is reset by the upstream mid-stream (TCP RST). The bench samples the proxy's RSS (its whole process tree)
every second, per process (``main``, each relay, the bookkeeper), with the requests the client had finished by then.

It reports the RSS over time, per process; whether the tree is flat (the median of the last fifth of the soak against
the median of its second fifth, after warm-up: at most :data:`FLAT_SHARE` or :data:`FLAT_MB` more, whichever is larger);
per process how fast it grows per request after warm-up (:mod:`specproxy.bench.growth`: MB per thousand requests, a
least-squares slope over the last four fifths and the difference of the fifths, against ``TARGET_MB_PER_1000``); and
whether every request the client started has exactly one record, with the outcome the client saw (``client_cancelled``,
``upstream_reset``). Streams running when the time is up are finished, so the soak ends up to one stream's length later.
Memory per stream is the levels' figure (``specproxy bench``), where the streams are many enough to amortise the proxy's
fixed costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.growth import TARGET_MB_PER_1000, growth
from specproxy.bench.procs import client_result, python_child, spawn_client, tree_rss_by_process, write_result
from specproxy.core.headers import REQUEST_ID_HEADER
from specproxy.core.record import read_records
from specproxy.core.stats import median
from specproxy.proxy.names import BOOKKEEPER, RELAY_PREFIX

FLAT_SHARE = 0.10
FLAT_MB = 16.0
DONE_PREFIX = "done "
PROGRESS_EVERY_S = 0.25


@dataclass(frozen=True, slots=True)
class SoakConfig:
    seconds: float = 600.0
    streams: int = 64
    steps_per_s: float = 25.0
    min_tokens: int = 20
    max_tokens: int = 200
    cancel_share: float = 0.1
    reset_share: float = 0.1
    seed: int = 0
    rate: float = 0.0  # requests started per second, paced over the streams (0: each stream starts its next at once)


# --- the client (its own process) ------------------------------------------------------------------------------------


async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(spec["seed"])
    deadline = time.monotonic() + spec["seconds"]
    seen: Counter[str] = Counter()
    ids: list[str] = []

    async def one(session: aiohttp.ClientSession) -> None:
        tokens = rng.randint(spec["min_tokens"], spec["max_tokens"])
        roll = rng.random()
        body: dict[str, Any] = {"model": "bench", "stream": True, "max_tokens": tokens, "messages": []}
        cancel_after = None
        if roll < spec["cancel_share"]:
            cancel_after = rng.randint(1, tokens - 1)
        elif roll < spec["cancel_share"] + spec["reset_share"]:
            body["bench_reset_after"] = rng.randint(1, tokens - 1)
        events = 0
        try:
            async with session.post(spec["url"] + "/v1/chat/completions", json=body) as r:
                rid = r.headers.get(REQUEST_ID_HEADER)
                if rid:
                    ids.append(rid)
                async for data in r.content.iter_any():
                    events += data.count(b"\n\n")
                    if cancel_after is not None and events >= cancel_after:
                        r.close()  # the client leaves mid-stream: the connection is closed
                        # unless the read that got it there held the stream's end: a client that closes after the
                        # end was relayed got the whole stream, and its record is ok (docs/records.md)
                        seen["ok" if b"data: [DONE]" in data else "cancelled"] += 1
                        return
                seen["ok" if r.status == 200 else f"status {r.status}"] += 1
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            seen["reset" if "bench_reset_after" in body else "broken"] += 1

    started = [0]
    first = time.monotonic()

    async def lane() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as session:
            while time.monotonic() < deadline:
                if spec["rate"] > 0:  # the n-th request starts at n / rate, or as soon as a stream is free after it
                    at = first + started[0] / spec["rate"]
                    started[0] += 1
                    if (wait := at - time.monotonic()) > 0:
                        await asyncio.sleep(wait)
                    if time.monotonic() >= deadline:
                        return
                await one(session)

    async def progress() -> None:  # the requests finished so far, for the bench's samples: "done N" on stderr
        while True:
            sys.stderr.write(f"{DONE_PREFIX}{seen.total()}\n")
            sys.stderr.flush()
            await asyncio.sleep(PROGRESS_EVERY_S)

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*(lane() for _ in range(spec["streams"])))
    reporter.cancel()
    return {
        "outcomes": dict(seen),
        "requests": sum(seen.values()),
        "request_ids": ids,
        "seconds": time.monotonic() - first,
    }


# --- the run -----------------------------------------------------------------------------------------------------


async def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    samples: list[tuple[float, int, dict[str, float]]] = []  # (seconds since start, requests finished, MB by process)
    finished = [0]

    def on_line(line: bytes) -> bool:
        text = line.decode(errors="replace").strip()
        if not text.startswith(DONE_PREFIX):
            return False
        finished[0] = int(text[len(DONE_PREFIX) :])
        return True

    with tempfile.TemporaryDirectory(prefix="specproxy-soak-") as d:
        record = Path(d) / "records.jsonl"
        async with (
            python_child(
                "-m", "specproxy.bench.upstream", "--steps-per-s", str(cfg.steps_per_s), url_on="stdout"
            ) as up,
            python_child(
                "-m", "specproxy", "proxy", "--upstream", up.url, "--listen", "127.0.0.1:0", "--record", str(record)
            ) as px,
        ):
            base = {name: b / 2**20 for name, b in tree_rss_by_process(px.pid).items()}
            spec = {**asdict(cfg), "url": px.url}
            done = asyncio.Event()
            start = time.monotonic()

            async def sample() -> None:
                while not done.is_set():
                    by = {name: b / 2**20 for name, b in tree_rss_by_process(px.pid).items()}
                    samples.append((time.monotonic() - start, finished[0], by))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(done.wait(), 1.0)

            sampler = asyncio.create_task(sample())
            out = client_result(
                await spawn_client(json.dumps(spec), module="specproxy.bench.soak", on_line=on_line),
                "specproxy proxy",
            )
            done.set()
            await sampler
            # the proxy has stopped (SIGTERM): every record is written
        records = list(read_records(record)) if record.exists() else []
    by_outcome = Counter(str(r["outcome"]) for r in records)
    recorded_ids = Counter(str(r["request_id"]) for r in records)
    tree = [(t, sum(by.values())) for t, _, by in samples]
    n = len(tree)
    early = [mb for _, mb in tree[n // 5 : 2 * n // 5]]
    late = [mb for _, mb in tree[4 * n // 5 :]]
    early_mb, late_mb = median(early) or 0.0, median(late) or 0.0
    growth_mb = late_mb - early_mb
    flat = bool(early) and growth_mb <= max(FLAT_MB, FLAT_SHARE * early_mb) if n >= 5 else None
    names = sorted({name for _, _, by in samples for name in by}, key=_process_order)
    processes = {}
    for name in names:
        mine = [(t, r, by[name]) for t, r, by in samples if name in by]
        processes[name] = {
            "base_mb": base.get(name),
            "end_mb": mine[-1][2] if mine else None,
            "samples": mine,
            **growth([(t, r, mb) for t, r, mb in mine]).as_dict(),
        }
    tree_growth = growth([(t, r, sum(by.values())) for t, r, by in samples]).as_dict()
    client = out["outcomes"]
    # a client that closes once the proxy has relayed the whole stream (its last events not yet read) got it all: that
    # record is ok (docs/records.md), a race that short streams at a high rate meet often; every other outcome matches
    late = client.get("cancelled", 0) - by_outcome.get("client_cancelled", 0)
    matched = (
        late >= 0
        and by_outcome.get("ok", 0) == client.get("ok", 0) + late
        and by_outcome.get("upstream_reset", 0) == client.get("reset", 0)
    )
    return {
        "config": asdict(cfg),
        "rss_base_mb": sum(base.values()),
        "rss_samples": tree,
        "rss_early_mb": early_mb,
        "rss_late_mb": late_mb,
        "rss_growth_mb": growth_mb,
        "rss_max_mb": max((mb for _, mb in tree), default=0.0),
        "flat": flat,
        "requests_samples": [(t, r) for t, r, _ in samples],
        "target_mb_per_1000": TARGET_MB_PER_1000,
        "processes": processes,
        "tree": tree_growth,
        "every_process_within_target": all(p["passed"] for p in processes.values()) if processes else None,
        "client_outcomes": client,
        "requests": out["requests"],
        "seconds": out["seconds"],
        "rate": out["requests"] / out["seconds"] if out["seconds"] > 0 else None,
        "records": len(records),
        "record_outcomes": dict(by_outcome),
        "every_request_one_record": sorted(recorded_ids) == sorted(out["request_ids"])
        and all(v == 1 for v in recorded_ids.values()),
        "outcomes_match": matched,
        "late_cancels": max(0, late),
    }


def _process_order(name: str) -> tuple[int, str]:
    return (0 if name == "main" else 1 if name.startswith(RELAY_PREFIX) else 2 if name == BOOKKEEPER else 3, name)


def _per_1000(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.3f}"


def render_soak(r: dict[str, Any]) -> str:
    c = r["config"]
    out = [
        f"specproxy bench --soak: {c['seconds']:g} s, {c['streams']} streams in flight through specproxy proxy"
        f" (default --workers) at {c['steps_per_s']:g} steps/s, {c['min_tokens']}-{c['max_tokens']} events each;"
        f" {c['cancel_share']:.0%} cancelled by the client, {c['reset_share']:.0%} reset by the upstream"
        + (f"; {c['rate']:g} requests/s started at most" if c.get("rate") else ""),
        "",
        "RSS per process, MB:",
    ]
    procs: dict[str, dict[str, Any]] = r["processes"]
    names = list(procs)
    width = max([len(n) for n in names] + [8])
    out.append(f"  {'s':>7}  {'requests':>9}  " + "  ".join(f"{n:>{width}}" for n in names) + f"  {'all':>8}")
    by_time: dict[float, dict[str, float]] = {}
    for name, p in procs.items():
        for t, _, mb in p["samples"]:
            by_time.setdefault(t, {})[name] = mb
    rows = r["requests_samples"]
    step = max(1, len(rows) // 10)
    picked = list(range(0, len(rows), step))
    if rows and picked[-1] != len(rows) - 1:
        picked.append(len(rows) - 1)
    for i in picked:
        t, done = rows[i]
        mbs = by_time.get(t, {})
        cells = "  ".join(f"{mbs[n]:>{width}.1f}" if n in mbs else f"{'-':>{width}}" for n in names)
        out.append(f"  {t:7.0f}  {done:9d}  {cells}  {sum(mbs.values()):8.1f}")
    target = r["target_mb_per_1000"]
    out += [
        "",
        f"growth after warm-up (the first fifth), MB per 1,000 requests (target: slope at most {target:g}):",
        f"  {'':<{width}}  {'before':>7}  {'2nd 5th':>7}  {'last 5th':>8}  {'growth':>7}  {'between':>8}  {'fifths':>7}"
        f"  {'slope':>7}  {'2nd half':>8}",
    ]
    for name, g in [*procs.items(), ("all", r["tree"])]:
        verdict = "" if name == "all" else "  n/a" if g["passed"] is None else "  pass" if g["passed"] else "  FAIL"
        before = g.get("base_mb", g["first_mb"]) if name != "all" else r["rss_base_mb"]
        out.append(
            f"  {name:<{width}}  {before or 0.0:7.1f}  {g['early_mb']:7.1f}  {g['late_mb']:8.1f}"
            f"  {g['growth_mb']:+7.1f}  {g['requests_between']:8d}  {_per_1000(g['fifths_mb_per_1000']):>7}"
            f"  {_per_1000(g['slope_mb_per_1000']):>7}  {_per_1000(g['half_slope_mb_per_1000']):>8}"
            f"{verdict}"
        )
    out += [
        "",
        "per process: RSS before the load, at its peak and at the end (MB); slope over the last half (MB per 1,000"
        " requests):",
    ]
    for name, g in procs.items():
        out.append(
            f"  {name:<{width}}  start {g['base_mb'] or 0.0:7.1f}  peak {g['max_mb']:7.1f}"
            f"  end {g['end_mb'] or 0.0:7.1f}"
            f"  2nd half {_per_1000(g['half_slope_mb_per_1000'])}"
        )
    target_rate = f" (target {c['rate']:g})" if c.get("rate") else ""
    out.append(
        f"  {'all':<{width}}  start {r['rss_base_mb']:7.1f}  peak {r['rss_max_mb']:7.1f}"
        f"  end {r['rss_samples'][-1][1] if r['rss_samples'] else 0.0:7.1f}"
        f"  2nd half {_per_1000(r['tree']['half_slope_mb_per_1000'])}"
    )
    verdict = "n/a (too short)" if r["flat"] is None else "pass" if r["flat"] else "FAIL"
    out += [
        f"achieved: {r['requests']} requests in {r['seconds']:.0f} s, {r['rate'] or 0.0:.1f} requests/s{target_rate}",
        "",
        f"whole tree: before {r['rss_base_mb']:.1f} MB; second fifth {r['rss_early_mb']:.1f} MB; last fifth"
        f" {r['rss_late_mb']:.1f} MB; growth {r['rss_growth_mb']:+.1f} MB (flat: at most {FLAT_SHARE:.0%} or"
        f" {FLAT_MB:g} MB): {verdict}",
        f"requests {r['requests']} (client saw {json.dumps(r['client_outcomes'], sort_keys=True)}); records"
        f" {r['records']} ({json.dumps(r['record_outcomes'], sort_keys=True)})",
        f"every request exactly one record: {'pass' if r['every_request_one_record'] else 'FAIL'}; outcomes as the"
        f" client saw them: {'pass' if r['outcomes_match'] else 'FAIL'}"
        + (f" ({r['late_cancels']} cancels after the whole stream was relayed: ok)" if r.get("late_cancels") else ""),
    ]
    return "\n".join(out)


def main() -> None:
    spec = json.loads(sys.argv[1])
    import uvloop

    result = uvloop.run(_client(spec))
    write_result(json.dumps(result).encode())


if __name__ == "__main__":
    main()
