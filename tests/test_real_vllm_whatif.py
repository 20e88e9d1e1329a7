"""whatif against the real CPU vLLM: a base engine (no speculation) recorded with --capture full, then the ngram
k = 3 engine on the same greedy prompts; the engine's own acceptance lies in whatif's interval (the lower bound, and
the upper one that counts the last steps' drafts past the recorded end as accepted), give or take 0.02."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import RealEngine
from tests.proxyutil import proxy_process

pytestmark = [pytest.mark.realvllm, pytest.mark.slow, pytest.mark.timeout(420, func_only=True)]

MODEL_DIR = Path.home() / ".cache/specproxy/vllm-cpu/model"
PROMPTS = [
    "Repeat this Python code exactly, with no explanation:\n```python\ndef mean(values):\n"
    "    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n```",
    "Repeat this list exactly: apple, banana, cherry, apple, banana, cherry.",
    "Write a short story about a cat who learns to read.",
]


def _body(prompt: str) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "max_tokens": 96,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


async def _figures(s: aiohttp.ClientSession, url: str, body: dict[str, object]) -> dict[str, int]:
    last: dict[str, object] = {}
    async with s.post(url + "/v1/chat/completions", json=body, headers={"X-Specproxy-Workload": "w"}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {"):
                last = json.loads(line[6:])
    metrics = last.get("metrics")
    return dict(metrics["speculative_decoding"]) if isinstance(metrics, dict) else {}


async def test_whatif_predicts_the_ngram_engines_acceptance(
    vllm_cpu_layout: object, ngram_engine: RealEngine, tmp_path: Path
) -> None:
    from specproxy.engines import vllm_cpu

    record = tmp_path / "base.jsonl"
    base = vllm_cpu.start(vllm_cpu_layout, [], name="base")  # type: ignore[arg-type]
    try:
        async with proxy_process(base.url, record, "--capture", "full") as (url, _), aiohttp.ClientSession() as s:
            for p in PROMPTS:
                await _figures(s, url, _body(p))
    finally:
        base.stop()
    accepted = drafted = 0
    async with aiohttp.ClientSession() as s:
        for p in PROMPTS:
            f = await _figures(s, ngram_engine.url, _body(p))
            accepted += f["num_accepted_draft_tokens"]
            drafted += f["num_draft_tokens"]
    done = subprocess.run(  # noqa: ASYNC221 - the command as a user runs it, once, after the engines
        [sys.executable, "-m", "specproxy", "whatif", str(record), "--tokenizer", str(MODEL_DIR), "--k", "3",
         "--format", "json"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["replayed"] == len(PROMPTS), out
    (row,) = out["rows"]
    measured = accepted / drafted
    sys.stderr.write(
        f"\nwhatif k=3: predicted {row['acceptance']:.4f} measured {measured:.4f} {row} {accepted}/{drafted}\n"
    )
    assert row["acceptance"] <= row["acceptance_high"], row
    assert row["acceptance"] - 0.02 <= measured <= row["acceptance_high"] + 0.02, (row, accepted, drafted)
