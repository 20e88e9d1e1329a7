"""Prometheus snapshots and deltas against real vLLM /metrics captures (figures from tests/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specproxy.core.prom import (
    MetricsParseError,
    delta,
    detect_engine,
    family_sum,
    parse_snapshot,
    spec_counters,
)

DATA = Path(__file__).parent / "data"


def snap(name: str):  # type: ignore[no-untyped-def]
    return parse_snapshot((DATA / name).read_text())


@pytest.mark.parametrize(
    ("before", "after", "drafts", "draft_tokens", "accepted", "per_pos"),
    [
        ("metrics-ngram-before-code.txt", "metrics-ngram-after-code.txt", 16, 48, 21, (9, 8, 4)),
        ("metrics-draftmodel-before-code.txt", "metrics-draftmodel-after-code.txt", 23, 69, 69, (23, 23, 23)),
        ("metrics-ngram-before-per-request.txt", "metrics-ngram-after-per-request.txt", 14, 42, 13, (6, 4, 3)),
    ],
)
def test_capture_deltas(
    before: str, after: str, drafts: int, draft_tokens: int, accepted: int, per_pos: tuple[int, ...]
) -> None:
    b, a = snap(before), snap(after)
    assert detect_engine(a) == "vllm"
    d = delta(b, a)
    assert not d.reset
    sc = spec_counters("vllm", d.values)
    assert (sc.drafts, sc.draft_tokens, sc.accepted) == (drafts, draft_tokens, accepted)
    assert sc.per_position == per_pos
    assert sc.acceptance_rate == pytest.approx(accepted / draft_tokens)
    assert sc.mean_acceptance_length == pytest.approx(1 + accepted / drafts)


def test_created_samples_are_not_counted() -> None:
    a = snap("metrics-ngram-after-code.txt")
    assert not any(name.endswith("_created") for name, _ in a.values)
    assert ("vllm:spec_decode_num_drafts_total", (("engine", "0"), ("model_name", "smollm2"))) in a.created
    # a naive sum over every sample starting with the family name would include the ~1.8e9 timestamps
    assert spec_counters("vllm", a.values).drafts == 16


def test_nospec_has_no_spec_series() -> None:
    s = snap("metrics-nospec.txt")
    assert detect_engine(s) == "vllm"
    sc = spec_counters("vllm", s.values)
    assert not sc.has_spec
    assert sc.drafts is None and sc.per_position == ()
    assert sc.generation_tokens is not None


def _two_engines(v0: float, v1: float, created1: float = 1.0, pos: tuple[float, float] = (0, 0)) -> str:
    lines = ["# TYPE vllm:spec_decode_num_drafts_total counter"]
    for eng, v in (("0", v0), ("1", v1)):
        lines.append(f'vllm:spec_decode_num_drafts_total{{engine="{eng}",model_name="m"}} {v}')
    lines.append("# TYPE vllm:spec_decode_num_drafts_created gauge")
    lines.append('vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.0')
    lines.append(f'vllm:spec_decode_num_drafts_created{{engine="1",model_name="m"}} {created1}')
    lines.append("# TYPE vllm:spec_decode_num_draft_tokens_total counter")
    lines.append('vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 0')
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
    for eng in ("0", "1"):
        for i, v in enumerate(pos):
            labels = f'engine="{eng}",model_name="m",position="{i}"'
            lines.append(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels}}} {v}")
    return "\n".join(lines) + "\n"


def test_multi_engine_sum_including_per_position() -> None:
    s = parse_snapshot(_two_engines(10, 5, pos=(3, 1)))
    sc = spec_counters("vllm", s.values)
    assert sc.drafts == 15
    assert sc.per_position == (6, 2)


def test_reset_on_one_engine_detected_even_when_sum_grows() -> None:
    before = parse_snapshot(_two_engines(10, 50))
    after = parse_snapshot(_two_engines(100, 4))  # engine 1 restarted; the sum still grew (60 -> 104)
    d = delta(before, after)
    assert d.reset
    assert [k[1] for k in d.resets] == [(("engine", "1"), ("model_name", "m"))]
    assert family_sum(d.values, "vllm:spec_decode_num_drafts_total") == 90 + 4
    assert all(v >= 0 for v in d.values.values())


def test_reset_detected_by_created_change_when_value_did_not_drop() -> None:
    before = parse_snapshot(_two_engines(10, 3))
    after = parse_snapshot(_two_engines(12, 7, created1=2.0))  # restarted and already past its old value
    d = delta(before, after)
    assert d.reset
    assert family_sum(d.values, "vllm:spec_decode_num_drafts_total") == 2 + 7


def test_vanished_and_new_series() -> None:
    before = parse_snapshot(_two_engines(1, 1))
    after = parse_snapshot(
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 4\n'
        'vllm:spec_decode_num_drafts_total{engine="2",model_name="m"} 5\n'
    )
    d = delta(before, after)
    assert d.reset  # engine 1's series and others vanished
    assert family_sum(d.values, "vllm:spec_decode_num_drafts_total") == 3 + 5


def test_exact_family_names_not_prefixes() -> None:
    text = (
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 5\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 5\n'
    )
    assert spec_counters("vllm", parse_snapshot(text).values).accepted == 5


def test_other_engines() -> None:
    llama = parse_snapshot(
        "# TYPE llamacpp:spec_decode_num_drafts_total counter\nllamacpp:spec_decode_num_drafts_total 4\n"
        "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\nllamacpp:spec_decode_num_draft_tokens_total 12\n"
        "# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 6\n"
    )
    assert detect_engine(llama) == "llamacpp"
    assert spec_counters("llamacpp", llama.values).acceptance_rate == 0.5
    sg = parse_snapshot("# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length 2.5\n")
    assert detect_engine(sg) == "sglang"
    assert spec_counters("sglang", sg.values).acceptance_length_gauge == 2.5
    v0 = parse_snapshot(
        "# TYPE vllm:spec_decode_draft_acceptance_rate gauge\nvllm:spec_decode_draft_acceptance_rate 0.4\n"
        "# TYPE vllm:spec_decode_num_emitted_tokens_total counter\nvllm:spec_decode_num_emitted_tokens_total 9\n"
    )
    assert detect_engine(v0) == "vllm-v0"
    assert spec_counters("vllm-v0", v0.values).acceptance_rate_gauge == 0.4


def test_gauges_do_not_produce_deltas() -> None:
    b = snap("metrics-ngram-before-code.txt")
    a = snap("metrics-ngram-after-code.txt")
    assert all(name != "vllm:num_requests_running" for name, _ in delta(b, a).values)


def test_malformed_text_is_a_clear_error() -> None:
    with pytest.raises(MetricsParseError, match="malformed metrics text"):
        parse_snapshot('vllm:x{engine="0" 1\n')


@pytest.mark.parametrize(
    ("before", "after", "capture"),
    [
        ("metrics-ngram-before-code.txt", "metrics-ngram-after-code.txt", "chat-stream-ngram-k3-code.sse"),
        (
            "metrics-draftmodel-before-code.txt",
            "metrics-draftmodel-after-code.txt",
            "chat-stream-draftmodel-k3-code.sse",
        ),
        (
            "metrics-ngram-before-per-request.txt",
            "metrics-ngram-after-per-request.txt",
            "chat-stream-ngram-k3-per-request-metrics.sse",
        ),
    ],
)
def test_recorder_families_parse_alike_and_itl_count_is_decode_steps(before: str, after: str, capture: str) -> None:
    """Pinned on real vLLM 0.32: the inter-token-latency histogram's count grows by one per decode step of the
    request (the chunks after the first), which is what lets the ledger cut intervals by step count."""
    from specproxy.core.openai_stream import interpret
    from specproxy.core.prom import RECORDER_FAMILIES
    from specproxy.core.sse import SSEDecoder

    full = spec_counters("vllm", delta(snap(before), snap(after)).values)
    b = parse_snapshot((DATA / before).read_text(), only=RECORDER_FAMILIES)
    a = parse_snapshot((DATA / after).read_text(), only=RECORDER_FAMILIES)
    assert spec_counters("vllm", delta(b, a).values) == full
    prev = 0
    steps = 0
    for ev in SSEDecoder().feed((DATA / capture).read_bytes()):
        c = interpret(ev.data)
        if c.kind == "chunk" and c.has_choices and c.completion_tokens is not None:
            if c.completion_tokens > prev:
                steps += 1
            prev = c.completion_tokens
    assert full.decode_steps == steps - 1 and full.prefills == 1
