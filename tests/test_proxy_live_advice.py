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


async def test_the_proxy_checks_the_engines_schedule_per_band_of_requests_in_flight(tmp_path: Path) -> None:
    """Told the engine runs k=3 up to 2 requests in flight and none from 3 (``--speculative-config``, as given to
    vLLM), the proxy finds the band where the simulator (which ignores any schedule) drafts all the same."""
    schedule = (
        '{"method": "mtp", "num_speculative_tokens": 3, '
        + '"num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 256, 0]]}'
    )
    async with (
        running_sim(speed=50.0, seed=5) as sim,
        proxy_process(sim.url, tmp_path / "r.jsonl", "--advise-every", "0.2", "--speculative-config", schedule) as (
            url,
            _,
        ),
        aiohttp.ClientSession() as s,
    ):

        async def one(i: int) -> None:
            async with s.post(url + "/v1/chat/completions", json=chat_body(CODE_PROMPT + f" ({i})", max_tokens=48),
                              headers={"X-Specproxy-Workload": "code_agent"}) as r:  # fmt: skip
                assert r.status == 200
                await r.read()

        for i in range(6):  # one at a time
            await one(i)
        for wave in range(3):  # eight at a time
            await asyncio.gather(*(one(100 + 8 * wave + j) for j in range(8)))
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            async with s.get(url + "/specproxy/status") as r:
                st: dict[str, Any] = json.loads(await r.read())
            bands = {b["band"]: b for b in st["advice"]["bands"]}
            # requests that decoded at the waves' edges may land in bands too small to speak
            # (and on a busy host a wave's last request may decode alone: band 1 then has more than the first 6)
            # (and the requests' figures come with the scrapes that cover them: a band is judged once it has some)
            # (and on a very busy host one of the first 6 may be seen to overlap its neighbour: band 2, too small)
            if (
                "1" in bands
                and bands["1"]["requests"] >= 5
                and bands["1"]["draft_k"] is not None
                and sum(b["requests"] for b in bands.values()) >= 20
            ):
                break
            assert asyncio.get_running_loop().time() < deadline, st["advice"]["bands"]
            await asyncio.sleep(0.1)
        async with s.get(url + "/specproxy/metrics") as r:
            metrics = await r.text()
    assert st["advice"]["schedule"] == "1-2: k=3, 3-256: k=0"
    assert bands["1"]["expected_k"] == 3 and bands["1"]["schedule_mismatch"] is False, bands["1"]
    assert bands["1"]["draft_k"] == 3.0 and bands["1"]["in_flight"] < 1.5, bands["1"]
    busy = [b for b in bands.values() if b["lo"] >= 3]
    assert busy and all(b["expected_k"] == 0 and b["schedule_mismatch"] for b in busy), bands
    # (on a busy host the simulator's throughput may also fall with the batch: said too, in its own line)
    assert any("the schedule has no effect" in why for why in busy[-1]["why"])
    assert f'specproxy_band_schedule_mismatch{{band="{busy[-1]["band"]}"}} 1.0' in metrics
    assert 'specproxy_band_schedule_mismatch{band="1"} 0.0' in metrics


def test_a_schedule_that_is_not_one_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specproxy", "proxy", "--upstream", "http://127.0.0.1:9", "--record",
         str(tmp_path / "r.jsonl"), "--speculative-config", "[[2, 4, 1]]"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--speculative-config: the first range must start at batch size 1" in done.stderr
