"""specproxy.attribution.intervals: cutting chunks into scrape intervals and sharing one interval's delta."""

from __future__ import annotations

from collections import deque

import pytest

from specproxy.attribution.counts import SpecCounts
from specproxy.attribution.intervals import (
    LATE_STEPS,
    Activity,
    Chunk,
    DraftWeights,
    Evidence,
    Interval,
    cut,
    fill,
    step_quota,
    unmerge,
)

MS = 10**6


# -- the cut by decode steps ---------------------------------------------------------------------------------------
def test_quota_is_the_engine_step_count_plus_what_was_owed() -> None:
    assert step_quota(10, owed=0, available=12, in_flight=3) == (10, 0)
    assert step_quota(10, owed=2, available=12, in_flight=3) == (12, 0)


def test_quota_owes_missing_chunks_still_in_transit() -> None:
    # the engine counted 11 steps, only 9 chunks are here, 3 streams in flight: 2 chunks may still be on their way
    assert step_quota(10, owed=1, available=9, in_flight=3) == (9, 2)
    assert step_quota(3, owed=0, available=2, in_flight=0) == (2, 1)  # at least one, even after the last ended
    # a reader several steps behind each of its streams (a busy host): LATE_STEPS a stream may be owed
    assert step_quota(10, owed=0, available=2, in_flight=3) == (2, 8)
    assert step_quota(LATE_STEPS * 3, owed=0, available=0, in_flight=3) == (0, LATE_STEPS * 3)


def test_quota_falls_back_to_time_when_our_streams_cannot_explain_the_steps() -> None:
    # another client uses the engine: more missing than our streams in flight can be behind by
    assert step_quota(LATE_STEPS * 3 + 3, owed=0, available=2, in_flight=3) == (None, 0)
    assert step_quota(3, owed=0, available=1, in_flight=0) == (None, 0)  # every stream's end was read
    assert step_quota(None, owed=2, available=5, in_flight=1) == (None, 2)  # no step count: keep what is owed


def _chunks(*spec: tuple[int, str, int, bool]) -> deque[Chunk]:
    return deque(Chunk(t * MS, rid, n, decode, True) for t, rid, n, decode in spec)


def test_cut_by_quota_takes_decode_steps_whatever_their_time() -> None:
    q = _chunks((1, "a", 1, False), (2, "a", 3, True), (3, "b", 1, False), (4, "b", 2, True), (9, "a", 1, True))
    got = cut(q, boundary_ns=0, quota=2)  # a boundary before everything: the quota decides
    assert set(got) == {"a", "b"}
    assert (got["a"].steps, got["a"].tokens, got["b"].steps, got["b"].tokens) == (1, 3, 1, 2)
    assert [c.t_ns for c in q] == [9 * MS]  # the third decode step waits for the next interval


def test_cut_by_time() -> None:
    q = _chunks((1, "a", 2, True), (5, "a", 1, True), (6, "a", 4, True))
    got = cut(q, boundary_ns=5 * MS, quota=None)
    assert got["a"].steps == 2 and got["a"].tokens == 3 and len(q) == 1


def test_activity_counts_positions_from_chunk_sizes() -> None:
    a = Activity()
    a.add(1, decode=False, exact=True)  # prefill: no step
    a.add(3, decode=True, exact=True)  # accepted positions 0 and 1
    a.add(2, decode=True, exact=True)  # position 0
    a.add(1, decode=True, exact=True)  # nothing accepted
    assert (a.steps, a.tokens, a.multi, a.per_position) == (3, 6, 2, [2.0, 1.0])
    assert a.extra_tokens == 3 and a.known_drafted == 2 and a.position(5) == 0
    a.add(1, decode=True, exact=False)
    assert not a.exact and a.known_drafted == 0  # text-counted sizes prove nothing


# -- shares of accepted tokens ---------------------------------------------------------------------------------------
def _act(steps: float, tokens: float, *, exact: bool, pos: list[float] | None = None, multi: float = 0) -> Activity:
    return Activity(steps=steps, tokens=tokens, exact=exact, per_position=pos or [], multi=multi)


def test_exact_members_take_tokens_minus_steps_and_their_positions() -> None:
    iv = Interval(
        SpecCounts(accepted=7, drafts=8, draft_tokens=24, per_position=(5.0, 2.0, 0.0)),
        {"a": _act(5, 9, exact=True, pos=[3, 1]), "b": _act(3, 6, exact=True, pos=[2, 1])},
        {"a": "code", "b": "ja"},
    )
    assert iv.accepted_share("a", {}) == (4, [3, 1, 0])
    assert iv.accepted_share("b", {}) == (3, [2, 1, 0])
    assert not iv.shared and iv.overlapped and not iv.needs_model and iv.acceptance_observation() is None


def test_inexact_members_share_the_rest_between_workloads_by_the_model() -> None:
    members = {"e": _act(4, 6, exact=True), "j": _act(10, 14, exact=False), "c": _act(10, 25, exact=False)}
    iv = Interval(SpecCounts(accepted=2 + 30, drafts=24, draft_tokens=72), members, {"e": "x", "j": "ja", "c": "code"})
    # what the exact member does not explain (30) goes 5 : 10 by the model (0.5 and 1.0 accepted per step)
    coef = {"ja": (0.5, 0.0), "code": (1.0, 0.0)}
    assert iv.accepted_share("e", coef)[0] == 2
    assert iv.accepted_share("j", coef)[0] == pytest.approx(10)
    assert iv.accepted_share("c", coef)[0] == pytest.approx(20)
    assert iv.needs_model and iv.shared
    assert iv.acceptance_observation() == ({"ja": (10, 14), "code": (10, 25)}, 30)
    # without a model, by steps
    assert iv.accepted_share("j", {})[0] == pytest.approx(15)


def test_within_a_workload_by_text_beyond_one_token_per_step() -> None:
    members = {"a": _act(5, 11, exact=False), "b": _act(5, 7, exact=False)}  # 6 and 2 tokens beyond the steps
    iv = Interval(SpecCounts(accepted=12, drafts=10, draft_tokens=30, per_position=(8.0, 4.0)), members,
                  {"a": "ja", "b": "ja"})  # fmt: skip
    acc, pos = iv.accepted_share("a", {"ja": (0.8, 0.1)})
    assert acc == pytest.approx(9) and pos == pytest.approx([6, 3])
    assert iv.accepted_share("b", {"ja": (0.8, 0.1)})[0] == pytest.approx(3)


def test_a_request_cut_by_max_tokens_takes_the_unemitted_tail_up_to_k() -> None:
    # alone and exact, chunks show 3 accepted; the engine counted 5: the last step's accepted drafts never came out
    delta = SpecCounts(accepted=5, drafts=4, draft_tokens=12, per_position=(3.0, 1.0, 1.0))
    iv = Interval(delta, {"a": _act(4, 7, exact=True, pos=[2, 1])}, {"a": "code"}, truncated={"a"})
    acc, pos = iv.accepted_share("a", {})
    assert acc == 5 and pos == pytest.approx([3, 1, 1])
    iv = Interval(SpecCounts(accepted=9, drafts=4, draft_tokens=12, per_position=(3.0, 3.0, 3.0)),
                  {"a": _act(4, 7, exact=True, pos=[2, 1])}, {"a": "code"}, truncated={"a"})  # fmt: skip
    assert iv.accepted_share("a", {})[0] == 6  # 3 + at most k = 3
    iv.truncated.clear()
    assert iv.accepted_share("a", {})[0] == 3  # not cut: the rest is not its


def test_foreign_steps_keep_only_our_part_of_the_rest() -> None:
    iv = Interval(SpecCounts(accepted=20, drafts=20, draft_tokens=60), {"a": _act(10, 25, exact=False)}, {"a": "ja"},
                  foreign_steps=10)  # fmt: skip
    assert iv.accepted_share("a", {})[0] == pytest.approx(10)
    assert iv.shared and iv.overlapped


def test_nothing_left_for_inexact_members() -> None:
    members = {"e": _act(4, 10, exact=True), "i": _act(4, 8, exact=False)}
    iv = Interval(SpecCounts(accepted=5, drafts=8, draft_tokens=24, per_position=(5.0,)), members, {})
    assert iv.accepted_share("i", {}) == (0.0, [0.0])


# -- shares of drafts ----------------------------------------------------------------------------------------------
def test_drafts_follow_steps_when_every_step_drafts() -> None:
    members = {"a": _act(6, 12, exact=True), "b": _act(2, 2, exact=True)}
    iv = Interval(SpecCounts(accepted=6, drafts=10, draft_tokens=30), members, {}, foreign_steps=2)
    assert iv.draft_share("a", None, partial=False) == pytest.approx((6, 18))
    assert iv.draft_share("b", None, partial=False) == pytest.approx((2, 6))


def _weights(
    accept: dict[str, float], multi: dict[str, float], inexact: dict[str, float] | None = None
) -> DraftWeights:
    return DraftWeights(first_accept=accept, inexact_rate=inexact or {}, workload_multi=multi)


def test_partial_drafting_uses_known_drafts_then_weighted_one_token_steps() -> None:
    # ngram: "a" had 3 multi-token steps (certainly drafted) of 6; "b" 0 of 4. 7 drafts: 4 remain for 3 + 4 one-token
    # steps, each weighted by its chance of having drafted, here its workload's (no evidence of its own): "a"'s (f 0.3,
    # a 0.5) 0.3 / 0.7, "b"'s (f 0.1, a 0.5) 0.1 / 0.9
    members = {"a": _act(6, 10, exact=True, multi=3), "b": _act(4, 4, exact=True)}
    iv = Interval(SpecCounts(accepted=4, drafts=7, draft_tokens=14), members, {"a": "code", "b": "ja"})
    weights = _weights({"code": 0.5, "ja": 0.5}, {"code": 0.3, "ja": 0.1})
    a_drafts, a_tokens = iv.draft_share("a", weights, partial=True)
    b_drafts, _ = iv.draft_share("b", weights, partial=True)
    wa, wb = 3 * 0.3 / 0.7, 4 * 0.1 / 0.9
    assert a_drafts == pytest.approx(3 + 4 * wa / (wa + wb)) and b_drafts == pytest.approx(4 * wb / (wa + wb))
    assert a_tokens == pytest.approx(2 * a_drafts)
    # without weights, one-token steps alike
    plain = Interval(iv.delta, members, iv.workloads)
    assert plain.draft_share("b", None, partial=True)[0] == pytest.approx(4 * 4 / 7)
    hidden, steps, rows = iv.draft_observation()  # type: ignore[misc]
    assert (hidden, steps) == (4, 10) and sorted((w, u) for w, u, _ in rows) == [("code", 3), ("ja", 4)]


def test_a_requests_hidden_rate_follows_its_share_of_multi_token_steps_and_the_first_position_acceptance() -> None:
    # drafting on a share p of its steps, a request brings several tokens on f = p a of them (a: the first draft
    # accepted); of its one-token steps, p (1 - a) / (1 - f) drafted. Seen on the real CPU vLLM (ngram k = 3, a = 0.64
    # for both workloads): a reply drafting on 13 % of its steps, and one on 90 %
    for p, a in ((0.13, 0.64), (0.9, 0.64), (0.5, 0.3), (1.0, 0.5)):
        steps = 1_000_000.0  # enough that the workload's prior does not count
        q = Evidence(steps=steps, multi=p * a * steps).hidden_rate(0.5, a)
        assert q == pytest.approx(p * (1 - a) / (1 - p * a), abs=1e-4), (p, a)
    often, rarely = Evidence(steps=40, multi=30), Evidence(steps=40, multi=4)
    assert often.hidden_rate(0.4, 0.8) > rarely.hidden_rate(0.4, 0.8)  # type: ignore[operator]
    assert Evidence().hidden_rate(0.4, 0.8) == pytest.approx(0.4 / 0.6 * 0.2 / 0.8)  # no steps: its workload's
    assert Evidence(steps=40, multi=36).hidden_rate(0.4, 0.8) == 1.0  # several tokens more often than a: every step
    assert Evidence(steps=40, multi=30, exact=False).hidden_rate(0.4, 0.8) is None  # inexact: no multi steps to see
    assert often.hidden_rate(None, 0.8) is None and often.hidden_rate(0.4, None) is None
    assert often.hidden_rate(0.4, 0.0) is None


def test_within_a_workload_rejected_drafts_go_to_the_request_that_drafts_more() -> None:
    # two code requests, 10 one-token steps each here; "a" has brought several tokens on most of its steps so far,
    # "b" on few. 6 drafts beyond the known ones go mostly to "a", in proportion to their hidden rates; without
    # evidence, half each
    members = {"a": _act(10, 10, exact=True), "b": _act(10, 10, exact=True)}
    iv = Interval(SpecCounts(accepted=0, drafts=6, draft_tokens=18), members, {"a": "code", "b": "code"})
    weights = _weights({"code": 0.8}, {"code": 0.4})
    assert iv.draft_share("a", weights, True)[0] == pytest.approx(3)
    fresh = Interval(iv.delta, members, iv.workloads)
    fresh.evidence.update(a=Evidence(steps=60, multi=40), b=Evidence(steps=60, multi=6))
    a, b = (fresh.draft_share(m, weights, True)[0] for m in ("a", "b"))
    qa, qb = fresh.evidence["a"].hidden_rate(0.4, 0.8), fresh.evidence["b"].hidden_rate(0.4, 0.8)
    assert a + b == pytest.approx(6) and a / b == pytest.approx(qa / qb) and a > 4 * b  # type: ignore[operator]


def test_between_workloads_the_one_that_accepts_fewer_first_drafts_hides_more() -> None:
    # the same share of multi-token steps (0.3) in both workloads: code accepts its first draft 3 times in 4, ja 1
    # in 4. So ja drafts far more often (p = 1.2 is every step) and most of its drafts are hidden in one-token steps
    members = {"a": _act(10, 10, exact=True), "c": _act(10, 10, exact=True)}
    iv = Interval(SpecCounts(accepted=0, drafts=8, draft_tokens=24), members, {"a": "code", "c": "ja"})
    weights = _weights({"code": 0.75, "ja": 0.25}, {"code": 0.3, "ja": 0.3})
    a, c = iv.draft_share("a", weights, True)[0], iv.draft_share("c", weights, True)[0]
    q_code = 0.3 / 0.7 * 0.25 / 0.75  # 0.143 of code's one-token steps drafted; every one of ja's
    assert a == pytest.approx(8 * q_code / (q_code + 1.0)) and a + c == pytest.approx(8)


def test_inexact_members_draft_at_their_workloads_rate_per_step() -> None:
    members = {"e": _act(10, 10, exact=True), "i": _act(10, 14, exact=False)}
    iv = Interval(SpecCounts(accepted=4, drafts=6, draft_tokens=18), members, {"e": "code", "i": "code"})
    weights = _weights({"code": 0.5}, {"code": 0.2}, inexact={"code": 0.5})
    q = 0.2 / 0.8  # the exact member's one-token steps at a = 0.5
    assert iv.draft_share("i", weights, True)[0] == pytest.approx(6 * 0.5 / (0.5 + q))
    _, _, rows = iv.draft_observation()  # type: ignore[misc]
    assert [ev.exact for _, _, ev in sorted(rows, key=lambda r: r[1])] == [True, False]


def test_a_lone_partial_drafter_takes_every_draft() -> None:
    iv = Interval(SpecCounts(accepted=2, drafts=3, draft_tokens=9), {"a": _act(6, 8, exact=True, multi=2)}, {})
    assert iv.draft_share("a", _weights({"": 0.9}, {"": 0.1}), partial=True) == pytest.approx((3, 9))
    assert Interval(SpecCounts(), {"a": _act(1, 1, exact=True)}, {}).draft_observation() is None


def test_an_interval_with_foreign_steps_still_teaches_the_drafting_model() -> None:
    # cut by time with steps our chunks do not show: mostly our own chunks read late on a busy host
    members = {"a": _act(10, 12, exact=True, multi=2)}
    hidden, steps, rows = Interval(
        SpecCounts(drafts=6, draft_tokens=18), members, {}, foreign_steps=5
    ).draft_observation()  # type: ignore[misc]
    assert (hidden, steps, [(w, u) for w, u, _ in rows]) == (4, 10, [("", 8)])


def test_shares_computed_once_per_model_state_equal_those_computed_each_time() -> None:
    """A member's share is a lookup in what the interval computed for the models' state (``version``): the same
    figures as computing everything for each member, cut members and foreign steps included, and computed anew when
    the state moves on."""

    def interval() -> Interval:
        members = {
            "e1": _act(5, 9, exact=True, pos=[3, 1], multi=3),
            "e2": _act(4, 4, exact=True),
            "i1": _act(6, 10, exact=False),
            "i2": _act(3, 7, exact=False),
        }
        iv = Interval(
            SpecCounts(accepted=14, drafts=12, draft_tokens=30, per_position=(8.0, 4.0, 2.0)),
            members,
            {"e1": "code", "e2": "ja", "i1": "code", "i2": "ja"},
            foreign_steps=2,
        )
        iv.evidence.update(e1=Evidence(steps=30, multi=20), e2=Evidence(steps=30, multi=3))
        iv.truncated.add("e2")
        return iv

    weights = _weights({"code": 0.7, "ja": 0.4}, {"code": 0.5, "ja": 0.2}, inexact={"code": 0.3, "ja": 0.6})
    coef = {"code": (0.9, 0.1), "ja": (0.3, 0.05)}
    fresh, cached = interval(), interval()
    for m in ("e1", "e2", "i1", "i2"):
        assert cached.draft_share(m, weights, True, 1) == pytest.approx(fresh.draft_share(m, weights, True))
        assert cached.accepted_share(m, coef, 1) == fresh.accepted_share(m, coef)
    other = {"code": (0.1, 0.0), "ja": (2.0, 0.0)}
    assert cached.accepted_share("i1", other, 1) == cached.accepted_share("i1", coef, 1)  # the same state: kept
    assert cached.accepted_share("i1", other, 2) == fresh.accepted_share("i1", other)  # moved on
    assert cached.accepted_share("i1", other, 2) != cached.accepted_share("i1", coef, None)


def test_fill_shares_by_weight_and_gives_what_a_capped_member_cannot_take_to_the_others() -> None:
    assert fill(6, {"a": 1, "b": 2}, {"a": 10, "b": 10}) == pytest.approx({"a": 2, "b": 4})
    # "b" would take 8 of 12 but has room for 5: the 7 left go to "a" and "c" by their weights
    out = fill(12, {"a": 1, "b": 4, "c": 1}, {"a": 10, "b": 5, "c": 10})
    assert out == pytest.approx({"a": 3.5, "b": 5, "c": 3.5})
    # more than every cap: each at its cap, the rest cannot be placed; no weight, nothing
    assert fill(30, {"a": 1, "b": 1}, {"a": 4, "b": 6}) == pytest.approx({"a": 4, "b": 6})
    assert fill(5, {"a": 0, "b": 1}, {"a": 4, "b": 6}) == pytest.approx({"a": 0, "b": 5})
    assert fill(0, {"a": 1}, {"a": 4}) == {"a": 0}


def test_hidden_drafts_beyond_a_members_one_token_steps_go_to_the_others() -> None:
    # "a" weighs far more than "b" but has 2 one-token steps: it takes 2 and "b" the other 4, none lost
    members = {"a": _act(2, 2, exact=True), "b": _act(10, 10, exact=True)}
    iv = Interval(SpecCounts(accepted=0, drafts=6, draft_tokens=18), members, {"a": "ja", "b": "code"})
    weights = _weights({"code": 0.75, "ja": 0.25}, {"code": 0.05, "ja": 0.3})
    a, b = iv.draft_share("a", weights, True)[0], iv.draft_share("b", weights, True)[0]
    assert a == pytest.approx(2) and b == pytest.approx(4)


def test_members_that_end_under_different_models_still_take_the_whole_delta() -> None:
    # "a" ends while the drafting model favours code, "b" and "c" after it moved to favour ja: each share is computed
    # with the model of its own moment, and yet the three add up to the delta, since each later member shares what
    # the ones before left
    members = {"a": _act(8, 8, exact=True), "b": _act(8, 8, exact=True), "c": _act(8, 8, exact=True)}
    workloads = {"a": "code", "b": "ja", "c": "ja"}
    iv = Interval(SpecCounts(accepted=0, drafts=9, draft_tokens=27), members, workloads)
    before = _weights({"code": 0.5, "ja": 0.5}, {"code": 0.6, "ja": 0.1})
    after = _weights({"code": 0.5, "ja": 0.5}, {"code": 0.1, "ja": 0.6})
    a = iv.draft_share("a", before, True, version=1, take=True)[0]
    peeked = iv.draft_share("b", after, True, version=2)[0]  # a look that takes nothing
    b = iv.draft_share("b", after, True, version=2, take=True)[0]
    c = iv.draft_share("c", after, True, version=2, take=True)[0]
    assert a > 4.5 and peeked == pytest.approx(b) and b == pytest.approx(c)
    assert a + b + c == pytest.approx(9)
    # computed each with its own model and nothing taken, the shares over-count the delta
    fresh = Interval(iv.delta, members, workloads)
    untaken = fresh.draft_share("a", before, True, version=1)[0] + 2 * fresh.draft_share("b", after, True, version=2)[0]
    assert untaken > 9.5


def test_inexact_members_that_end_under_different_models_take_the_whole_remainder() -> None:
    # "j" ends while the model says ja accepts little, "c" after it moved: each share is computed with the model of
    # its moment, and the two still add up to what the exact member leaves, per position too
    members = {"e": _act(4, 6, exact=True, pos=[2]), "j": _act(10, 14, exact=False), "c": _act(10, 25, exact=False)}
    delta = SpecCounts(accepted=32, drafts=24, draft_tokens=24, per_position=(32.0,))
    workloads = {"e": "x", "j": "ja", "c": "code"}
    iv = Interval(delta, members, workloads)
    before, after = {"ja": (0.5, 0.0), "code": (1.0, 0.0)}, {"ja": (1.0, 0.0), "code": (0.5, 0.0)}
    exact = iv.accepted_share("e", after, version=2, take=True)
    j, j_pos = iv.accepted_share("j", before, version=1, take=True)
    peeked = iv.accepted_share("c", after, version=2)[0]  # a look takes nothing
    c, c_pos = iv.accepted_share("c", after, version=2, take=True)
    assert exact == (2, [2]) and j == pytest.approx(10) and peeked == pytest.approx(c)
    assert j + c == pytest.approx(30) and j_pos[0] + c_pos[0] == pytest.approx(30)
    # computed each with its own model and nothing taken, the shares miss a third of the remainder
    fresh = Interval(delta, members, workloads)
    assert fresh.accepted_share("j", before, 1)[0] + fresh.accepted_share("c", after, 2)[0] == pytest.approx(20)


def test_once_the_inexact_members_took_theirs_a_max_tokens_cut_takes_no_tail() -> None:
    # the remainder belonged to the inexact member: an exact member cut by max_tokens asking after it does not get it
    members = {"e": _act(4, 6, exact=True, pos=[2]), "j": _act(10, 14, exact=False)}
    delta = SpecCounts(accepted=8, drafts=14, draft_tokens=14, per_position=(8.0,))
    iv = Interval(delta, members, {"e": "x", "j": "ja"}, truncated={"e"})
    assert iv.accepted_share("j", {}, version=1, take=True)[0] == pytest.approx(6)
    assert iv.accepted_share("e", {}, version=2, take=True)[0] == 2


def test_more_steps_known_to_have_drafted_than_the_delta_counted_shrink_to_it() -> None:
    # a busy reader stamped some chunks late: 6 multi-token steps fell in an interval whose delta counted 4 drafts
    members = {"a": _act(6, 12, exact=True, multi=4), "b": _act(4, 6, exact=True, multi=2)}
    iv = Interval(SpecCounts(accepted=8, drafts=4, draft_tokens=12), members, {"a": "code", "b": "ja"})
    weights = _weights({"code": 0.5, "ja": 0.5}, {"code": 0.3, "ja": 0.3})
    a, b = (iv.draft_share(m, weights, True, version=1, take=True)[0] for m in ("a", "b"))
    assert a == pytest.approx(4 * 4 / 6) and b == pytest.approx(4 * 2 / 6) and a + b == pytest.approx(4)


# -- chunks that carry several steps ---------------------------------------------------------------------------------
def test_steps_merged_into_chunks_go_back_to_steps_and_the_accepted_tokens_add_up_to_the_delta() -> None:
    """Two requests, the engine merging steps: "a" stepped 6 times accepting 2 tokens, "b" 6 times accepting 4;
    a lagging HTTP task sent each two steps as one chunk. Read as steps, the chunks say 9 and 12 accepted, against
    the engine's 6; put back, by chunks, the accepted tokens add up to the delta and each member's steps to the
    engine's count."""
    a, b = Activity(), Activity()
    for n in (3, 3, 2):  # 8 tokens: 6 steps + 2 accepted, in 3 chunks
        a.add(n, decode=True, exact=True)
    for n in (4, 3, 3):  # 10 tokens: 6 steps + 4 accepted
        b.add(n, decode=True, exact=True)
    members = {"a": a, "b": b}
    delta = SpecCounts(6.0, 6.0, 18.0, (4.0, 2.0, 0.0))
    parts = unmerge(members, delta)
    assert sum(parts.values()) == pytest.approx(6.0)  # 18 tokens, 6 chunks, 6 accepted: 6 steps merged
    assert a.steps + b.steps == pytest.approx(12.0)
    assert a.extra_tokens + b.extra_tokens == pytest.approx(delta.accepted)
    assert a.extra_tokens == pytest.approx(2.0) and b.extra_tokens == pytest.approx(4.0)
    # what chunk sizes said of positions and multi-token steps falls with the accepted tokens
    assert a.multi == pytest.approx(3 * 2 / 5) and a.position(0) == pytest.approx(3 * 2 / 5)
    iv = Interval(delta, members, {"a": "w", "b": "w"})
    assert sum(iv.draft_share(m, None, False)[0] for m in members) == pytest.approx(6.0)
    assert iv.draft_share("a", None, False)[0] == pytest.approx(3.0)  # every step drafts: drafts follow steps


def test_unmerge_takes_no_more_than_a_members_tokens_beyond_one_per_chunk() -> None:
    a, b = Activity(), Activity()
    for n in (1, 1, 1):
        a.add(n, decode=True, exact=True)  # nothing beyond one per chunk: nothing of it can be merged
    for n in (4, 4):
        b.add(n, decode=True, exact=True)
    parts = unmerge({"a": a, "b": b}, SpecCounts(2.0, 2.0, 6.0))
    assert parts == {"b": pytest.approx(4.0)}  # 6 tokens beyond one per chunk, 2 accepted
    assert a.steps == 3 and b.steps == pytest.approx(6.0) and b.extra_tokens == pytest.approx(2.0)
    counted_more = Activity()
    counted_more.add(3, decode=True, exact=True)  # the engine counted more accepted tokens than the chunk shows
    assert unmerge({"n": counted_more}, SpecCounts(3.0, 1.0, 3.0)) == {}
    assert counted_more.steps == 1 and counted_more.extra_tokens == 2
