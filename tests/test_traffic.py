"""Traffic that looks like production: conversations that grow on the model's own replies, Spec-Bench / MT-Bench
question files, shared prefixes, and the simulator's prefix cache and /tokenize that make them checkable."""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from simutil import running_sim
from test_cli import run as cli
from upstreams import Script, start_upstream

from specproxy.core.record import Record, read_records
from specproxy.loadgen.plan import BodyOptions
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.session import run_load
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import RecorderConfig
from specproxy.sim import SimConfig
from specproxy.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, prefix_keys
from specproxy.workloads import (
    SharedPrefixes,
    Workload,
    WorkloadError,
    load_workload,
    load_workloads,
    parse_workload,
    with_shared_prefixes,
)
from specproxy.workloads.conversations import prefix_texts

QUESTIONS = (
    '{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it as a haiku."]}\n'
    '{"question_id": 91, "category": "coding", "turns": ["Write a function that reverses a list."]}\n'
    '{"question_id": 92, "category": "writing", "turns": ["Write a limerick."]}\n'
)


def conversation_file(tmp_path: Path, *, think_time_s: float, followups: list[str]) -> Path:
    path = tmp_path / "talk.json"
    path.write_text(
        json.dumps(
            {
                "name": "talk",
                "think_time_s": think_time_s,
                "items": [
                    {"id": "a", "messages": [{"role": "user", "content": "Hello A"}], "followups": followups},
                    {"id": "b", "messages": [{"role": "user", "content": "Hello B"}], "followups": followups},
                ],
            }
        )
    )
    return path


def sse_reply(text: str) -> list[bytes]:
    """A chat stream saying `text` in two pieces, with usage, as vLLM sends it."""

    def event(obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    half = len(text) // 2
    return [
        event(
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        ),
        event({**head, "choices": [{"index": 0, "delta": {"content": text[:half]}, "finish_reason": None}]}),
        event({**head, "choices": [{"index": 0, "delta": {"content": text[half:]}, "finish_reason": "stop"}]}),
        event({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}),
        b"data: [DONE]\n\n",
    ]


def spec_for(url: str, workloads: tuple[Workload, ...], model: str = "m", **kw: Any) -> LoadSpec:
    return LoadSpec(
        target=Target(url),
        workloads=workloads,
        body=BodyOptions(model=model, max_tokens=16),
        recorder=RecorderConfig(metrics_url=None, run_id=uuid.uuid4().hex[:12], finalize_wait_s=1.0),
        **kw,
    )


async def run_records(spec: LoadSpec, out: Path) -> list[Record]:
    outcome = await run_load(spec, out=out, progress=False, handle_signals=False, model=spec.body.model)
    assert outcome.exit_code == 0, outcome
    return list(read_records(out))


# -- conversations on the wire ---------------------------------------------------------------------------------------


async def test_each_turn_carries_the_models_own_earlier_replies(tmp_path: Path) -> None:
    replies: list[str] = []

    def script(request: web.Request, _body: bytes) -> Script:
        if request.path != "/v1/chat/completions":
            return Script([b"{}"], headers={"Content-Type": "application/json"})
        replies.append(f"reply number {len(replies) + 1} with some words")
        return Script(sse_reply(replies[-1]))

    upstream = await start_upstream(script)
    try:
        wl = load_workload(str(conversation_file(tmp_path, think_time_s=0.05, followups=["more", "thanks"])))
        recs = await run_records(spec_for(upstream.url, (wl,), requests=2, concurrency=2), tmp_path / "r.jsonl")
    finally:
        await upstream.server.close()
    bodies = [orjson.loads(s["body"]) for s in upstream.seen if s["path"] == "/v1/chat/completions"]  # type: ignore[arg-type]
    assert len(bodies) == 6 and len(replies) == 6  # two conversations of three turns
    by_opening: dict[str, list[dict[str, Any]]] = {}
    for body, reply in zip(bodies, replies, strict=True):
        body["_reply"] = reply
        by_opening.setdefault(body["messages"][0]["content"], []).append(body)
    assert sorted(by_opening) == ["Hello A", "Hello B"]
    for opening, turns in by_opening.items():
        assert [len(t["messages"]) for t in turns] == [1, 3, 5]
        for prev, nxt in itertools.pairwise(turns):
            # the next turn is the last one's messages, the reply the server really sent, then the follow-up
            assert nxt["messages"][: len(prev["messages"])] == prev["messages"]
            assert nxt["messages"][len(prev["messages"])] == {"role": "assistant", "content": prev["_reply"]}
        assert [t["messages"][-1]["content"] for t in turns] == [opening, "more", "thanks"]
    assert len(recs) == 6 and all(r["outcome"] == "ok" for r in recs)
    conversations: dict[str | None, list[Record]] = {}
    for r in recs:
        conversations.setdefault(r["conversation"], []).append(r)
    assert len(conversations) == 2 and None not in conversations
    for turns in conversations.values():
        turns.sort(key=lambda r: r["turn"] or 0)
        assert [r["turn"] for r in turns] == [1, 2, 3]
        for prev, nxt in itertools.pairwise(turns):
            # the user thinks between a reply and the next turn
            assert prev["started_at"] is not None and nxt["started_at"] is not None and prev["e2e_s"] is not None
            assert nxt["started_at"] - (prev["started_at"] + prev["e2e_s"]) >= 0.04
    assert all(r["response_text"] is None for r in recs)  # kept for the next turn, not written (--capture request)


async def test_a_failed_turn_ends_its_conversation(tmp_path: Path) -> None:
    seen = 0

    def script(request: web.Request, _body: bytes) -> Script:
        nonlocal seen
        if request.path != "/v1/chat/completions":
            return Script([b"{}"], headers={"Content-Type": "application/json"})
        seen += 1
        if seen == 2:
            return Script([b'{"error": "overloaded"}'], status=503, headers={"Content-Type": "application/json"})
        return Script(sse_reply("fine"))

    upstream = await start_upstream(script)
    try:
        wl = load_workload(str(conversation_file(tmp_path, think_time_s=0.0, followups=["x", "y"])))
        outcome = await run_load(
            spec_for(upstream.url, (wl,), requests=1, concurrency=1),
            out=tmp_path / "r.jsonl",
            progress=False,
            handle_signals=False,
            model="m",
        )
    finally:
        await upstream.server.close()
    recs = sorted(read_records(tmp_path / "r.jsonl"), key=lambda r: r["turn"] or 0)
    assert seen == 2  # turn 3 never sent: the user got no answer to turn 2
    assert [(r["turn"], r["outcome"]) for r in recs] == [(1, "ok"), (2, "upstream_error")]
    assert any("1 conversations ended before their last turn" in n for n in outcome.summary.notes)


# -- the built-ins and the benchmark files ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "base"), [("ja_chat_multi", "ja_chat"), ("code_agent_multi", "code_agent")])
def test_multi_turn_builtins_are_made_from_their_single_turn_items(name: str, base: str) -> None:
    multi, single = load_workload(name), load_workload(base)
    assert len(multi.items) == len(single.items) and multi.think_time_s > 0
    for m, s in zip(multi.items, single.items, strict=True):
        assert m.id == s.id and m.turns == 4
        assert [x["role"] for x in m.messages][-1] == "user"
        first_user = next(x for x in s.messages if x["role"] == "user")
        assert m.messages[-1] == first_user  # the opening turn; canned assistant replies are dropped
        later_users = [str(x["content"]) for x in s.messages if x["role"] == "user"][1:]
        assert list(m.followups[: len(later_users)]) == later_users[:3]  # the item's own later turns come first
        assert all(f.strip() for f in m.followups)


def test_question_files_become_one_conversation_workload_per_category(tmp_path: Path) -> None:
    path = tmp_path / "question.jsonl"
    path.write_text(QUESTIONS)
    workloads = load_workloads(str(path))
    assert [w.name for w in workloads] == ["writing", "coding"]
    writing = workloads[0]
    assert [i.id for i in writing.items] == ["question-81", "question-92"]
    assert writing.items[0].messages == ({"role": "user", "content": "Compose a travel blog post."},)
    assert writing.items[0].followups == ("Rewrite it as a haiku.",)
    assert writing.items[1].followups == ()
    assert writing.max_tokens == 1024


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"question_id": 1, "turns": []}\n', "turns must be a non-empty list"),
        ('{"question_id": 1, "turns": ["ok", ""]}\n', "turns must be a non-empty list"),
        ('{"question_id": 1, "category": 7, "turns": ["ok"]}\n', "category must be a string"),
    ],
)
def test_bad_question_files_name_the_line(text: str, needle: str) -> None:
    with pytest.raises(WorkloadError) as info:
        parse_workload(text, source="q.jsonl")
    assert needle in str(info.value) and "q.jsonl" in str(info.value) and "\n" not in str(info.value)


def test_workload_files_check_followups_and_think_time() -> None:
    good = {"name": "w", "think_time_s": 1.5, "items": [{"messages": [{"role": "user", "content": "hi"}]}]}
    assert parse_workload(json.dumps(good), source="w.json").think_time_s == 1.5
    for bad, needle in (
        ({**good, "think_time_s": -1}, "think_time_s must be"),
        ({**good, "think_time_s": 99999}, "think_time_s must be"),
        ({**good, "items": [{"messages": [{"role": "user", "content": "hi"}], "followups": "more"}]}, "followups"),
        ({**good, "items": [{"messages": [{"role": "user", "content": "hi"}], "followups": [""]}]}, "follow-up"),
    ):
        with pytest.raises(WorkloadError, match=needle):
            parse_workload(json.dumps(bad), source="w.json")


# -- shared prefixes -------------------------------------------------------------------------------------------------


def test_shared_prefixes_go_before_the_share_asked_for_reproducibly() -> None:
    wl = load_workload("ja_chat")
    spec = SharedPrefixes(count=3, tokens=200, share=0.5)
    texts = ["alpha beta gamma delta " * 5, "epsilon zeta eta theta " * 5, "iota kappa lambda mu " * 5]
    prefixes = prefix_texts(spec, texts, lambda t: len(t.split()))
    assert len(set(prefixes)) == 3 and all(len(p.split()) >= 200 for p in prefixes)
    shaped = with_shared_prefixes(wl, spec, prefixes, seed=1)
    assert shaped == with_shared_prefixes(wl, spec, prefixes, seed=1)
    given = [i for i in shaped.items if "@p" in i.id]
    assert 0.3 * len(wl.items) <= len(given) <= 0.7 * len(wl.items)
    for item in given:
        p = int(item.id.rsplit("@p", 1)[1])
        system = item.messages[0]
        assert system["role"] == "system" and str(system["content"]).startswith(prefixes[p - 1])
    untouched = [i for i in shaped.items if "@p" not in i.id]
    assert all(i in wl.items for i in untouched)
    everyone = with_shared_prefixes(wl, SharedPrefixes(2, 50, 1.0), prefixes[:2], seed=1)
    assert all("@p" in i.id for i in everyone.items)


def test_prefix_cache_counts_whole_blocks_of_repeated_message_prefixes() -> None:
    def count(text: str) -> int:
        return len(text) // 4

    cache = PrefixCache(capacity=1000)
    shared = "x" * 400  # 100 tokens
    first = prefix_keys([("system\0" + shared, 4), ("user\0" + "q" * 36, 4)], count)
    second = prefix_keys([("system\0" + shared, 4), ("user\0" + "r" * 36, 4)], count)
    third = prefix_keys([("system\0" + shared + " and more of its own", 4), ("user\0q", 4)], count)
    total = first[-1][1]
    assert cache.lookup_and_insert(first, total) == 0
    assert cache.lookup_and_insert(second, total) == 96  # the system message: 105 tokens, in whole blocks
    assert cache.lookup_and_insert(third, 130) == 96  # a longer system prompt that starts alike shares its start
    assert cache.lookup_and_insert(first, total) == (total - 1) // BLOCK_TOKENS * BLOCK_TOKENS  # all but the end
    tiny = PrefixCache(capacity=2)
    tiny.lookup_and_insert(first, total)
    tiny.lookup_and_insert(prefix_keys([("other" * 100, 0)], count), 125)
    assert tiny.lookup_and_insert(first, total) == 0  # forgotten: least recently used first


async def test_the_simulator_serves_shared_prefixes_from_its_cache(tmp_path: Path) -> None:
    wl = load_workload("code_agent")
    prefixes = prefix_texts(SharedPrefixes(1, 400), ["shared words for the cache " * 4], lambda t: len(t) // 4)
    shaped = with_shared_prefixes(wl, SharedPrefixes(1, 400, 1.0), prefixes, seed=0)
    async with running_sim(SimConfig(port=0, speed=50.0, prompt_tokens_details=True)) as sim:
        recs = await run_records(
            spec_for(sim.url, (shaped,), "sim-model", requests=6, concurrency=1), tmp_path / "r.jsonl"
        )
        truths = {t.id: t for t in sim.state.truth.values()}
    assert len(recs) == 6
    by_upstream = {r["upstream_id"]: r for r in recs}
    assert set(by_upstream) == set(truths)
    first = min(truths.values(), key=lambda t: t.started_at_s)
    assert first.cached_tokens == 0
    for rid, truth in truths.items():
        rec = by_upstream[rid]
        if truth is not first:
            assert truth.cached_tokens >= 384  # the shared prefix, in whole blocks
        assert rec["cached_tokens"] == (truth.cached_tokens or None)  # vLLM says nothing when nothing was cached
    p = cli("report", str(tmp_path / "r.jsonl"), "--format", "json")
    assert p.returncode == 0, p.stderr
    (group,) = json.loads(p.stdout)["groups"]
    share = sum(t.cached_tokens for t in truths.values()) / sum(t.prompt_tokens for t in truths.values())
    assert group["figures"]["prompt_cached_share"]["value"] == pytest.approx(share)


async def test_simulator_tokenize_counts_its_own_text_as_generated() -> None:
    async with running_sim(SimConfig(port=0, speed=100.0)) as sim, aiohttp.ClientSession() as s:
        body = {"messages": [{"role": "user", "content": "Write a Python function."}], "max_tokens": 40}
        async with s.post(sim.url + "/v1/chat/completions", json=body) as resp:
            answer = await resp.json()
        text, n = answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]
        async with s.post(sim.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}) as resp:
            counted = await resp.json()
        assert counted["count"] == n and len(counted["tokens"]) == n
        async with s.post(sim.url + "/tokenize", json={"model": "nope", "prompt": "x"}) as resp:
            assert resp.status == 404
        async with s.post(sim.url + "/tokenize", json={"nothing": 1}) as resp:
            assert resp.status == 400


# -- reports by turn, and the command line ----------------------------------------------------------------------------


async def test_report_by_turn_splits_a_conversation_workload(tmp_path: Path) -> None:
    wl = load_workload(str(conversation_file(tmp_path, think_time_s=0.0, followups=["Tell me more.", "And then?"])))
    out = tmp_path / "r.jsonl"
    async with running_sim(SimConfig(port=0, speed=100.0)) as sim:
        await run_records(spec_for(sim.url, (wl,), "sim-model", requests=4, concurrency=2), out)
    p = cli("report", str(out), "--by", "workload,turn", "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["groups"]
    turns = sorted(int(g["key"]["turn"]) for g in rows)
    assert turns == [1, 2, 3] and all(g["requests"] == 4 for g in rows)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--think-time", "-1"], "--think-time"),
        (["--shared-prefixes", "2", "--prefix-share", "2"], "share from 0 to 1"),
        (["--shared-prefixes", "0"], "count >= 1"),
    ],
)
def test_bad_traffic_options_are_one_line_errors(args: list[str], needle: str) -> None:
    p = cli("run", "--target", "http://127.0.0.1:9", "--workload", "ja_chat_multi", *args)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
