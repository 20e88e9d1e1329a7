"""``specproxy bench --hostile``: what one hostile input does to every other stream.

For each input a fresh proxy starts (with the rules or metrics URL the input needs) in front of the stamping upstream;
one client process runs N streams through it and N direct at the same rate; once every stream has its first event
this process sends the hostile input. Per input: the largest inter-event gap of any relayed stream minus the largest
of any direct stream (what the input added), the proxy's peak RSS (its process tree), and the status the hostile
request got. A reference row with no hostile input shows the gap the relay adds by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.config import BenchConfig
from specproxy.bench.procs import Child, StartError, client_result, python_child, spawn_client, tree_rss_bytes
from specproxy.bench.roles import proxy_has_workers
from specproxy.bench.run import raise_nofile

GAP_LIMIT_MS = 50.0
RSS_LIMIT_MB = 400.0
# the README's own rules file (section "Workloads")
README_RULES = {
    "rules": [
        {"workload": "code_agent", "header": {"name": "X-Client", "value": "^ide-"}},
        {"workload": "ja_chat", "classify": "ja"},
        {"workload": "code_agent", "classify": "code"},
    ]
}
REGEX_RULES = {"rules": [{"workload": "evil", "message": "(a+)+$"}]}

Sender = Callable[[aiohttp.ClientSession, str], Awaitable[str]]


def body_60mb() -> bytes:
    """A chat request of ``30_000_000`` tiny array elements (two bytes each) beside the messages, under the default
    ``--max-body``."""
    head = b'{"model":"bench","max_tokens":4,"stream":false,"messages":[{"role":"user","content":"hi"}],"pad":['
    return head + b"0," * 30_000_000 + b"0]}"


async def _post(session: aiohttp.ClientSession, url: str, data: bytes, path: str = "/v1/chat/completions") -> str:
    async with session.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
        await r.read()
        return str(r.status)


def _chat(content: str) -> bytes:
    return json.dumps(
        {"model": "bench", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": content}]}
    ).encode()


async def _send_body(session: aiohttp.ClientSession, url: str) -> str:
    return await _post(session, url, body_60mb())


async def _send_newlines(session: aiohttp.ClientSession, url: str) -> str:
    return await _post(session, url, _chat("\n" * 20_000))


async def _send_aaa(session: aiohttp.ClientSession, url: str) -> str:
    return await _post(session, url, _chat("a" * 28 + "!"))


async def _send_interim_flood(session: aiohttp.ClientSession, url: str) -> str:
    return await _post(session, url, _chat("hi"), "/interim-flood") + " (1 MB of 100 Continue before the answer)"


async def _get_status(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/specproxy/status") as r:
        await r.read()
        return f"{r.status} (GET /specproxy/status while scraping)"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    proxy_args: tuple[str, ...]
    send: Sender | None


def cases(tmp: Path, upstream: str) -> list[Case]:
    (tmp / "readme-rules.json").write_text(json.dumps(README_RULES))
    (tmp / "regex-rules.json").write_text(json.dumps(REGEX_RULES))
    return [
        Case("none (reference)", (), None),
        Case("60 MB JSON body of tiny elements", (), _send_body),
        Case("20,000 newlines, README rules", ("--rules", str(tmp / "readme-rules.json")), _send_newlines),
        Case("rule (a+)+$, 29-char prompt", ("--rules", str(tmp / "regex-rules.json")), _send_aaa),
        Case("--metrics-url: 12 MB unrelated", ("--metrics-url", upstream + "/metrics-big"), _get_status),
        Case("upstream: 1 MB of 100 Continue", (), _send_interim_flood),
    ]


async def _start(stack: contextlib.AsyncExitStack, args: list[str]) -> Child | StartError:
    try:
        return await stack.enter_async_context(python_child("-m", "specproxy", "proxy", *args))
    except StartError as e:
        return e


async def _case(case: Case, cfg: BenchConfig, upstream: str, px: Child | StartError) -> dict[str, Any]:
    row: dict[str, Any] = {
        "input": case.name,
        "gap_added_ms": None,
        "rss_peak_mb": None,
        "status": "-",
        "hostile_s": None,
        "events": 0,
        "expected": 0,
        "statuses": {},
        "errors": {},
    }
    if isinstance(px, StartError):
        row["status"] = f"refused at start: {px}"[:200]
        row.update(gap_pass=None, rss_pass=None, answered=None, refused=True)
        return row
    peak = tree_rss_bytes(px.pid)
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(px.pid))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    sampler = asyncio.create_task(sample())
    n = cfg.hostile_streams
    spec = json.dumps(
        {
            "targets": [
                {"name": "proxy", "url": px.url, "streams": n},
                {"name": "direct", "url": upstream, "streams": n},
            ],
            "tokens": cfg.tokens,
            "steps_per_s": cfg.steps_per_s,
            "stagger_s": max(1 / cfg.steps_per_s, 2 * n * 0.001),
            "timeout_s": 300,
        }
    )
    flowing = asyncio.Event()
    client = asyncio.create_task(spawn_client(spec, flowing))
    await asyncio.wait([asyncio.create_task(flowing.wait()), client], return_when=asyncio.FIRST_COMPLETED)
    if case.send is not None:
        t0 = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            try:
                row["status"] = await case.send(s, px.url)
            except (TimeoutError, aiohttp.ClientError) as e:
                row["status"] = f"no answer ({type(e).__name__})"
        row["hostile_s"] = time.monotonic() - t0
    out = client_result(await client, case.name)
    done.set()
    await sampler
    prox, direct = out["targets"]
    row["gap_added_ms"] = (max(prox["max_gap_us"]) - max(direct["max_gap_us"])) / 1000
    row["rss_peak_mb"] = peak / 2**20
    row.update(
        events=prox["events"],
        expected=prox["expected"],
        statuses=prox["statuses"],
        errors=prox["errors"],
        direct_max_gap_ms=max(direct["max_gap_us"]) / 1000,
        proxy_max_gap_ms=max(prox["max_gap_us"]) / 1000,
    )
    row["gap_pass"] = row["gap_added_ms"] <= GAP_LIMIT_MS
    row["rss_pass"] = row["rss_peak_mb"] < RSS_LIMIT_MB
    row["answered"] = case.send is None or row["status"][:1].isdigit()
    row["refused"] = False
    return row


async def run_hostile(cfg: BenchConfig) -> dict[str, Any]:
    """Every input's proxy starts at once (they idle until their turn); the inputs then run one after another."""
    raise_nofile()
    notes: list[str] = []
    extra: list[str] = []
    if cfg.workers is not None:
        if await proxy_has_workers():
            extra = ["--workers", str(cfg.workers)]
        else:
            notes.append(f"specproxy proxy has no --workers option in this build: --workers {cfg.workers} not applied")
    rows = []
    with tempfile.TemporaryDirectory(prefix="specproxy-bench-hostile-") as d:
        tmp = Path(d)
        async with (
            python_child("-m", "specproxy.bench.upstream", "--steps-per-s", str(cfg.steps_per_s), url_on="stdout")
            as up,
            contextlib.AsyncExitStack() as stack,
        ):  # fmt: skip
            todo = cases(tmp, up.url)
            base = ["--upstream", up.url, "--listen", "127.0.0.1:0", *extra]
            proxies = await asyncio.gather(
                *(_start(stack, [*base, "--record", str(tmp / f"hostile-{i}.jsonl"), *c.proxy_args])
                  for i, c in enumerate(todo))
            )  # fmt: skip
            for case, px in zip(todo, proxies, strict=True):
                rows.append(await _case(case, cfg, up.url, px))
    return {
        "streams": cfg.hostile_streams,
        "tokens": cfg.tokens,
        "steps_per_s": cfg.steps_per_s,
        "sharing": f"{os.cpu_count()} cores shared by the upstream (1 process), the client (1 process) and the proxy"
        " (its whole process tree); the other inputs' proxies idle meanwhile; the hostile input is sent from the"
        " bench's own process; nothing is pinned",
        "notes": notes,
        "limits": {"gap_added_ms": GAP_LIMIT_MS, "rss_peak_mb": RSS_LIMIT_MB},
        "inputs": rows,
    }
