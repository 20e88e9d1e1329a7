"""The engines' own per-request speculative figures, in every shape they ride (tests/data/engine-shapes/README.md),
read by the pure readers; and the chunk patterns that give away a server-side stream interval."""

from __future__ import annotations

from typing import Any

import pytest

from specproxy.attribution.choice import Evidence, decide, stream_interval_suspected
from specproxy.attribution.estimates import from_server
from specproxy.core.openai_stream import interpret, prediction_tokens_spec, trtllm_spec
from specproxy.core.record import as_record
from specproxy.core.timeline import TimelineResult, timeline_for
from specproxy.core.tokens import ApproxTokenizer
from tests.upstreams import DATA

SHAPES = DATA / "engine-shapes"

# file -> (shape named in the record, drafts: the steps when the shape counts them)
CASES = {
    "vllm-metrics.sse": ("vllm_metrics", 3),
    "sglang-spec-tokens-details.sse": ("sglang_spec_tokens_details", 3),
    "trtllm-choice.sse": ("trtllm_choice", 0),
    "smg-usage-prediction.sse": ("usage_prediction_tokens", 0),
}


def _timeline(name: str) -> TimelineResult:
    tl = timeline_for(0, path="/v1/chat/completions", content_type="text/event-stream", tokenizer=ApproxTokenizer())
    for i, block in enumerate(b for b in (SHAPES / name).read_bytes().split(b"\n\n") if b):
        tl.feed(1_000_000 * (i + 1), block + b"\n\n")
    return tl.result(10**9)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_shape_is_read_and_named(name: str) -> None:
    shape, drafts = CASES[name]
    r = _timeline(name)
    assert r.server_spec is not None and r.server_spec["shape"] == shape
    assert [n for _, n in r.chunks if n] == [1, 3, 1, 2] and r.completion_tokens == 7
    c = decide(
        Evidence(
            stream=True,
            tokens=[n for _, n in r.chunks if n],
            exact_counts=True,
            several_choices=False,
            k=None,
            server_spec=r.server_spec,
        )
    )
    assert c.server is not None and c.server.shape == shape
    assert (c.server.counts.accepted, c.server.counts.drafts, c.server.counts.draft_tokens) == (3, drafts, 9)
    assert c.source == "server" and "server_spec_unusable" not in c.flags
    block = c.spec_block()
    assert block is not None and block["server_source"] == shape
    assert block["estimates"]["server"] is not None and block["estimates"]["server"]["accepted"] == 3


def test_sglang_details_of_several_choices_are_a_list_and_not_read() -> None:
    raw = (SHAPES / "sglang-spec-tokens-details.sse").read_text()
    listed = raw.replace('"spec_tokens_details":{', '"spec_tokens_details":[{').replace(
        '"spec_cap_lens_histogram":[]}', '"spec_cap_lens_histogram":[]}]'
    )
    events = [b.removeprefix("data: ") for b in listed.split("\n\n") if "sglext" in b]
    from specproxy.core.dialects.native import NativeDialect

    assert NativeDialect().event("message", events[0]).spec is None


def test_trtllm_block_reads_accepted_and_drafted_without_steps() -> None:
    spec = trtllm_spec({"acceptance_rate": 0.5, "total_accepted_draft_tokens": 5, "total_draft_tokens": 10})
    assert spec is not None
    est = from_server(spec)
    assert est is not None and est.shape == "trtllm_choice" and est.counts.drafts == 0
    assert est.acceptance_rate == 0.5 and est.counts.accepted == 5
    assert trtllm_spec({"acceptance_rate": 0.5}) is None


def test_prediction_tokens_of_zero_say_nothing() -> None:
    # OpenAI itself and many proxies send both as 0 whatever happened: not a figure of no acceptance
    assert prediction_tokens_spec({"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}) is None
    assert prediction_tokens_spec({"reasoning_tokens": 4}) is None
    spec = prediction_tokens_spec({"accepted_prediction_tokens": 2, "rejected_prediction_tokens": 6})
    assert spec is not None and spec["num_draft_tokens"] == 8
    c = interpret(
        '{"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8,'
        '"completion_tokens_details":{"reasoning_tokens":0,"accepted_prediction_tokens":0,'
        '"rejected_prediction_tokens":0}}}'
    )
    assert c.spec is None and c.completion_tokens == 5


def test_impossible_prediction_counts_are_not_used() -> None:
    spec = prediction_tokens_spec({"accepted_prediction_tokens": -3, "rejected_prediction_tokens": 6})
    assert spec is not None and from_server(spec) is None
    c = decide(Evidence(stream=True, tokens=[1, 2], exact_counts=True, several_choices=False, k=None, server_spec=spec))
    assert "server_spec_unusable" in c.flags and c.spec_block() is not None


def test_vllm_block_without_a_count_is_still_unusable() -> None:
    spec: dict[str, Any] = {"num_accepted_draft_tokens": 3, "num_spec_steps": None, "num_draft_tokens": 9}
    assert from_server(spec) is None and from_server({**spec, "shape": "vllm_metrics"}) is None


def test_older_records_read_no_server_source() -> None:
    rec = as_record(
        {"request_id": "r", "schema_version": 8, "spec": {"source": "server", "estimates": {"server": {"accepted": 1}}}}
    )
    assert rec["spec"] is not None and rec["spec"]["server_source"] is None


# A server-side stream interval: several engine steps in one chunk, the last sent at once.
def test_no_drafting_yet_most_chunks_bring_several_tokens() -> None:
    assert stream_interval_suspected([1, 4, 4, 4, 3], None, no_drafting=True, speculation_unknown=False)
    # a lagging HTTP task merges a few steps now and then: most chunks are still single tokens
    assert not stream_interval_suspected([1, 1, 2, 1, 1, 1], None, no_drafting=True, speculation_unknown=False)


def test_uniform_chunks_when_nothing_is_known_of_speculation() -> None:
    assert stream_interval_suspected([1] + [20] * 6 + [7], None, no_drafting=False, speculation_unknown=True)
    # speculation's accepted counts vary from step to step
    assert not stream_interval_suspected([1, 3, 1, 4, 2, 2], None, no_drafting=False, speculation_unknown=True)
    # a speculating engine (a figure of its own) accepting every draft brings k + 1 every step: not an interval
    assert not stream_interval_suspected([1, 4, 4, 4, 4], None, no_drafting=False, speculation_unknown=False)


def test_the_server_counts_more_steps_than_chunks() -> None:
    server = {"num_accepted_draft_tokens": 30, "num_spec_steps": 20, "num_draft_tokens": 60, "num_spec_tokens": 3}
    c = decide(
        Evidence(
            stream=True, tokens=[1, 12, 10, 11, 8], exact_counts=True, several_choices=False, k=None, server_spec=server
        )
    )
    assert "chunks_fewer_than_steps" in c.flags and not c.chunks_are_steps and c.source == "server"


def test_merged_chunks_are_never_chosen() -> None:
    # k known, no server figure, no counters: inexact chunks used to be the last resort; merged ones are not
    c = decide(Evidence(stream=True, tokens=[1, 9, 8, 9], exact_counts=True, several_choices=False, k=3.0))
    assert "stream_interval_suspected" in c.flags and c.merged_steps
    assert c.source is None and c.chunks is not None and not c.chunks.exact
