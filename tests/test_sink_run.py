"""``specproxy run`` when its record file cannot take every record (the file's size capped with RLIMIT_FSIZE: a
full disk without root or mounts): the records that fit are whole lines, the rest are counted lost, the summary says
so and the run exits 1. And the loss paths of the sink reach the run's result: records past the memory bound and
records still unwritten at the end."""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from specproxy.exitcodes import EXIT_FAILURE
from specproxy.loadgen.plan import BodyOptions
from specproxy.loadgen.runner import LoadSpec, run_shard
from specproxy.loadgen.target import Target
from specproxy.recorder.recorder import RecorderConfig
from specproxy.workloads import load_workload
from tests.simutil import running_sim


async def test_a_run_whose_disk_fills_keeps_whole_lines_and_fails(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    limit = 6000
    async with running_sim(speed=200.0) as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "specproxy",
            "run",
            "--target",
            sim.url,
            "--metrics-url",
            "none",
            "--workload",
            "ja_chat",
            "--requests",
            "20",
            "--concurrency",
            "4",
            "--max-tokens",
            "8",
            "--out",
            str(out),
            "--no-progress",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
        )
        _, hard = resource.prlimit(proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, hard))
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    text = stdout.decode() + stderr.decode()
    assert proc.returncode == EXIT_FAILURE, text
    data = out.read_bytes()
    assert 0 < len(data) <= limit and data.endswith(b"\n")
    kept = [orjson.loads(line)["request_id"] for line in data.splitlines()]  # whole records, each once
    assert len(set(kept)) == len(kept)
    assert f"{20 - len(kept)} records could not be written to {out}" in text
    assert "Traceback" not in text


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full to simulate a full disk")
async def test_records_lost_past_the_memory_bound_count_in_the_runs_result() -> None:
    async with running_sim(speed=200.0) as sim:
        spec = LoadSpec(
            target=Target(sim.url),
            workloads=(load_workload("ja_chat"),),
            body=BodyOptions(model="", max_tokens=4),
            recorder=RecorderConfig(record_path="/dev/full", run_id=uuid.uuid4().hex[:12], max_pending_bytes=1),
            requests=5,
        )
        result = await run_shard(spec, handle_signals=False)
    # one record waits (memory bound: one record at most), four are lost at once, the last at the end of the run
    assert result.records_dropped == 5 and result.records_written == 0
