"""``specproxy run --endpoint/--engine`` against the simulator posing as Ollama and as vLLM, then ``compare``: one
table holds both engines, Ollama's decode rate being its own eval_count / eval_duration."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from simutil import running_sim

from specproxy.core.record import read_records


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_run_ollama_native_and_vllm_then_compare(tmp_path: Path) -> None:
    ollama_out, vllm_out = tmp_path / "ollama.jsonl", tmp_path / "vllm.jsonl"
    common = ("--workload", "code_agent", "--requests", "4", "--max-tokens", "24", "--no-progress")
    async with (
        running_sim(speed=50.0, dialect="ollama", spec_method="none") as ollama,
        running_sim(speed=50.0, num_speculative_tokens=3) as vllm,
    ):
        runs = await asyncio.gather(
            _cli(
                "run",
                "--target",
                ollama.url,
                "--endpoint",
                "ollama-chat",
                "--label",
                "Ollama-Q8_0",
                "--out",
                str(ollama_out),
                *common,
            ),
            _cli("run", "--target", vllm.url, "--label", "vLLM-MTP-n3", "--out", str(vllm_out), *common),
        )
    for code, _, err in runs:
        assert code == 0, err
    o_recs, v_recs = list(read_records(ollama_out)), list(read_records(vllm_out))
    assert len(o_recs) == len(v_recs) == 4
    for rec in o_recs:
        assert rec["engine"] == "ollama" and rec["path"] == "/api/chat" and rec["completion_tokens"] == 24
        t = rec["engine_timings"]
        assert t is not None and rec["decode_tok_s"] == t["decode_tokens"] / t["decode_s"]
    assert all(r["engine"] == "vllm" and r["spec"] and r["spec"]["source"] for r in v_recs)
    code, out, err = await _cli("compare", str(ollama_out), str(vllm_out), "--baseline", "Ollama-Q8_0")
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header[:3] == ["workload", "configuration", "engine"]
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:] if line.startswith("code_agent")}
    assert rows["Ollama-Q8_0"][3] == "ollama" and rows["vLLM-MTP-n3"][2] == "vllm"
    # a forced engine is recorded as given; a bad one is a one-line usage error
    code, _, err = await _cli("run", "--target", "http://127.0.0.1:9", "--workload", "code_agent", "--engine", "tgi")
    assert code == 2 and "--engine must be one of auto, vllm, sglang, ollama, llamacpp" in err
    code, _, err = await _cli("proxy", "--upstream", "http://127.0.0.1:9", "--engine", "TGI", "--record", "-")
    assert code == 2 and err.count("\n") == 1 and "--engine must be one of" in err
