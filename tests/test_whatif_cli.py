"""``specproxy whatif`` from the command line: bad input is one line and a non-zero exit; a replay of a hand-made
--capture full record with the real model's tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = Path.home() / ".cache/specproxy/vllm-cpu/model"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", "whatif", *args], capture_output=True, text=True, timeout=60
    )


def _rec(path: Path, **fields: object) -> Path:
    base = {"schema_version": 5, "request_id": "r1", "path": "/v1/chat/completions", "status": 200,
            "workload": "code", "finish_reason": "stop"}  # fmt: skip
    path.write_text(json.dumps({**base, **fields}) + "\n")
    return path


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = _run(str(tmp_path / "nope.jsonl"), "--tokenizer", str(tmp_path))
    assert done.returncode != 0 and "no such file" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not (MODEL / "tokenizer.json").exists(), reason="no SmolLM2 tokenizer")
def test_records_without_capture_are_a_clear_error(tmp_path: Path) -> None:
    done = _run(str(_rec(tmp_path / "r.jsonl")), "--tokenizer", str(MODEL))
    assert done.returncode != 0 and "without --capture full" in done.stderr and "Traceback" not in done.stderr
    done = _run(str(_rec(tmp_path / "r.jsonl")), "--tokenizer", str(MODEL), "--k", "0..2")
    assert done.returncode != 0 and "--k" in done.stderr


@pytest.mark.skipif(not (MODEL / "tokenizer.json").exists(), reason="no SmolLM2 tokenizer")
def test_a_copying_response_is_predicted_to_accept(tmp_path: Path) -> None:
    text = "def f(x):\n    return x + 1\n"
    rec = _rec(tmp_path / "r.jsonl", request={"messages": [{"role": "user", "content": "Repeat: " + text}]},
               response_text=text)  # fmt: skip
    done = _run(str(rec), "--tokenizer", str(MODEL), "--k", "1..3", "--format", "json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["replayed"] == 1 and [r["k"] for r in out["rows"]] == [1, 2, 3]
    assert all(r["acceptance"] > 0.5 for r in out["rows"]), out["rows"]
    for r in out["rows"]:  # the interval: the last step's drafts past the end counted as accepted at the top
        assert r["acceptance_high"] == (r["accepted"] + r["tail_open"]) / r["draft_tokens"] >= r["acceptance"], r
