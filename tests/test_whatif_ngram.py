"""vLLM's ngram proposer replayed on hand-made token ids, and against a brute-force reading of its documented rule
(vLLM's own function: tests/test_whatif_ngram_vllm.py)."""

from __future__ import annotations

import random

import pytest

from specproxy.whatif.ngram import Replay, propose, replay


def test_the_longest_suffix_ngram_wins_and_a_tie_takes_the_earliest() -> None:
    # suffix [1, 2]: found at 0 and at 4; the earliest (0) is used, so the draft is what followed it there
    assert propose([1, 2, 7, 8, 1, 2, 9, 1, 2], 2, 4, 2, 100) == [7, 8]
    # suffix [5, 1, 2] (3 long) beats the 2-long matches
    assert propose([1, 2, 7, 5, 1, 2, 8, 5, 1, 2], 2, 4, 1, 100) == [8]


def test_no_draft_below_min_n_and_fewer_near_the_end_or_max_model_len() -> None:
    assert propose([3], 2, 4, 3, 100) == []
    assert propose([1, 2, 3, 4], 2, 4, 3, 100) == []  # no repeated suffix
    assert propose([1, 2, 9, 1, 2], 2, 4, 3, 100) == [9, 1, 2]
    assert propose([1, 2, 9, 1, 2], 2, 4, 3, 7) == [9, 1]  # k capped at max_model_len - len(context)
    assert propose([1, 2, 1, 2], 2, 4, 3, 100) == [1, 2]  # only what follows the match


def test_replay_counts_like_vllm_counters() -> None:
    r = replay([1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 9], 3, 2, 4, 100)
    # prefill brings 1; a step with no match brings 2 and counts nothing; then [3, 4, 5] all accepted
    assert (r.drafts, r.draft_tokens, r.accepted, r.per_position, r.decode_steps) == (1, 3, 3, [1, 1, 1], 2)
    assert r.tail_open == 0
    r = replay([1, 2, 3, 4, 5], [1, 2, 3], 3, 2, 4, 100)
    assert (r.accepted, r.tail_open) == (1, 2)  # drafts past the recorded end: open


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        replay([1], [1], 0, 2, 4, 100)


def _by_the_rule(ctx: list[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """The module's docstring read literally: the longest suffix n-gram in [min_n, max_n] that occurs earlier (not the
    suffix itself, overlapping it allowed), its earliest occurrence, then up to k tokens after it."""
    total = len(ctx)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = ctx[total - n :]
        for s in range(total - n):
            if ctx[s : s + n] == suffix:
                return ctx[s + n : s + n + k]
    return []


def test_propose_agrees_with_the_rule_on_random_contexts() -> None:
    rng = random.Random(23)
    for _ in range(3000):
        n = rng.randint(0, 40)
        alphabet = rng.choice([1, 2, 3, 5])
        ctx = [rng.randint(0, alphabet) for _ in range(n)]
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 6)
        k = rng.randint(1, 6)
        mml = rng.randint(max(1, n - 2), n + 8)
        assert propose(ctx, min_n, max_n, k, mml) == _by_the_rule(ctx, min_n, max_n, k, mml), (ctx, min_n, max_n, k)


def test_a_match_may_overlap_the_suffix_but_not_be_it() -> None:
    # [7, 7, 7]: the suffix [7, 7] occurs at 0 (overlapping the suffix at 1): what follows it is the last 7
    assert propose([7, 7, 7], 2, 2, 3, 100) == [7]
    # a context that is only its own suffix has nothing earlier to match
    assert propose([4, 5], 2, 2, 3, 100) == []
    assert propose([4, 4], 1, 1, 3, 100) == [4]


def test_max_n_caps_the_match_and_then_the_earliest_occurrence_of_the_capped_suffix_wins() -> None:
    # suffix [1, 2, 3] occurs at 0 (followed by 8) and at 5 with one more matching token before it (0, 1, 2, 3 → 9);
    # with max_n = 3 both are 3 long, so the earliest (0) wins; with max_n = 4 the 4-long one at 5 wins
    ctx = [1, 2, 3, 8, 0, 1, 2, 3, 9, 0, 1, 2, 3]
    assert propose(ctx, 1, 3, 1, 100) == [8]
    assert propose(ctx, 1, 4, 1, 100) == [9]


def test_min_n_refuses_shorter_matches() -> None:
    ctx = [1, 2, 5, 6, 2]  # only the 1-long suffix [2] repeats
    assert propose(ctx, 1, 3, 2, 100) == [5, 6]
    assert propose(ctx, 2, 3, 2, 100) == []


def test_max_model_len_reached_means_no_draft() -> None:
    assert propose([1, 2, 9, 1, 2], 2, 4, 3, 5) == []
    assert propose([1, 2, 9, 1, 2], 2, 4, 3, 4) == []


def test_a_step_without_a_draft_counts_nothing_and_brings_one_token() -> None:
    r = replay([10, 11, 12], [20, 21, 22, 23], 3, 2, 4, 100)  # never a repeated suffix
    assert r == Replay(3, per_position=[0, 0, 0], decode_steps=3)


def test_a_rejected_first_draft_token_still_brings_one_token() -> None:
    # prompt [1, 2, 9, 1] and the prefill's 2 → draft [9, 1, 2]; the output goes on with 5: nothing accepted, and
    # the step brings the 5
    r = replay([1, 2, 9, 1], [2, 5], 3, 2, 4, 100)
    assert r == Replay(3, drafts=1, draft_tokens=3, per_position=[0, 0, 0], decode_steps=1)


def test_a_partly_accepted_draft_counts_its_prefix_per_position() -> None:
    # draft [9, 1, 2]; the output goes 9, 1, 7: two accepted, the step brings three tokens (9, 1, 7)
    r = replay([1, 2, 9, 1], [2, 9, 1, 7], 3, 2, 4, 100)
    assert (r.drafts, r.draft_tokens, r.accepted, r.per_position, r.decode_steps) == (1, 3, 2, [1, 1, 0], 1)


def test_the_proposer_skips_a_request_at_max_model_len() -> None:
    # the context reaches max_model_len = 6 after the first step: the later steps draft nothing
    r = replay([1, 2, 9, 1], [2, 8, 1, 2, 9], 3, 2, 4, 6)
    assert r.drafts == 1 and r.decode_steps == 4
    # capped by max_model_len - len(context) = 1 token, not k = 3
    assert r.draft_tokens == 1


def test_replay_invariants_hold_on_random_requests() -> None:
    rng = random.Random(5)
    for _ in range(400):
        prompt = [rng.randint(0, 3) for _ in range(rng.randint(0, 20))]
        output = [rng.randint(0, 3) for _ in range(rng.randint(0, 30))]
        k = rng.randint(1, 5)
        r = replay(prompt, output, k, 1, 3, 1000)
        assert r.accepted == sum(r.per_position)
        assert all(a >= b for a, b in zip(r.per_position, r.per_position[1:], strict=False))
        assert r.draft_tokens <= r.drafts * k and r.accepted + r.tail_open <= r.draft_tokens
        # every output token after the first comes from a decode step: accepted ones plus one per step, except
        # that the last step brings fewer when its accepted drafts reach the end
        assert r.decode_steps <= max(0, len(output) - 1) <= r.decode_steps + r.accepted


def test_an_empty_output_is_no_steps() -> None:
    r = replay([1, 2, 3], [], 2, 1, 2, 100)
    assert (r.drafts, r.decode_steps, r.per_position) == (0, 0, [0, 0])


def test_add_sums_and_widens_per_position() -> None:
    a = Replay(2, drafts=1, draft_tokens=2, accepted=1, per_position=[1, 0], decode_steps=3, tail_open=1)
    b = Replay(3, drafts=2, draft_tokens=5, accepted=4, per_position=[2, 1, 1], decode_steps=4, tail_open=0)
    a.add(b)
    assert a == Replay(2, drafts=3, draft_tokens=7, accepted=5, per_position=[3, 1, 1], decode_steps=7, tail_open=1)


@pytest.mark.parametrize(("k", "min_n", "max_n"), [(0, 2, 4), (3, 0, 4), (3, 4, 2)])
def test_every_bad_setting_is_refused_with_the_values(k: int, min_n: int, max_n: int) -> None:
    with pytest.raises(ValueError, match=f"k={k}, min_n={min_n}, max_n={max_n}"):
        replay([1], [1, 2], k, min_n, max_n, 100)
