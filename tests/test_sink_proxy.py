"""Records as a proxy user meets them, with real processes, sockets and files: a disk that fills up mid-run and then
grows (the record file's size capped with RLIMIT_FSIZE, lifted later; no root, no mounts) leaves exactly one line per
request; records lost are counted in status and metrics and make the proxy exit 1; the record file is private from
creation; rotation keeps what ``--rotate-keep`` says and counts what it deletes.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from specproxy.core.record import read_records, record_files
from tests.proxyutil import proxy_process, running_proxy
from tests.simutil import chat_body, running_sim

HAVE_DEV_FULL = os.path.exists("/dev/full")  # writes to it fail with ENOSPC: a full disk on demand


async def _status(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/specproxy/status") as r:
        records: dict[str, Any] = (await r.json())["records"]
        return records


async def _until_status(s: aiohttp.ClientSession, url: str, cond: Any, what: str) -> dict[str, Any]:
    for _ in range(600):
        st = await _status(s, url)
        if cond(st):
            return st
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what} (status {st})")


async def _send(s: aiohttp.ClientSession, url: str, n: int, concurrency: int, **body: Any) -> list[str]:
    sem = asyncio.Semaphore(concurrency)
    ids: list[str] = []

    async def one() -> None:
        async with sem, s.post(url + "/v1/chat/completions", json=chat_body(**body)) as r:
            assert r.status == 200
            await r.read()
            ids.append(r.headers["X-Specproxy-Request-Id"])

    await asyncio.gather(*(one() for _ in range(n)))
    return ids


async def test_disk_full_then_grown_gives_exactly_one_line_per_request(tmp_path: Path) -> None:
    """The issue's reproduction: 120 requests at concurrency 8 while the disk is full, then it grows."""
    record = tmp_path / "rec.jsonl"
    limit = 40_000
    async with (
        running_sim(speed=200.0) as sim,
        proxy_process(sim.url, record, "--metrics-url", "none") as (url, proc_),
        aiohttp.ClientSession() as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        async with s.get(url + "/specproxy/status") as r:
            writer = int((await r.json())["bookkeeping"]["pid"])  # the process that writes the records
        _, hard = resource.prlimit(writer, resource.RLIMIT_FSIZE)
        resource.prlimit(writer, resource.RLIMIT_FSIZE, (limit, hard))  # the disk is nearly full
        ids = await _send(s, url, 120, 8, max_tokens=8)
        await _until_status(s, url, lambda st: st["sink_errors"] >= 2, "writes failing, and retried")
        # while full: the file holds whole lines only, exactly the ones counted as written. Taken between two
        # identical statuses: the writer rests a second between attempts once even one record does not fit.
        for _ in range(100):
            st = await _status(s, url)
            on_disk = record.read_bytes()
            if await _status(s, url) == st:
                break
            await asyncio.sleep(0.05)
        assert len(on_disk) <= limit and on_disk.endswith(b"\n")
        assert on_disk.count(b"\n") == st["written"] > 0 and st["dropped"] == 0
        resource.prlimit(writer, resource.RLIMIT_FSIZE, (hard, hard))  # the filesystem grows
        st = await _until_status(s, url, lambda st: st["written"] >= 120, "every record written")
        assert st["written"] == 120 and st["dropped"] == 0 and st["queued"] == 0
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    raw = record.read_bytes().splitlines()
    assert len(raw) == 120
    got = [orjson.loads(line)["request_id"] for line in raw]  # every line is one record: nothing glued or cut
    assert sorted(got) == sorted(ids)  # each request exactly once


@pytest.mark.skipif(not HAVE_DEV_FULL, reason="needs /dev/full to simulate a full disk")
async def test_proxy_exits_1_when_records_were_lost(tmp_path: Path) -> None:
    async with (
        running_sim(speed=200.0) as sim,
        proxy_process(sim.url, Path("/dev/full"), "--metrics-url", "none") as (url, proc_),
        aiohttp.ClientSession() as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        await _send(s, url, 2, 1, max_tokens=4)
        await _until_status(s, url, lambda st: st["sink_errors"] >= 1, "writes failing")
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    assert rc == 1, err
    assert err.splitlines()[-1] == "specproxy: error: 2 records were lost (not written to /dev/full; 0 written)"


@pytest.mark.skipif(not HAVE_DEV_FULL, reason="needs /dev/full to simulate a full disk")
async def test_records_past_the_memory_bound_are_lost_and_counted(tmp_path: Path) -> None:
    async with (
        running_sim(speed=200.0) as sim,
        proxy_process(sim.url, Path("/dev/full"), "--metrics-url", "none", "--record-buffer", "1KB") as (url, proc_),
        aiohttp.ClientSession() as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        await _send(s, url, 4, 1, max_tokens=4)  # each record is over 1 KB: one waits, the others are lost
        st = await _until_status(s, url, lambda st: st["dropped"] + st["queued"] == 4, "four records accounted")
        assert st["queued"] == 1 and st["dropped"] == 3 and st["written"] == 0 and st["queued_bytes"] > 1024
        async with s.get(url + "/specproxy/metrics") as r:
            metrics = await r.text()
        assert "specproxy_records_dropped_total 3.0" in metrics
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    assert rc == 1
    assert "records are being lost" in err and err.count("records are being lost") == 1
    assert err.splitlines()[-1] == "specproxy: error: 4 records were lost (not written to /dev/full; 0 written)"


async def test_the_record_file_is_private_from_creation(tmp_path: Path) -> None:
    record = tmp_path / "new" / "rec.jsonl"
    old = os.umask(0o022)
    try:
        async with (
            running_sim(speed=200.0) as sim,
            proxy_process(sim.url, record, "--metrics-url", "none") as (_url, proc_),
        ):
            proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
            assert stat.S_IMODE(record.stat().st_mode) == 0o600  # before any request
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        os.umask(old)


async def test_rotate_keep_deletions_are_counted_in_status_and_metrics(tmp_path: Path) -> None:
    async with (
        running_sim(speed=200.0) as sim,
        running_proxy(sim.url, tmp_path, metrics=False, rec_rotate_bytes=3000, rec_rotate_keep=2) as px,
        aiohttp.ClientSession() as s,
    ):
        ids = []
        for _ in range(8):
            ids += await _send(s, px.url, 1, 1, max_tokens=4)
            await px.flush()
        st = await _status(s, px.url)
        async with s.get(px.url + "/specproxy/metrics") as r:
            metrics = await r.text()
    files = record_files(tmp_path / "records.jsonl")
    assert [f.name for f in files] == ["records.jsonl.2", "records.jsonl.1", "records.jsonl"]
    kept = [r["request_id"] for r in read_records(tmp_path / "records.jsonl")]
    assert kept == ids[len(ids) - len(kept) :]  # the newest, in order
    assert st["files_deleted"] == px.recorder.sink.files_deleted > 0 and st["written"] == 8
    assert f"specproxy_record_files_deleted_total {float(st['files_deleted'])}" in metrics


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--rotate-keep", "-1"), "specproxy proxy: error: Invalid value: --rotate-keep cannot be negative, got -1"),
        (("--record-buffer", "lots"), "specproxy proxy: error: Invalid value: 'lots' is not a size like 64MB"),
    ],
)
def test_bad_record_options_are_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], line: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "specproxy", "proxy", "--upstream", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert p.returncode == 2 and p.stderr.splitlines() == [line]
    assert not list(tmp_path.iterdir())  # nothing written before the options are checked
