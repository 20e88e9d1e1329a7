"""Shared helpers for the simulator tests: start a simulator on port 0, split SSE bodies, sum /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from specproxy.sim import SimConfig, SimHandle, start_sim

DATA = Path(__file__).parent / "data"
CODE_PROMPT = (DATA / "prompt-code.txt").read_text()
CHAT_PROMPT = (DATA / "prompt-chat.txt").read_text()
JA_PROMPT = "こんにちは。週末におすすめの過ごし方を教えてください。"

FAST = SimConfig(port=0, speed=100.0)


@asynccontextmanager
async def running_sim(cfg: SimConfig = FAST, **overrides: Any) -> AsyncIterator[SimHandle]:
    handle = await start_sim(replace(cfg, port=0, **overrides))
    try:
        yield handle
    finally:
        await handle.close()


@asynccontextmanager
async def client(limit: int = 100) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit)) as session:
        yield session


@dataclass(frozen=True, slots=True)
class Sse:
    """One SSE body split into its `data:` payloads and its comment lines."""

    data: list[str]
    comments: list[str]
    raw: bytes = b""
    content_type: str = ""

    @property
    def json(self) -> list[dict[str, Any]]:
        return [orjson.loads(d) for d in self.data if d != "[DONE]"]


def split_sse(body: bytes) -> Sse:
    """A deliberately small SSE split (events end with a blank line; no multi-line data in vLLM's output)."""
    text = body.decode()
    data: list[str] = []
    comments: list[str] = []
    for block in text.split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                data.append(line[len("data: ") :])
            elif line.startswith(":"):
                comments.append(line[1:].strip())
    return Sse(data, comments, body)


def chat_body(prompt: str = CODE_PROMPT, *, stream: bool = True, usage: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64,
        "temperature": 0,
        "stream": stream,
    }
    if stream and usage:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body.update(extra)
    return body


async def post_sse(session: aiohttp.ClientSession, url: str, body: dict[str, Any], **kw: Any) -> tuple[int, Sse]:
    async with session.post(url, json=body, **kw) as resp:
        sse = split_sse(await resp.read())
        return resp.status, replace(sse, content_type=resp.headers.get("Content-Type", ""))


async def truth(session: aiohttp.ClientSession, sim: SimHandle, rid: str) -> dict[str, Any]:
    async with session.get(f"{sim.url}/sim/requests/{rid}") as resp:
        assert resp.status == 200, await resp.text()
        data: dict[str, Any] = await resp.json()
        return data


async def scrape(
    session: aiohttp.ClientSession, sim: SimHandle
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """All samples of /metrics, keyed by (sample name, sorted labels)."""
    async with session.get(f"{sim.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def summed(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **match: str) -> float:
    """Sum one sample name over every label set (e.g. over `engine`) that matches `match`."""
    total = 0.0
    for (sname, labels), value in samples.items():
        lab = dict(labels)
        if sname == name and all(lab.get(k) == v for k, v in match.items()):
            total += value
    return total


def key_shape(obj: Any) -> Any:
    """The structure of a JSON value: dict keys in order (recursively), list shapes, leaf types ignored."""
    if isinstance(obj, dict):
        return [(k, key_shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [key_shape(v) for v in obj[:1]]
    return None


@asynccontextmanager
async def sim_process(*args: str) -> AsyncIterator[str]:
    """``specproxy sim`` in its own process (as in production, the engine does not share the recorder's event
    loop); yields its base URL."""
    import asyncio
    import re
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specproxy",
        "sim",
        "--listen",
        "127.0.0.1:0",
        *args,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 20)
        m = re.search(rb"(http://[\d.]+:\d+)", line)
        assert m, line
        yield m.group(1).decode()
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
