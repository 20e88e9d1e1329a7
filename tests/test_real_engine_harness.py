"""benchmarks/real_engine.py, the harness a GPU run uses, run as its users run it, on two simulators in place of
the engines: every phase it is asked for completes, its figures add up, and the records that explain them come back
beside the results file. (A GPU machine's time is scarce: a harness that breaks there costs the run.)"""

from __future__ import annotations

import asyncio
import json
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.real_engine import records_archive
from tests.simutil import sim_process

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def _harness(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.real_engine",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_the_harness_runs_its_phases_and_keeps_the_records(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    async with (
        sim_process("--spec-method", "none", "--speed", "20") as base,
        sim_process("--spec-method", "ngram", "--speed", "20") as ngram,
    ):
        rc, printed = await _harness(
            "--base", base, "--ngram", ngram, "--out", str(out),
            "--phases", "overhead,acceptance,matrix",
            "--concurrency", "2", "--min-requests", "4", "--accept-requests", "4", "--accept-repeat", "2",
            "--mixed-concurrency", "4", "--mixed-repeat", "3",
            "--matrix-requests", "2",
            # relay processes of its own (a folder for the records that does not exist yet)
            "--workers", "2", "--work", str(tmp_path / "records" / "here"),
            # the overhead once more with the proxy scraping nothing: what its scrapes cost the engine, apart
            "--proxy-variants", "default;--metrics-url none",
        )  # fmt: skip
    assert rc == 0, printed
    doc = json.loads(out.read_text())
    phases = doc["phases"]
    assert set(phases) == {"overhead", "acceptance", "matrix"}
    assert not [name for name, section in phases.items() if "error" in section], phases
    oh = phases["overhead"]["c2"]
    assert oh["direct"]["errors"] == 0 and oh["proxy"]["errors"] == 0 and oh["proxy"]["requests"] >= 4
    mixed = phases["acceptance"]["ngram"]["mixed"]["c4"]
    # the records' counter shares add up to what the engine counted in the mixed run
    assert mixed["counters_shares_sum"]["draft_tokens"] == pytest.approx(
        mixed["engine_delta"]["draft_tokens"], rel=0.02
    )
    # each of the 4 prompts twice alone, three times mixed; and how many mixed records were left unsettled
    assert {w: m["requests"] for w, m in mixed["workloads"].items()} == {"code_agent": 12, "ja_chat": 12}
    assert all(0 <= m["unsettled"] <= m["requests"] for m in mixed["workloads"].values())
    assert {w: a["requests"] for w, a in phases["acceptance"]["ngram"]["alone_c1"].items()} == {
        "code_agent": 8,
        "ja_chat": 8,
    }
    # what explains a share: how the proxy scraped, and whether its models had settled
    assert mixed["proxy_engine_status"]["scrapes_ok"] >= 1 and "models_stable" in mixed["proxy_engine_status"]
    assert oh["proxy_status"]["engine"]["scrapes_ok"] >= 1
    unscraped = phases["overhead"]["c2 --metrics-url none"]
    assert unscraped["proxy"]["errors"] == 0 and unscraped["proxy"]["requests"] >= 4
    assert not (unscraped["proxy_status"].get("engine") or {}).get("scrapes_ok")
    ngram_code = phases["matrix"]["ngram/code_agent"]["matrix"]
    assert ngram_code["requests"] == 2 and ngram_code["with_figure"] == 2 and ngram_code["sources"]
    with tarfile.open(records_archive(out)) as tar:
        names = set(tar.getnames())
    assert {"mixed-ngram-c4.jsonl", "alone-ngram-ja_chat.jsonl"} <= names
    assert not [n for n in names if n.startswith(("oh-", "overhead-"))]  # the overhead's many records stay behind


async def test_a_request_the_harness_cannot_serve_is_a_clear_error(tmp_path: Path) -> None:
    rc, printed = await _harness(
        "--base", "http://127.0.0.1:9", "--accept-requests", "100000", "--out", str(tmp_path / "r.json")
    )  # fmt: skip
    assert rc == 2 and "Traceback" not in printed, printed
    assert "fewer than 100000" in printed


async def test_a_count_below_its_least_is_a_clear_error(tmp_path: Path) -> None:
    for bad in (["--mixed-repeat", "-1"], ["--accept-repeat", "0"]):
        rc, printed = await _harness("--base", "http://127.0.0.1:9", *bad, "--out", str(tmp_path / "r.json"))
        assert rc == 2 and "Traceback" not in printed, printed
        assert "--mixed-repeat 0 or more" in printed
