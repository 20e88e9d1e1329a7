"""Stopping in two steps, with ``specproxy proxy`` as its own process: the first SIGTERM stops accepting and lets the
streams in flight finish; a second signal, or the drain timeout, cuts those left, and every cut stream still gets
its record, with outcome ``shutdown``. Exit codes: 0 after a drain or a cut by the drain timeout, 128 + the signal
after a second signal, 1 when records could not be written."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import pytest

from specproxy.core.record import read_records
from specproxy.proxy.config import ProxyConfig
from tests.proxyutil import proxy_process
from tests.upstreams import Script, start_raw_upstream, start_upstream

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
LONG = [CHUNK] * 400  # at one chunk per 50 ms: a 20 s stream, which only a cut ends early
SHORT = [CHUNK] * 10


def _script(request: object, _body: bytes) -> Script:
    path = getattr(request, "path", "")
    return Script(SHORT if path.endswith("/short") else LONG, pause_s=0.05)


class Streams:
    """Streams through the proxy, each one's fate kept: ``finished`` (a clean end) or ``cut`` (a broken one)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.started = 0
        self.chunks = 0
        self.tasks: list[asyncio.Task[str]] = []

    def open(self, n: int, path: str) -> None:
        self.tasks += [asyncio.create_task(self._one(path)) for _ in range(n)]

    async def _one(self, path: str) -> str:
        first = True
        try:
            async with self.session.post(self.url + path, data=b'{"stream": true}') as r:
                async for _ in r.content.iter_any():
                    self.chunks += 1
                    if first:
                        self.started, first = self.started + 1, False
            return "finished"
        except aiohttp.ClientPayloadError:
            return "cut"

    async def all_started(self) -> None:
        for _ in range(500):
            if self.started == len(self.tasks):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.started} of {len(self.tasks)} streams started")

    async def chunks_read(self, n: int) -> None:
        for _ in range(1000):
            if self.chunks >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{self.chunks} of {n} chunks read")

    async def fates(self) -> list[str]:
        return list(await asyncio.gather(*self.tasks))


async def _logged(proc: object, text: bytes) -> None:
    """Read the process's log until a line holding ``text``: the signal was handled, whatever the host's speed."""
    stderr = proc.stderr  # type: ignore[attr-defined]
    while line := await asyncio.wait_for(stderr.readline(), 20):
        if text in line:
            return
    raise AssertionError(f"the proxy exited without logging {text!r}")


async def test_second_sigterm_cuts_every_stream_and_writes_its_record(tmp_path: Path) -> None:
    n = 30
    up = await start_upstream(_script)
    record = tmp_path / "rec.jsonl"
    loop = asyncio.get_running_loop()
    try:
        async with (
            proxy_process(up.url, record, "--metrics-url", "none", "--drain-timeout", "60") as (url, proc),
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
        ):
            streams = Streams(s, url)
            streams.open(n, "/v1/chat/completions")
            await streams.all_started()
            t0 = loop.time()
            proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            await _logged(proc, b"SIGTERM: stopping")  # handled: a second one now is the second signal
            proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            fates = await streams.fates()
            rc = await asyncio.wait_for(proc.wait(), 20)  # type: ignore[attr-defined]
            took = loop.time() - t0
        assert fates == ["cut"] * n  # no stream faked a clean finish
        assert rc == 128 + signal.SIGTERM
        assert took < 10  # promptly: within docker stop's grace, long before the streams' own end
        recs = list(read_records(record))
        assert len(recs) == n
        assert {r["outcome"] for r in recs} == {"shutdown"}
        assert all("second signal (SIGTERM)" in str(r["error"]) for r in recs)
        assert all(r["chunks"] for r in recs)  # what was relayed before the cut is in the record
    finally:
        await up.server.close()


async def test_drain_timeout_cuts_the_rest_marked_the_same(tmp_path: Path) -> None:
    up = await start_upstream(_script)
    record = tmp_path / "rec.jsonl"
    loop = asyncio.get_running_loop()
    try:
        async with (
            proxy_process(up.url, record, "--metrics-url", "none", "--drain-timeout", "1.5") as (url, proc),
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
        ):
            streams = Streams(s, url)
            streams.open(1, "/v1/short")
            streams.open(4, "/v1/chat/completions")
            host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
            idle_r, idle_w = await asyncio.open_connection(host, int(port))  # kept alive, quiet
            idle_w.write(b"GET /specproxy/status HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await idle_r.readuntil(b"\r\n\r\n")  # then exactly its body: the connection is idle after it
            length = next(
                int(v)
                for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                if k.lower() == b"content-length"
            )
            await idle_r.readexactly(length)
            await streams.all_started()
            proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            assert await asyncio.wait_for(idle_r.read(), 10) == b""  # closed at once, not at the end of the drain
            idle_closed = loop.time()
            idle_w.close()
            with pytest.raises(aiohttp.ClientConnectorError):  # the first signal: no new connections
                async with aiohttp.ClientSession() as fresh, fresh.get(url + "/v1/models"):
                    pass
            fates = await streams.fates()
            cut_at = loop.time()
            rc = await asyncio.wait_for(proc.wait(), 20)  # type: ignore[attr-defined]
        assert fates == ["finished"] + ["cut"] * 4  # the short one finished while draining
        assert idle_closed < cut_at
        assert rc == 0  # the drain timeout is the configured way to stop: records written, exit 0
        recs = list(read_records(record))
        assert sorted(str(r["outcome"]) for r in recs) == ["ok"] + ["shutdown"] * 4
        cut = [r for r in recs if r["outcome"] == "shutdown"]
        assert all("drain timeout" in str(r["error"]) for r in cut)
    finally:
        await up.server.close()


async def test_a_third_signal_while_records_are_written_loses_none(tmp_path: Path) -> None:
    """SIGINT, then SIGTERM (the cut), then SIGTERM again while the cut records wait for their closing scrape (the
    engine's /metrics hangs): the exit code is the second signal's, and the record is written."""
    up = await start_upstream(_script)
    hung_metrics = await start_raw_upstream(reply=b"")  # reads each request, never answers
    record = tmp_path / "rec.jsonl"
    try:
        async with (
            proxy_process(up.url, record, "--metrics-url", hung_metrics.url + "/metrics") as (url, proc),
            aiohttp.ClientSession() as s,
        ):
            streams = Streams(s, url)
            streams.open(1, "/v1/chat/completions")
            await streams.all_started()
            await streams.chunks_read(3)  # more than one token chunk: the record will wait for a closing scrape
            proc.send_signal(signal.SIGINT)  # type: ignore[attr-defined]
            await _logged(proc, b"SIGINT: stopping")
            proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            await _logged(proc, b"SIGTERM again: cutting")
            # the cut record now waits up to CLOSE_SCRAPE_WAIT_S for the scrape the hung /metrics never answers
            assert proc.returncode is None  # type: ignore[attr-defined]  # still writing the record
            proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            await _logged(proc, b"SIGTERM: already stopping, writing the last records")
            assert await streams.fates() == ["cut"]
            rc = await asyncio.wait_for(proc.wait(), 20)  # type: ignore[attr-defined]
            said = await asyncio.wait_for(proc.stderr.read(), 10)  # type: ignore[attr-defined]
        assert rc == 128 + signal.SIGTERM, said.decode(errors="replace")
        (rec,) = read_records(record)
        assert rec["outcome"] == "shutdown" and "second signal (SIGTERM)" in str(rec["error"])
    finally:
        await up.server.close()
        await hung_metrics.close()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to simulate a full disk")
async def test_records_that_could_not_be_written_make_the_exit_code_1(tmp_path: Path) -> None:
    up = await start_upstream(_script)
    try:
        async with (
            proxy_process(up.url, Path("/dev/full"), "--metrics-url", "none") as (url, proc),
            aiohttp.ClientSession() as s,
        ):
            async with s.post(url + "/v1/short", data=b"{}") as r:
                await r.read()
            proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            rc = await asyncio.wait_for(proc.wait(), 20)  # type: ignore[attr-defined]
            stderr = await proc.stderr.read()  # type: ignore[attr-defined]
        assert rc == 1 and b"1 records were lost" in stderr
    finally:
        await up.server.close()


def test_the_default_drain_fits_docker_stop_and_kubernetes() -> None:
    # docker stop waits 10 s and Kubernetes 30 s before SIGKILL; the cut records need a moment after the drain
    assert ProxyConfig(upstream="http://127.0.0.1:1").drain_timeout_s <= 8
