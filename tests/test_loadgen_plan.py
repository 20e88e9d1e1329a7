"""The pure parts of the load generator: plan order and mixing, shards, request bodies, replay plans, summaries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import islice
from typing import Any

import pytest

from specproxy.attribution.counts import SpecCounts
from specproxy.core.record import Record, as_record
from specproxy.loadgen.plan import (
    STREAM_OPTIONS,
    BodyOptions,
    Shard,
    iter_plan,
    parse_shard,
    plan_order,
    plan_run_id,
    request_body,
)
from specproxy.loadgen.progress import Progress, merge, render
from specproxy.loadgen.replay import plan_replay
from specproxy.loadgen.summary import acceptance_source, format_summary, summarize_run
from specproxy.workloads import Workload, WorkloadItem, load_workload


def wl(name: str, n: int, **item: Any) -> Workload:
    items = tuple(
        WorkloadItem(id=f"{name}-{i}", messages=({"role": "user", "content": f"{name} {i}"},), **item) for i in range(n)
    )
    return Workload(name=name, description="", max_tokens=64, items=items, source=f"{name}.json")


OPTS = BodyOptions(model="m")


def test_round_robin_without_seed_cycles_each_workload_in_order() -> None:
    order = list(islice(plan_order([2, 3], None), 8))
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 2), (0, 1), (1, 0)]


def test_seeded_mix_is_reproducible_even_and_covers_every_item_per_pass() -> None:
    a = list(islice(plan_order([5, 7], 42), 2000))
    assert a == list(islice(plan_order([5, 7], 42), 2000))
    assert a != list(islice(plan_order([5, 7], 43), 2000))
    per_workload = Counter(w for w, _ in a)
    assert abs(per_workload[0] - 1000) < 100  # equal weight per request
    first_pass = [i for w, i in a if w == 1][:7]
    assert sorted(first_pass) == list(range(7)) and first_pass != list(range(7))  # shuffled, none repeated


def test_shards_partition_the_plan_exactly() -> None:
    def entries() -> Iterator[tuple[str, str]]:
        return ((e.workload, e.item_id) for e in islice(iter_plan([wl("a", 3), wl("b", 2)], OPTS, 5), 23))

    plan = list(entries())
    parts = [list(Shard(i, 3).take(entries())) for i in range(3)]
    assert sorted(x for part in parts for x in part) == sorted(plan)
    assert parts[1] == plan[1::3]
    assert [Shard(i, 3).share(10) for i in range(3)] == [4, 3, 3]
    assert Shard(1, 2).sub(1, 3) == Shard(3, 6)  # worker 1 of 3 on machine shard 1/2


@pytest.mark.parametrize("bad", ["2/2", "1", "a/b", "-1/3", "0/0"])
def test_bad_shard_is_refused_with_the_form(bad: str) -> None:
    with pytest.raises(ValueError, match="i/N"):
        parse_shard(bad)


def test_chat_body_is_minimal_streams_with_continuous_usage_and_thinking_off() -> None:
    w = wl("a", 1)
    path, body = request_body(w, w.items[0], OPTS)
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "a 0"}],
        "max_tokens": 64,
        "temperature": 0.0,
        "stream": True,
        "stream_options": STREAM_OPTIONS,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    _, on = request_body(w, w.items[0], BodyOptions(model="m", thinking=True, max_tokens=9, temperature=0.7))
    assert on["chat_template_kwargs"] == {"enable_thinking": True}
    assert (on["max_tokens"], on["temperature"]) == (9, 0.7)


def test_completions_endpoint_sends_the_prompt() -> None:
    w = wl("p", 1, prompt="raw prompt", max_tokens=5)
    path, body = request_body(w, w.items[0], BodyOptions(model="m", endpoint="completions"))
    assert path == "/v1/completions"
    assert body["prompt"] == "raw prompt" and body["max_tokens"] == 5 and "messages" not in body


def test_dataset_bodies_are_kept_but_stream_with_usage() -> None:
    given = {"model": "other", "messages": [{"role": "user", "content": "x"}], "temperature": 0.9, "top_p": 0.5,
             "stream_options": {"include_usage": False}, "max_completion_tokens": 33}  # fmt: skip
    w = wl("d", 1, body=given)
    _, body = request_body(w, w.items[0], OPTS)
    assert body["model"] == "m" and body["stream"] is True
    assert body["stream_options"] == STREAM_OPTIONS
    assert (body["temperature"], body["top_p"], body["max_completion_tokens"]) == (0.9, 0.5, 33)
    assert "chat_template_kwargs" not in body
    _, forced = request_body(w, w.items[0], BodyOptions(model="m", max_tokens=8, temperature=0.0))
    assert forced["max_tokens"] == 8 and "max_completion_tokens" not in forced and forced["temperature"] == 0.0
    assert given["model"] == "other"  # the workload's own body is not touched


def test_run_id_of_a_plan_is_stable_and_depends_on_it() -> None:
    ja = load_workload("ja_chat")
    assert plan_run_id([ja], (100, 1)) == plan_run_id([load_workload("ja_chat")], (100, 1))
    assert plan_run_id([ja], (100, 1)) != plan_run_id([ja], (100, 2))


def rec(rid: str, t: float, **kw: Any) -> Record:
    base: dict[str, Any] = {"request_id": rid, "started_at": t, "workload": "w", "method": "POST",
                            "path": "/v1/chat/completions", "request": {"model": "x", "messages": []}}  # fmt: skip
    base.update(kw)
    return as_record(base)


def test_replay_plan_orders_by_start_scales_gaps_and_counts_what_it_cannot_send() -> None:
    records = [
        rec("c", 1002.0),
        rec("a", 1000.0, workload="code"),
        rec("n", 1000.5, request=None),
        rec("g", 1001.0, method="GET", request=None),
        rec("b", 1001.0),
    ]
    plan = plan_replay(records, speed=2.0, model="new")
    assert [(o, e.replay_of, e.workload) for o, e in plan.timed] == [
        (0.0, "a", "code"),
        (0.5, "b", "w"),
        (1.0, "c", "w"),
    ]
    assert all(e.body["model"] == "new" for _, e in plan.timed)
    assert (plan.recorded, plan.no_body, plan.not_post) == (5, 1, 1)
    notes = " ".join(plan.notes())
    assert "1 of 5 recorded requests had no body" in notes and "not POST" in notes
    assert [o for o, _ in plan_replay(records, speed=None).timed] == [0.0, 0.0, 0.0]


def summary_record(workload: str, repeat: int, tok_s: float, accepted: int, outcome: str = "ok") -> Record:
    return as_record({"request_id": f"{workload}-{repeat}-{outcome}", "workload": workload, "repeat": repeat,
                      "outcome": outcome, "decode_tok_s": tok_s, "ttft_s": 0.1, "started_at": 100.0 + repeat,
                      "e2e_s": 1.0, "completion_tokens": 11, "chunks": [[0.1, 1], [0.2, 2], [0.3, 4]],
                      "spec": {"source": "chunks", "accepted": accepted, "drafts": 2, "draft_tokens": 6}})  # fmt: skip


def test_summary_takes_medians_over_repeats() -> None:
    records = [summary_record("w", r, tok_s, acc) for r, (tok_s, acc) in enumerate([(10, 3), (30, 6), (20, 0)])]
    records.append(summary_record("w", 1, 0.0, 0, outcome="timeout"))
    s = summarize_run(records, lags_s=[0.001, 0.002, 0.003], order=["w", "unused"])
    (w,) = s.workloads
    assert (w.requests, w.outcomes["ok"], w.errors, w.repeats) == (4, 3, 1, 3)
    decode = w.figures["decode_tok_s_p50"]
    assert (decode.value, decode.min, decode.max) == (20, 10, 30)
    assert w.figure("acceptance_rate") == pytest.approx(0.5)  # repeats give 3/6, 6/6, 0/6
    assert acceptance_source(w) == "chunks"
    assert w.figure("itl_s_p50") == pytest.approx(0.025) and w.figure("step_s_p50") == pytest.approx(0.1)
    text = format_summary(s)
    assert "medians over 3 repeats" in text and "20.0 (10.0-30.0)" in text and "send lag" in text
    assert s.failed == 1


def test_progress_line_shows_rates_and_acceptance_per_workload() -> None:
    a, b = Progress(["ja", "code"]), Progress(["ja", "code"])
    a.finished("ja", True, 40)
    a.finished("code", False, 0)
    b.finished("ja", True, 60)
    snap = merge([a.snapshot({"ja": SpecCounts(accepted=3.0, draft_tokens=6.0)}), b.snapshot()])
    line = render(snap, 2.0, total=10, duration_s=None)
    assert line.startswith("3/10 1.5 req/s 50 tok/s 1 err")
    assert "ja 2 50 tok/s acc 0.50" in line and "code 1 0 tok/s" in line and "code 1 0 tok/s acc" not in line
