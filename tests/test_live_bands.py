"""The check after deployment, per band of requests in flight (pure): what k ran, how it went, and whether it is the
k the engine was told to run. As the proxy shows it: tests/test_proxy_live_advice.py."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from specproxy.core.record import Record
from specproxy.recorder.live_advice import LiveAdvice, LiveAdviceCollector
from specproxy.recorder.live_bands import (
    BAND_FIELDS,
    BAND_SPEC_FIELDS,
    Schedule,
    compute_bands,
    parse_schedule,
    point_of,
)
from tests.analysisutil import T0, accepted_from_profile, make_record

GOOD = [0.8, 0.7, 0.6]  # code-like acceptance: k=3 pays


def _requests(n: int, *, k: int, cond: list[float], step_s: float, t0: float, gap_s: float, tag: str) -> list[Record]:
    accepted = accepted_from_profile(cond, k, n * 30) if k else []
    return [
        make_record(
            f"{tag}{t0}-{i}",
            accepted=accepted[i::n] if k else (),
            k=k,
            plain_steps=0 if k else 30,
            step_s=step_s,
            started_at=t0 + i * gap_s,
        )
        for i in range(n)
    ]


def alone(n: int, *, k: int = 3, cond: list[float] = GOOD, step_s: float = 0.01, t0: float = T0) -> list[Record]:
    """``n`` requests one after the other: each decodes with one in flight."""
    return _requests(n, k=k, cond=cond, step_s=step_s, t0=t0, gap_s=10.0, tag="a")


def together(
    n: int, *, k: int = 3, cond: list[float] = GOOD, step_s: float = 0.01, t0: float = T0 + 1000
) -> list[Record]:
    """``n`` requests that start together and decode side by side: ``n`` in flight."""
    return _requests(n, k=k, cond=cond, step_s=step_s, t0=t0, gap_s=0.0, tag="t")


def no_drafts(rec: Record) -> Record:
    """A request the counters saw draft nothing (a spec block of zeros, as the recorder writes it)."""
    zero = {"accepted": 0.0, "drafts": 0.0, "draft_tokens": 0.0, "per_position": []}
    rec["spec"] = {"source": "counters", **zero, "k": 3.0, "acceptance_rate": None, "mean_acceptance_length": None,  # type: ignore[typeddict-item]
                   "tokens_per_step": {}, "estimates": {"server": None, "chunks": None, "counters": zero}}  # fmt: skip
    return rec


def test_vllms_schedule_as_it_reads_it() -> None:
    s = parse_schedule('{"method": "mtp", "num_speculative_tokens": 3, '
                       '"num_speculative_tokens_per_batch_size": [[1, 4, 3], [8, 16, 1], [17, 64, 0]]}')  # fmt: skip
    assert [s.k_at(b) for b in (1, 4, 5, 7, 8, 16, 17, 500)] == [
        3,
        3,
        3,
        3,
        1,
        1,
        0,
        0,
    ]  # a gap carries the k before it
    capped = parse_schedule("[[1, 2, 5], [3, 8, 2]]")  # the list alone: k is its largest
    assert capped.k == 5 and capped.k_at(100) == 2
    assert (
        parse_schedule('{"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 9, 4]]}').k_at(1)
        == 2
    )  # never above num_speculative_tokens, as vLLM caps it
    old = parse_schedule('{"num_speculative_tokens": 3, "disable_by_batch_size": 6}')
    assert (old.k_at(6), old.k_at(7)) == (3, 0)
    assert parse_schedule('{"num_speculative_tokens": 2}').describe() == "k=2 at every batch size"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ("3", "want a JSON object"),
        ("[[2, 4, 1]]", "start at batch size 1"),
        ("[[1, 4, 1], [4, 8, 0]]", "overlap"),
        ("[[1, 4]]", "[first batch size, last batch size, k]"),
        ("[[1, 4, -1]]", "k >= 0"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens"),
        ("[]", "non-empty"),
    ],
)
def test_a_schedule_that_is_not_one_says_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        parse_schedule(text)
    assert says in str(e.value)


def test_a_band_per_range_of_requests_in_flight() -> None:
    points = [point_of(r) for r in [*alone(6), *together(8, step_s=0.012)]]
    one, eight = compute_bands(points)
    assert (one.label, eight.label) == ("1", "6-11")
    assert one.requests == 6 and eight.requests == 8
    assert one.in_flight == pytest.approx(1.0) and 7.5 < eight.in_flight <= 8.0
    assert one.draft_k == eight.draft_k == 3.0 and one.drafting_share == 1.0
    assert one.acceptance_rate == pytest.approx(eight.acceptance_rate, abs=0.02)
    assert one.step_s is not None and eight.step_s is not None and eight.step_s > one.step_s
    assert eight.server_tok_s is not None and one.server_tok_s is not None and eight.server_tok_s > one.server_tok_s
    assert not one.losing and not eight.losing and one.speedup is not None and one.speedup > 1.5
    assert one.schedule_mismatch is None  # no schedule given: nothing to check against


def test_too_few_requests_make_no_band() -> None:
    assert compute_bands([point_of(r) for r in alone(4)]) == []


def test_a_band_where_drafts_do_not_pay_is_losing() -> None:
    points = [point_of(r) for r in alone(6, cond=[0.1, 0.05, 0.02])]
    (band,) = compute_bands(points)
    assert band.losing and band.speedup is not None and band.speedup < 1
    assert "cost more than they gain" in band.why[0]


def test_throughput_that_falls_as_the_batch_grows_is_a_collapse() -> None:
    # at 8 in flight each step takes 20 times as long: the server decodes less than with one
    points = [point_of(r) for r in [*alone(6), *together(8, step_s=0.2)]]
    one, eight = compute_bands(points)
    assert not one.losing and eight.losing
    assert "throughput falls as the batch grows" in eight.why[-1]


def test_the_schedule_checked_per_band() -> None:
    # told: k=3 up to 5 in flight, none from 6; the engine drafts k=3 at 8 in flight all the same
    schedule = parse_schedule("[[1, 5, 3], [6, 256, 0]]")
    points = [point_of(r) for r in [*alone(6), *together(8)]]
    one, eight = compute_bands(points, schedule)
    assert (one.expected_k, one.schedule_mismatch) == (3, False)
    assert (eight.expected_k, eight.schedule_mismatch) == (0, True)
    assert "the schedule has no effect" in eight.why[-1]
    # the engine that follows it: no drafts at 8 in flight
    points = [point_of(r) for r in [*alone(6), *together(8, k=0)]]
    one, eight = compute_bands(points, schedule)
    assert eight.draft_k is None and eight.schedule_mismatch is False
    # told k=3 everywhere, drafting nothing at 8: as wrong
    _, eight = compute_bands(points, Schedule(3))
    assert eight.schedule_mismatch is True and "nothing drafted" in eight.why[-1]


def test_the_bands_in_status_and_metrics() -> None:
    live = LiveAdvice(schedule=parse_schedule("[[1, 5, 3], [6, 256, 0]]"))
    for rec in [*alone(6), *together(8)]:
        live.observe(rec)
    failed = make_record("failed", outcome="upstream_error", plain_steps=3, started_at=T0 + 1000)
    live.observe(failed)  # in flight with the others: counted in the batch, not as a band's request
    live.update(*LiveAdvice.compute_all(live.snapshot(), live.band_points(), live.schedule))
    st = live.status()
    assert st["schedule"] == "1-5: k=3, 6-256: k=0"
    assert [(b["band"], b["requests"], b["schedule_mismatch"]) for b in st["bands"]] == [
        ("1", 6, False),
        ("6-11", 8, True),
    ]
    assert st["bands"][1]["in_flight"] > 8.0  # the failed request was there too
    reg = CollectorRegistry()
    reg.register(LiveAdviceCollector(live))
    text = generate_latest(reg).decode()
    assert 'specproxy_band_schedule_mismatch{band="6-11"} 1.0' in text
    assert 'specproxy_band_schedule_mismatch{band="1"} 0.0' in text
    assert 'specproxy_band_draft_k{band="6-11"} 3.0' in text
    assert 'specproxy_band_expected_k{band="6-11"} 0.0' in text
    assert 'specproxy_running_k{workload="chat"} 3.0' in text


def test_a_k0_band_may_draft_at_its_edges_and_without_steps_says_nothing() -> None:
    schedule = parse_schedule("[[1, 1, 3], [2, 256, 0]]")
    assert schedule.describe() == "1: k=3, 2-256: k=0"
    # 8 in flight, one request in five drafting on a few steps (a wave's tail that ran alone): the schedule holds
    edges = [
        make_record(f"e{i}", accepted=[1] * 3, k=3, step_s=0.01, started_at=T0 + 1000) if i % 5 == 0
        else no_drafts(make_record(f"e{i}", plain_steps=30, step_s=0.01, started_at=T0 + 1000))
        for i in range(8)
    ]  # fmt: skip
    (band,) = compute_bands([point_of(r) for r in edges], schedule)
    assert band.expected_k == 0 and band.drafting_share is not None and band.drafting_share < 0.25
    assert band.schedule_mismatch is False
    # chunks that are not steps (one event per token): no share of drafting steps, no verdict either way
    unseen = [make_record(f"u{i}", accepted=[1] * 30, k=3, started_at=T0 + 1000, flags=["chunks_not_steps_engine"])
              for i in range(8)]  # fmt: skip
    (band,) = compute_bands([point_of(r) for r in unseen], schedule)
    assert band.drafting_share is None and band.step_s is None and band.schedule_mismatch is None


def test_a_few_draft_tokens_do_not_make_a_band_losing() -> None:
    # 6 requests of 5 steps at k=3 with nothing accepted: 90 draft tokens, too few to say
    few = [make_record(f"f{i}", accepted=[0] * 5, k=3, started_at=T0 + 10.0 * i) for i in range(6)]
    (band,) = compute_bands([point_of(r) for r in few])
    assert band.speedup is not None and band.speedup < 1 and not band.losing


def test_a_point_keeps_no_body_and_no_text() -> None:
    rec = make_record("big", accepted=[1] * 5, k=3, request={"messages": [{"content": "x" * 200_000}]},
                      response_text="y" * 200_000)  # fmt: skip
    p = point_of(rec)
    # the fields the bands read, nothing else: no body, text, chunks, spans or estimates (the other tests here read
    # bands from such points, so a band that read one more field would fail them on a KeyError)
    assert set(p.rec) == set(BAND_FIELDS) and p.rec["request_id"] == rec["request_id"]
    assert rec["spec"] is not None and p.rec["spec"] is not None
    assert p.rec["spec"] == {f: rec["spec"][f] for f in BAND_SPEC_FIELDS}  # type: ignore[literal-required]
    assert p.decode_steps == 5 and p.step_s is not None
