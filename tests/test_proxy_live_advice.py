"""``specproxy proxy`` says what to run now: the live advice in its status and metrics, in front of the simulator."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.proxyutil import proxy_process
from tests.simutil import CHAT_PROMPT, CODE_PROMPT, chat_body, running_sim


async def test_the_proxy_says_what_to_run_now(tmp_path: Path) -> None:
    async with (
        running_sim(speed=50.0, seed=3) as sim,
        proxy_process(sim.url, tmp_path / "r.jsonl", "--advise-every", "0.2") as (url, _),
        aiohttp.ClientSession() as s,
    ):
        sem = asyncio.Semaphore(4)

        async def one(i: int) -> None:
            workload, prompt = ("code_agent", CODE_PROMPT) if i % 2 else ("ja_chat", CHAT_PROMPT)
            async with sem, s.post(url + "/v1/chat/completions", json=chat_body(prompt + f" ({i})", max_tokens=64),
                                   headers={"X-Specproxy-Workload": workload}) as r:  # fmt: skip
                assert r.status == 200
                await r.read()

        await asyncio.gather(*(one(i) for i in range(48)))
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            async with s.get(url + "/specproxy/status") as r:
                st: dict[str, Any] = json.loads(await r.read())
            adv = st["advice"]["workloads"]
            if {"code_agent", "ja_chat"} <= set(adv) and all(a["requests"] == 24 for a in adv.values()):
                break
            assert asyncio.get_running_loop().time() < deadline, st["advice"]
            await asyncio.sleep(0.1)
        async with s.get(url + "/specproxy/metrics") as r:
            metrics = await r.text()
    # what `specproxy advise` says over the same records, given the same range of k (the one the engine runs)
    done = subprocess.run(  # noqa: ASYNC221 - the command as a user runs it, once, after the proxy stopped
        [sys.executable, "-m", "specproxy", "advise", str(tmp_path / "r.jsonl"), "--max-k", "3", "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    offline = {w["workload"]: w for w in json.loads(done.stdout)["workloads"]}
    for w in ("code_agent", "ja_chat"):
        assert adv[w]["recommended_k"] == offline[w]["recommended_k"], (w, adv[w], offline[w])
    # the simulator accepts code far more than Japanese chat: MTP k=3 pays for code, less (or nothing) for chat
    assert adv["code_agent"]["recommended_k"] is not None and adv["code_agent"]["running_k"] == 3
    assert adv["code_agent"]["speedups"]["3"] > adv["ja_chat"]["speedups"]["3"]
    assert adv["code_agent"]["recommended_k"] >= adv["ja_chat"]["recommended_k"]
    assert 'specproxy_recommended_k{workload="code_agent"}' in metrics
