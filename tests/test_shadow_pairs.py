"""The shadow package's pure parts: which requests are drawn, a pair's figures, the book that matches records in
either order, the verdicts (speed, lossless) and the guard."""

from __future__ import annotations

from typing import Any

import pytest

from specproxy.analysis.figures.confidence import Interval
from specproxy.shadow.pairs import PairBook, pair_of, parted_at, text_verdict
from specproxy.shadow.sample import Sampler, is_greedy
from specproxy.shadow.verdicts import Guard, lossless, summarize, summarize_pairs, verdict


def _rec(rid: str, *, decode: float = 100.0, outcome: str = "ok", workload: str = "code", shadow_of: str | None = None,
         accepted: float | None = None, draft_tokens: float | None = None, drafts: float | None = None,
         ttft: float = 0.1, tpot: float = 0.01, e2e: float = 1.0) -> dict[str, Any]:  # fmt: skip
    spec = None
    if accepted is not None:
        spec = {"accepted": accepted, "draft_tokens": draft_tokens, "drafts": drafts}
    return {"request_id": rid, "outcome": outcome, "workload": workload, "decode_tok_s": decode, "ttft_s": ttft,
            "tpot_s": tpot, "e2e_s": e2e, "spec": spec, "shadow_of": shadow_of}  # fmt: skip


def test_the_draw_is_reproducible_from_its_seed_and_near_its_share() -> None:
    a, b = Sampler(0.2, seed=3), Sampler(0.2, seed=3)
    seq_a = [a.take("w") for _ in range(2000)]
    assert seq_a == [b.take("w") for _ in range(2000)]
    assert 0.16 < sum(seq_a) / len(seq_a) < 0.24
    assert [Sampler(0.2, seed=4).take("w") for _ in range(2000)] != seq_a
    only = Sampler(1.0, workloads={"code"})
    assert only.take("code") and not only.take("chat")
    with pytest.raises(ValueError):
        Sampler(1.5)


@pytest.mark.parametrize(
    ("body", "greedy"),
    [({"temperature": 0}, True), ({"temperature": 0.0}, True), ({"top_k": 1, "temperature": 0.7}, True),
     ({"temperature": 0.7}, False), ({}, False), ({"temperature": False}, False), ("text", False), (None, False)],
)  # fmt: skip
def test_greedy_is_what_the_body_asks_for(body: Any, greedy: bool) -> None:
    assert is_greedy(body) is greedy


def test_texts_part_where_they_first_differ() -> None:
    assert parted_at("abc", "abc") is None
    assert parted_at("abcd", "abXd") == 2
    assert parted_at("abc", "abcdef") == 3  # one goes on: they part where the shorter ends
    assert text_verdict("same", "same") == ("identical", None)
    long = "x" * 400
    assert text_verdict(long + "tail one", long + "tail two")[0] == "tail"  # within the last characters: noise
    assert text_verdict("y" + long, "z" + long) == ("diverged", 0)


def test_a_pair_is_compared_only_when_both_ended_ok() -> None:
    live, shadow = (
        _rec("a", decode=100.0, ttft=0.2, tpot=0.02, e2e=2.0),
        _rec("s", decode=150.0, shadow_of="a", accepted=30, draft_tokens=60, drafts=20, ttft=0.25, tpot=0.01, e2e=1.0),
    )
    p = pair_of(live, shadow, candidate="c")
    assert p is not None
    assert p.speedup == pytest.approx(1.5) and p.tpot_ratio == pytest.approx(0.5) and p.e2e_ratio == pytest.approx(2)
    assert p.ttft_delta_s == pytest.approx(0.05) and (p.accepted, p.draft_tokens, p.drafts) == (30, 60, 20)
    assert p.live_accepted is None and p.text is None
    assert pair_of(live, {**shadow, "outcome": "upstream_error"}, candidate="c") is None
    assert pair_of({**live, "decode_tok_s": None}, shadow, candidate="c").speedup is None  # type: ignore[union-attr]


@pytest.mark.parametrize("shadow_first", [False, True])
def test_the_book_matches_records_in_either_order_and_forgets_finished_ones(shadow_first: bool) -> None:
    book = PairBook()
    book.expect("a", 2, greedy=True)
    assert book.wants_text("a")
    live = _rec("a")
    shadows = [("c1", _rec("s1", shadow_of="a", decode=200.0)), ("c2", _rec("s2", shadow_of="a", decode=50.0))]
    book.text("a", "hello world")
    book.text("s1", "hello world", shadow_of="a")
    book.text("s2", "jello world", shadow_of="a")
    if shadow_first:
        for c, r in shadows:
            book.shadow(c, r)
        book.live(live)
    else:
        book.live(live)
        for c, r in shadows:
            book.shadow(c, r)
    (p1,) = book.pairs[("c1", "code")]
    (p2,) = book.pairs[("c2", "code")]
    assert p1.speedup == pytest.approx(2.0) and p1.text == "identical"
    assert p2.speedup == pytest.approx(0.5) and p2.text in ("tail", "diverged") and p2.parted_at == 0
    assert book.pending == 0 and not book.wants_text("a") and book.added == 2


def test_a_failed_shadow_is_counted_not_paired_and_unshadowed_records_are_ignored() -> None:
    book = PairBook()
    book.expect("a", 1, greedy=False)
    book.expect("b", 0, greedy=True)  # nothing went out for it: nothing to wait for
    assert book.pending == 1 and not book.wants_text("b")
    book.live(_rec("zzz"))  # never shadowed
    book.live(_rec("a"))
    book.shadow("c", _rec("s", shadow_of="a", outcome="timeout"))
    assert book.failed == {"c": {"timeout": 1}} and not book.pairs and book.pending == 0


def test_the_book_is_bounded() -> None:
    book = PairBook(window=3, pending_max=5)
    for i in range(8):
        book.expect(str(i), 1, greedy=False)
    assert book.pending == 5 and book.forgotten == 3
    for i in range(3, 8):
        book.live(_rec(str(i)))
        book.shadow("c", _rec(f"s{i}", shadow_of=str(i)))
    assert len(book.pairs[("c", "code")]) == 3 and book.added == 5 and book.pending == 0


def test_the_speed_verdict_needs_its_interval_clear_of_one() -> None:
    assert verdict(1.3, Interval(1.1, 1.5)) == "faster"
    assert verdict(0.9, Interval(0.85, 0.95)) == "slower"
    assert verdict(1.01, Interval(0.98, 1.04)).startswith("not distinguishable")
    assert verdict(1.3, None) == "-"


def _pairs(n: int, speedup: float, text: str | None = None, workload: str = "code") -> list[Any]:
    book = PairBook()
    for i in range(n):
        book.expect(str(i), 1, greedy=text is not None)
        if text is not None:
            book.text(str(i), "the same reply, word for word, as the model would say it")
            book.text(f"s{i}", text, shadow_of=str(i))
        book.live(_rec(str(i), decode=100.0 + i % 7, workload=workload))
        book.shadow("c", _rec(f"s{i}", shadow_of=str(i), decode=(100.0 + i % 7) * speedup * (1 + (i % 5) / 100),
                              accepted=6, draft_tokens=10, drafts=4, workload=workload))  # fmt: skip
    return list(book.pairs[("c", workload)])


def test_a_summary_says_how_much_faster_with_its_interval_and_how_many_pairs_were_lossless() -> None:
    s = summarize_pairs(
        "mtp3", "code", _pairs(40, 1.3, text="the same reply, word for word, as the model would say it")
    )
    assert s["pairs"] == 40 and s["verdict"] == "faster"
    lo, hi = s["speedup"]["ci"]
    assert lo <= s["speedup"]["median"] <= hi and 1.28 < s["speedup"]["median"] < 1.36
    assert s["acceptance"]["value"] == pytest.approx(0.6) and s["mean_acceptance_length"] == pytest.approx(2.5)
    assert s["lossless"] == {"greedy_pairs": 40, "identical": 40, "tail": 0, "diverged": 0, "lossless": 40,
                             "median_parted_at_char": None, "verdict": "lossless"}  # fmt: skip
    assert s["says"].startswith("mtp3 would be 1.3") and "faster for code" in s["says"]
    assert "lossless on 40 of 40 greedy pairs" in s["says"]
    slower = summarize_pairs("k5", "code", _pairs(40, 0.8))
    assert slower["verdict"] == "slower" and "no greedy pairs" in slower["says"]
    assert set(summarize({("c", "code"): _pairs(5, 1.0), ("c", "chat"): []})) == {"c"}


def test_a_drafter_that_changes_the_text_is_not_lossless_but_a_few_near_ties_are() -> None:
    broken = summarize_pairs("bad", "code", _pairs(20, 1.2, text="garbled from the start"))
    assert broken["lossless"]["verdict"] == "not lossless" and broken["lossless"]["diverged"] == 20
    assert "NOT LOSSLESS" in broken["says"]
    same = "the same reply, word for word, as the model would say it"
    few = _pairs(20, 1.2, text=same)
    for i in range(6):  # near-ties flipped by floating point part some pairs, anywhere: not a broken drafter
        few[i] = type(few[i])(
            **{**{f: getattr(few[i], f) for f in few[i].__slots__}, "text": "diverged", "parted_at": 3}
        )
    assert lossless(few)["verdict"] == "lossless" and lossless(few)["diverged"] == 6


def test_the_guard_trips_when_live_requests_beside_shadows_are_slower() -> None:
    g = Guard()
    for _ in range(Guard.MIN_EACH):
        g.observe("code", 0.010, beside_shadows=False)
        g.observe("code", 0.0105, beside_shadows=True)
    assert g.tripped() is None and g.ratios()["code"] == pytest.approx(1.05)
    for _ in range(Guard.WINDOW):
        g.observe("code", 0.013, beside_shadows=True)
    assert g.tripped() is not None and "1.30x" in str(g.tripped())
    g.reset()
    assert g.ratios() == {} and g.tripped() is None
    g.observe("code", None, beside_shadows=True)  # no figure: nothing learnt
    assert g.ratios() == {}


def test_one_pair_says_its_speedup_without_an_interval() -> None:
    s = summarize_pairs("c", "code", _pairs(1, 1.5))
    assert s["verdict"] == "-" and "too few pairs for an interval" in s["says"] and "1.5" in s["says"]
