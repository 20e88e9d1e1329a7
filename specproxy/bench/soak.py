"""``specproxy bench --soak SECONDS``: streams through the proxy for minutes, with cancels and resets; is memory flat?

One upstream (the bench's, at ``--steps-per-s``), one ``specproxy proxy`` as users run it (default ``--workers``),
and one client process (``python -m specproxy.bench.soak SPEC``) that keeps ``streams`` streams in flight until the
time is up: each asks for a random length; a share is cancelled by the client mid-stream (the connection closed),
and a share is reset by the upstream mid-stream (TCP RST). The bench samples the proxy's RSS (its whole process tree)
every second.

It reports the RSS over time; whether it is flat (the median of the last fifth of the soak against the median of its
second fifth, after warm-up: at most 10 % or 16 MB more, whichever is larger); and whether every request the client
started has exactly one record, with the outcome the client saw (``client_cancelled``, ``upstream_reset``). Streams
running when the time is up are finished, so the soak ends up to one stream's length later. Memory per stream is
the levels' figure (``specproxy bench``), where the streams are many enough to amortise the proxy's fixed costs.
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

from specproxy.bench.procs import client_result, python_child, spawn_client, tree_rss_bytes, write_result
from specproxy.core.headers import REQUEST_ID_HEADER
from specproxy.core.record import read_records
from specproxy.core.stats import median

FLAT_SHARE = 0.10
FLAT_MB = 16.0


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
                        seen["cancelled"] += 1
                        return
                seen["ok" if r.status == 200 else f"status {r.status}"] += 1
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            seen["reset" if "bench_reset_after" in body else "broken"] += 1

    async def lane() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as session:
            while time.monotonic() < deadline:
                await one(session)

    await asyncio.gather(*(lane() for _ in range(spec["streams"])))
    return {"outcomes": dict(seen), "requests": sum(seen.values()), "request_ids": ids}


# --- the run -----------------------------------------------------------------------------------------------------


async def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    samples: list[tuple[float, float]] = []  # (seconds since start, RSS MB)
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
            base_mb = tree_rss_bytes(px.pid) / 2**20
            spec = {**asdict(cfg), "url": px.url}
            done = asyncio.Event()
            start = time.monotonic()

            async def sample() -> None:
                while not done.is_set():
                    samples.append((time.monotonic() - start, tree_rss_bytes(px.pid) / 2**20))
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(done.wait(), 1.0)

            sampler = asyncio.create_task(sample())
            out = client_result(await spawn_client(json.dumps(spec), module="specproxy.bench.soak"), "specproxy proxy")
            done.set()
            await sampler
            # the proxy has stopped (SIGTERM): every record is written
        records = list(read_records(record)) if record.exists() else []
    by_outcome = Counter(str(r["outcome"]) for r in records)
    recorded_ids = Counter(str(r["request_id"]) for r in records)
    n = len(samples)
    early = [mb for _, mb in samples[n // 5 : 2 * n // 5]]
    late = [mb for _, mb in samples[4 * n // 5 :]]
    early_mb, late_mb = median(early) or 0.0, median(late) or 0.0
    growth = late_mb - early_mb
    flat = bool(early) and growth <= max(FLAT_MB, FLAT_SHARE * early_mb) if n >= 5 else None
    client = out["outcomes"]
    expected = {
        "ok": client.get("ok", 0),
        "client_cancelled": client.get("cancelled", 0),
        "upstream_reset": client.get("reset", 0),
    }
    return {
        "config": asdict(cfg),
        "rss_base_mb": base_mb,
        "rss_samples": samples,
        "rss_early_mb": early_mb,
        "rss_late_mb": late_mb,
        "rss_growth_mb": growth,
        "rss_max_mb": max((mb for _, mb in samples), default=0.0),
        "flat": flat,
        "client_outcomes": client,
        "requests": out["requests"],
        "records": len(records),
        "record_outcomes": dict(by_outcome),
        "every_request_one_record": sorted(recorded_ids) == sorted(out["request_ids"])
        and all(v == 1 for v in recorded_ids.values()),
        "outcomes_match": all(by_outcome.get(k, 0) == v for k, v in expected.items()),
    }


def render_soak(r: dict[str, Any]) -> str:
    c = r["config"]
    out = [
        f"specproxy bench --soak: {c['seconds']:g} s, {c['streams']} streams in flight through specproxy proxy"
        f" (default --workers) at {c['steps_per_s']:g} steps/s, {c['min_tokens']}-{c['max_tokens']} events each;"
        f" {c['cancel_share']:.0%} cancelled by the client, {c['reset_share']:.0%} reset by the upstream",
        "",
        "proxy RSS (its whole process tree), MB:",
    ]
    samples = r["rss_samples"]
    step = max(1, len(samples) // 10)
    out += [f"  {t:7.0f} s  {mb:8.1f}" for t, mb in samples[::step]]
    if samples and (len(samples) - 1) % step:
        out.append(f"  {samples[-1][0]:7.0f} s  {samples[-1][1]:8.1f}")
    verdict = "n/a (too short)" if r["flat"] is None else "pass" if r["flat"] else "FAIL"
    out += [
        "",
        f"before {r['rss_base_mb']:.1f} MB; second fifth {r['rss_early_mb']:.1f} MB; last fifth {r['rss_late_mb']:.1f}"
        f" MB; growth {r['rss_growth_mb']:+.1f} MB (flat: at most {FLAT_SHARE:.0%} or {FLAT_MB:g} MB): {verdict}",
        f"requests {r['requests']} (client saw {json.dumps(r['client_outcomes'], sort_keys=True)}); records"
        f" {r['records']} ({json.dumps(r['record_outcomes'], sort_keys=True)})",
        f"every request exactly one record: {'pass' if r['every_request_one_record'] else 'FAIL'}; outcomes as the"
        f" client saw them: {'pass' if r['outcomes_match'] else 'FAIL'}",
    ]
    return "\n".join(out)


def main() -> None:
    spec = json.loads(sys.argv[1])
    import uvloop

    result = uvloop.run(_client(spec))
    write_result(json.dumps(result).encode())


if __name__ == "__main__":
    main()
