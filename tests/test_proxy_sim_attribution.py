"""Attribution checked against the simulator's ground truth: per request when alone, per workload when 32 requests
overlap (with usage: within 1 point; with neither usage nor per-request stats: within 3 points)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specproxy.core.record import read_records
from tests.proxyutil import RunningProxy, running_proxy
from tests.simutil import CODE_PROMPT, JA_PROMPT, chat_body, running_sim, sim_process, truth

JA_PROMPTS = [
    "こんにちは。週末におすすめの過ごし方を教えてください。",
    "最近ちょっと疲れてて、気分転換に何をしたらいいと思う？",
    "猫を飼い始めたんだけど、最初に用意するものって何？",
    "明日友だちとカフェに行くんだけど、話題に困ったらどうしよう。",
]
CODE_PROMPTS = [
    CODE_PROMPT,
    "Fix the bug in this function:\n```python\ndef mean(xs):\n    return sum(xs) / len(xs) + 1\n```",
    "Refactor this into smaller functions:\n```ts\n"
    "function run(a: number[]) { let s = 0; for (const x of a) { s += x; } return s; }\n```",
    "Implement `parse_duration(s: str) -> float` in Python that accepts '1h30m', '45s', '2m'.",
]


async def _send(s: aiohttp.ClientSession, url: str, body: dict[str, Any], workload: str) -> str:
    async with s.post(url + "/v1/chat/completions", json=body, headers={"X-Specproxy-Workload": workload}) as r:
        assert r.status == 200
        await r.read()
        return r.headers["X-Specproxy-Request-Id"]


async def truth_at(s: aiohttp.ClientSession, url: str, rid: str) -> dict[str, Any]:
    async with s.get(f"{url}/sim/requests/{rid}") as r:
        assert r.status == 200
        data: dict[str, Any] = await r.json()
        return data


async def _wait_ready(px: RunningProxy) -> None:
    for _ in range(300):
        if px.recorder.scraper.state.ok:
            return
        await asyncio.sleep(0.01)


async def test_one_at_a_time_with_merged_steps_the_counters_are_the_figure(tmp_path: Path) -> None:
    """Concurrency 1, the engine's writer lagging so that chunks merge steps (a GPU engine's HTTP task does so even
    for one stream): read as steps, the chunks count merged one-token steps as accepted drafts (here they would say
    more accepted tokens than draft tokens). The ledger finds the merged steps, the chunks' figure is not chosen, and
    the counters' figure is the truth per workload, to rounding (the chunks would read 1.2-1.6). Each
    request's closing scrape is awaited before the next is sent: a client that sends at once races it, and on a busy
    host the scrape can land after the next request's first steps, which then share its interval, by how late the
    host made it."""
    async with (
        running_sim(speed=20.0, spec_method="ngram", output_lag_ms=20) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        await _wait_ready(px)
        for w, prompts in (("code", CODE_PROMPTS), ("ja", JA_PROMPTS)):
            for prompt in prompts[:4]:
                await _send(s, px.url, chat_body(prompt, max_tokens=400), w)
                await px.flush()  # its closing scrape before the next request (see above)
        recs = px.records()
        assert len(recs) == 8
        sums: dict[str, list[float]] = {}
        for rec in recs:
            t = await truth(s, sim, rec["upstream_id"])
            assert rec["spec"]["source"] == "counters", rec["flags"]
            got = sums.setdefault(rec["workload"], [0.0, 0.0, 0.0, 0.0])
            got[0] += rec["spec"]["accepted"]
            got[1] += rec["spec"]["draft_tokens"]
            got[2] += t["counted_accepted"]
            got[3] += t["draft_tokens"]
        assert sum("steps_unmerged" in r["flags"] for r in recs) > 0
        for w, (acc, drafted, true_acc, true_drafted) in sums.items():
            assert abs(acc / drafted - true_acc / true_drafted) <= 0.02, (w, acc / drafted, true_acc / true_drafted)


@pytest.mark.parametrize("per_request", [None, "detailed"])
async def test_concurrency_one_every_source_equals_truth(tmp_path: Path, per_request: str | None) -> None:
    async with (
        running_sim(speed=20.0, per_request_spec_metrics=per_request) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        await _wait_ready(px)
        for i, prompt in enumerate([CODE_PROMPT, JA_PROMPT, CODE_PROMPTS[1], JA_PROMPTS[1]]):
            await _send(s, px.url, chat_body(prompt, max_tokens=400 if i % 2 else 48), "w")
        await px.flush()
        recs = px.records()
        assert len(recs) == 4
        for rec in recs:
            t = await truth(s, sim, rec["upstream_id"])
            est = rec["spec"]["estimates"]
            if not per_request:  # with the engine's own figures no closing scrape is made (recorder/scraper.py)
                # counters: exact when alone, including the unemitted tail of a max_tokens cut
                assert est["counters"]["exact"] is True, (
                    rec["flags"],
                    est["counters"],
                    t["counted_accepted"],
                    t["drafts"],
                )
                assert est["counters"]["accepted"] == t["counted_accepted"]
                assert est["counters"]["drafts"] == t["drafts"]
                assert est["counters"]["draft_tokens"] == t["draft_tokens"]
            # chunks: what reached the client
            assert est["chunks"]["accepted"] == t["accepted"]
            assert est["chunks"]["drafts"] == t["drafts"]
            if per_request:
                assert rec["spec"]["source"] == "server"
                assert est["server"]["accepted"] == t["counted_accepted"]
                assert est["server"]["drafts"] == t["drafts"] and est["server"]["draft_tokens"] == t["draft_tokens"]
                assert len(est["server"]["per_position"]) == rec["spec"]["k"]
                # the engine's own timing (its metrics object) and the proxy's clock agree, unless the proxy read
                # late: this simulator decodes 47 tokens in about 6 ms, and on a busy host a reader that found several
                # events in one read (seen in a busy CI run) timed the span a few ms off, which the flag says
                t_engine = rec["engine_timings"]
                assert t_engine["decode_tokens"] == rec["completion_tokens"] - 1, t_engine
                if "multi_event_reads" not in rec["flags"]:
                    assert "decode_rate_off_engine" not in rec["flags"], (rec["decode_tok_s"], t_engine)
            else:
                assert rec["spec"]["source"] == "chunks"
                assert est["server"] is None
            assert rec["truncated"] == (t["finish_reason"] == "length")
        assert any(r["truncated"] for r in recs) and not all(r["truncated"] for r in recs)
        # the engine's own figures came with every request: its counters are scraped seldom from then on
        assert px.recorder.scraper.per_request_figures == bool(per_request)


def _mixed_plan(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        if i % 2:
            plan.append(("ja_chat", rng.choice(JA_PROMPTS)))
        else:
            plan.append(("code_agent", rng.choice(CODE_PROMPTS)))
    rng.shuffle(plan)
    return plan


async def _mixed_run(
    tmp_path: Path, *, usage: bool, concurrency: int = 32, n: int = 240, seed: int = 7, sim_args: tuple[str, ...] = ()
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], list[dict[str, Any]], dict[str, Any]]:
    """A mixed ja_chat / code_agent stream at ``concurrency`` through the proxy, the simulator in its own process
    (as an engine is in production). Returns attributed and true (counter) figures per workload, the records, and
    each request's truth by its upstream id."""
    plan = _mixed_plan(n, seed)
    async with (
        sim_process("--seed", str(seed), *sim_args) as sim_url,
        aiohttp.ClientSession() as s,
    ):
        async with running_proxy(sim_url, tmp_path, rec_k=3) as px:
            await _wait_ready(px)
            queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
            for item in plan:
                queue.put_nowait(item)

            async def worker() -> None:
                while not queue.empty():
                    workload, prompt = queue.get_nowait()
                    body = chat_body(prompt, usage=usage, max_tokens=160)
                    await _send(s, px.url, body, workload)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        # the proxy has shut down: every record is written, held ones with the final calibration
        recs = list(read_records(tmp_path / "records.jsonl"))
        assert len(recs) == n
        measured: dict[str, dict[str, float]] = {}
        true: dict[str, dict[str, float]] = {}
        truths: dict[str, Any] = {}
        for rec in recs:
            t = truths[rec["upstream_id"]] = await truth_at(s, sim_url, rec["upstream_id"])
            tt = true.setdefault(rec["workload"], {"accepted": 0.0, "draft_tokens": 0.0})
            tt["accepted"] += t["counted_accepted"]
            tt["draft_tokens"] += t["draft_tokens"]
            if rec["spec"]["accepted"] is None:  # no figure chosen (chunks that merge steps, flagged)
                continue
            m = measured.setdefault(rec["workload"], {"accepted": 0.0, "draft_tokens": 0.0})
            m["accepted"] += rec["spec"]["accepted"]
            m["draft_tokens"] += rec["spec"]["draft_tokens"]
        return measured, true, recs, truths


def _rates(d: dict[str, dict[str, float]]) -> dict[str, float]:
    return {w: v["accepted"] / v["draft_tokens"] for w, v in d.items()}


@pytest.mark.slow
async def test_mixed_concurrency_32_with_usage_within_1_point(tmp_path: Path) -> None:
    measured, true, recs, _ = await _mixed_run(tmp_path, usage=True)
    m, t = _rates(measured), _rates(true)
    assert t["code_agent"] > t["ja_chat"] + 0.2  # the workloads really differ
    for w in t:
        assert abs(m[w] - t[w]) <= 0.01, (w, m[w], t[w])
    assert {r["spec"]["source"] for r in recs} == {"chunks"}


@pytest.mark.slow
async def test_mixed_concurrency_32_counters_only_within_3_points(tmp_path: Path) -> None:
    measured, true, recs, _ = await _mixed_run(tmp_path, usage=False)
    m, t = _rates(measured), _rates(true)
    assert all(r["token_source"] in ("tiktoken", "approx") for r in recs)
    assert {r["spec"]["source"] for r in recs} == {"counters"}
    for w in t:
        assert abs(m[w] - t[w]) <= 0.03, (w, m[w], t[w])


async def _accuracy(*args: str) -> dict[str, Any]:
    """``python -m benchmarks.attribution_accuracy ARGS --json``, in an interpreter of its own: its JSON."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.attribution_accuracy", *args, "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(Path(__file__).parent.parent),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-2000:]
    doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return doc


@pytest.mark.slow
async def test_mixed_ngram_drafting_on_some_steps_within_10_points() -> None:
    """ngram drafts only when its lookup matches, so steps are not drafts, and how often differs by request (the
    simulator draws each request's rate, as replies that repeat their context match more) and by workload (code
    accepts its first draft 4 times in 5 here, Japanese chat 2 in 5): overlapping requests' drafts are shared by what
    their chunks show (a multi-token step drafted), each request's own share of multi-token steps, and its
    workload's first-draft acceptance fitted across intervals. Per workload, seen within 0.8, 2.4, 4.7 and 3.1 points
    at seeds 1, 4, 7 and 11 (a per-workload drafting rate before: 3.4, 2.4, 8.8 and 0.4). Per request, the mean
    error in drafts 6-9 % of all drafts.

    The run has an interpreter of its own (``python -m benchmarks.attribution_accuracy``), as the proxy has in
    production: inside this one, after hundreds of tests, one CI run read code_agent 10.9 points off, where fresh
    interpreters read 5-8."""
    doc = await _accuracy("--concurrency", "32", "--requests", "160", "--seed", "7", "--spec-method", "ngram")
    m, t = doc["measured"], doc["truth"]
    assert doc["records"] == 160
    assert doc["sources"] == ["counters"]  # chunks cannot say which one-token steps drafted
    assert doc["partial_drafting_flagged"]
    for w in t:
        assert abs(m[w] - t[w]) <= 0.10, (w, m[w], t[w])
    assert doc["drafts_error_share"] <= 0.15


@pytest.mark.slow
async def test_steps_an_engine_merges_into_chunks_still_give_each_workload_its_acceptance() -> None:
    """The simulator's writers away after each chunk, as a saturated API server's are, so that several steps go out
    as one chunk (what a GPU engine does all the time). Every step drafts (MTP): once the ledger has put the merged
    steps back, each record has the counters' figure, and per workload it is within a few points of the truth (seen
    within 0.1-3.7 at seeds 1 and 2). Before, a record with a chunk longer than one step chose no figure at all."""
    doc = await _accuracy(
        "--concurrency", "16", "--requests", "100", "--seed", "1", "--spec-method", "mtp", "--speed", "40",
        "--output-lag-ms", "3",
    )  # fmt: skip
    m, t = doc["measured"], doc["truth"]
    assert doc["records"] == 100 and doc["steps_unmerged"] > 0
    assert doc["sources"] == ["counters"]
    for w in t:
        assert abs(m[w] - t[w]) <= 0.06, (w, m[w], t[w])


async def test_a_short_mixed_ngram_run_says_its_counters_shares_are_unsettled(tmp_path: Path) -> None:
    """Six overlapping requests of two workloads, ngram, neither usage per step nor the engine's per-request figures:
    which request the drafts hidden in one-token steps belong to rests on a drafting model that a handful of scrape
    intervals cannot pin down (a real vLLM read up to 10 points off per workload so). Each such record says so, and
    the report counts them."""
    from specproxy.analysis.report.accum import build_report

    plan = [("code_agent", CODE_PROMPTS[i % 4]) if i % 2 else ("ja_chat", JA_PROMPTS[i % 4]) for i in range(6)]
    async with running_sim(spec_method="ngram", speed=5.0, seed=3) as sim, aiohttp.ClientSession() as s:
        async with running_proxy(sim.url, tmp_path, rec_k=3) as px:
            await _wait_ready(px)
            for wave in (plan[:3], plan[3:]):
                await asyncio.gather(*(_send(s, px.url, chat_body(p, max_tokens=24), w) for w, p in wave))
            for _ in range(2000):  # the status says records wait for the drafting model, which is not stable
                st = px.recorder.status()
                if st["records"]["held"]:
                    break
                await asyncio.sleep(0.005)
            assert st["records"]["held"] > 0 and st["engine"]["models_stable"]["drafting"] is False
        # the proxy has shut down: held records took the models as they stood
        recs = list(read_records(tmp_path / "records.jsonl"))
    assert len(recs) == 6
    shared = [r for r in recs if r["spec"]["source"] == "counters" and not r["spec"]["estimates"]["counters"]["exact"]]
    assert shared, [(r["spec"]["source"], r["flags"]) for r in recs]
    for r in recs:
        assert ("counters_unsettled" in r["flags"]) == (r in shared), (r["spec"]["source"], r["flags"])
    assert sum(g.acceptance.unsettled for g in build_report(recs, ("workload",)).groups) == len(shared)


async def test_where_every_step_drafts_the_drafting_model_is_not_fitted(tmp_path: Path) -> None:
    """MTP drafts on every step: no record's share rests on the drafting model, so it is never fitted (refitting it
    at every scrape was a tenth of the bookkeeper's CPU at 256 streams) and the status says it is not in use."""
    plan = [("code_agent", CODE_PROMPTS[i % 4]) if i % 2 else ("ja_chat", JA_PROMPTS[i % 4]) for i in range(6)]
    async with (
        running_sim(spec_method="mtp", speed=5.0, seed=3) as sim,
        aiohttp.ClientSession() as s,
        running_proxy(sim.url, tmp_path, rec_k=3) as px,
    ):
        await _wait_ready(px)
        for wave in (plan[:3], plan[3:]):
            await asyncio.gather(*(_send(s, px.url, chat_body(p, max_tokens=24), w) for w, p in wave))
        ledger = px.recorder.ledger
        for _ in range(2000):  # the drafts of the steps streamed are settled
            if ledger.settled_steps >= 40 and ledger.total.drafts > 0:
                break
            await asyncio.sleep(0.005)
        assert ledger.settled_steps >= 40 and not ledger.partial_drafting
        assert px.recorder.status()["engine"]["models_stable"]["drafting"] is None
        assert ledger.drafting.intervals > 0 and not ledger.drafting.weights().first_accept  # rows, never a fit
    recs = list(read_records(tmp_path / "records.jsonl"))
    assert len(recs) == 6 and all("counters_unsettled" not in r["flags"] for r in recs)


async def test_a_non_streamed_request_does_not_pollute_a_streaming_ones_counters(tmp_path: Path) -> None:
    """A non-streamed request's steps show no chunks: the engine counts them, so the interval is cut by time, the
    streaming request's figure is not claimed exact, and it does not take the other request's accepted tokens."""
    async with (
        running_sim(speed=20.0) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        await _wait_ready(px)
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(stream=False, max_tokens=60)) as r:
            assert (await r.json())["usage"]["completion_tokens"] == 60
        await _send(s, px.url, chat_body(max_tokens=60), "w")
        await px.flush()
        non_stream, streamed = px.records()
        assert non_stream["stream"] is False and non_stream["spec"] is None  # nothing to attribute it from
        t = await truth(s, sim, streamed["upstream_id"])
        c = streamed["spec"]["estimates"]["counters"]
        assert c["exact"] is False
        assert abs(c["accepted"] - t["counted_accepted"]) <= 3  # not the two requests' sum
        assert c["drafts"] == t["drafts"]
