"""The supervisor of ``specproxy proxy --workers N``: a dead child is restarted, the relays reconnect to a new
bookkeeper, the loss is counted, SIGHUP reopens the record file, a stalled bookkeeper still gets a (partial) status.

Real processes (``python -m specproxy proxy``) against the built-in simulator, killed with SIGKILL and stopped with
SIGSTOP under load; every wait is on a condition (status polled until it holds), every timing a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specproxy.core.record import read_records
from tests.proxyutil import proxy_process
from tests.simutil import CODE_PROMPT, chat_body, sim_process


async def _get(s: aiohttp.ClientSession, url: str, path: str = "/specproxy/status") -> tuple[int, Any]:
    async with s.get(url + path) as r:
        if r.content_type == "application/json":
            return r.status, await r.json()
        return r.status, await r.text()


async def _until(s: aiohttp.ClientSession, url: str, ok: Any, what: str, within_s: float = 20.0) -> dict[str, Any]:
    """Poll /specproxy/status until ``ok(status)`` holds."""
    deadline = time.monotonic() + within_s
    st: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            code, st = await _get(s, url)
            if code == 200 and isinstance(st, dict) and not st.get("partial") and ok(st):
                return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {what}: {st}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Load:
    """Streams at a fixed concurrency until stopped; counts inference requests that finished cleanly."""

    def __init__(self, s: aiohttp.ClientSession, url: str, concurrency: int, max_tokens: int = 60) -> None:
        self.s, self.url = s, url
        self.ok = 0
        self.broken = 0
        self.ids: list[str] = []
        self.body = chat_body(CODE_PROMPT, max_tokens=max_tokens)
        self._stop = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._loop()) for _ in range(concurrency)]

    async def _loop(self) -> None:
        while not self._stop.is_set() and not self.s.closed:  # closed: the test failed and left
            try:
                async with self.s.post(self.url + "/v1/chat/completions", json=self.body) as r:
                    await r.read()
                    assert r.status == 200
                    self.ids.append(r.headers["X-Specproxy-Request-Id"])
                    self.ok += 1
            except (aiohttp.ClientError, AssertionError):
                self.broken += 1

    async def until(self, n: int, within_s: float = 30.0) -> None:
        deadline = time.monotonic() + within_s
        while self.ok < n:
            assert time.monotonic() < deadline, f"only {self.ok} requests in {within_s} s"
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


@asynccontextmanager
async def _supervised(
    record: Path, *args: str, speed: str, relays: int
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process, aiohttp.ClientSession, dict[str, Any]]]:
    """The simulator at ``speed`` and ``specproxy proxy`` in front of it in processes of their own, a session with no
    connection cap, and the proxy's status once ``relays`` relays are up."""
    async with (
        sim_process("--speed", speed) as sim_url,
        proxy_process(sim_url, record, *args) as (url, proc_),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        st = await _until(s, url, lambda st: len(st["bookkeeping"]["relay_pids"]) == relays, "ready")
        yield url, proc, s, st


async def test_a_killed_bookkeeper_is_restarted_and_the_relays_reconnect(tmp_path: Path) -> None:
    """kill -9 of the bookkeeper under 16 streams: no stream breaks, a new bookkeeper is started, status answers
    200 again with the restart counted, the relays' new requests are recorded again."""
    record = tmp_path / "r.jsonl"
    args = ("--workers", "2", "--metrics-url", "none")
    async with _supervised(record, *args, speed="20", relays=2) as (url, proc, s, st):
        keeper = st["bookkeeping"]["pid"]
        load = Load(s, url, 16)
        await load.until(40)
        os.kill(keeper, signal.SIGKILL)
        st = await _until(s, url, lambda st: st["bookkeeping"]["pid"] != keeper
                          and len(st["bookkeeping"]["relay_pids"]) == 2, "restarted")  # fmt: skip
        assert st["bookkeeping"]["restarts"] == {"bookkeeper": 1, "relay": 0}
        assert not _alive(keeper)
        after = load.ok
        await load.until(after + 40)
        await load.stop()
        assert load.broken == 0  # the proxy's own trouble broke no client's stream
        code, metrics = await _get(s, url, "/specproxy/metrics")
        assert code == 200 and 'specproxy_process_restarts_total{role="bookkeeper"} 1.0' in metrics
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    recorded = {r["request_id"] for r in read_records(record)}
    assert set(load.ids[after + 20 :]) <= recorded  # well after the restart: recorded again
    assert rc in (0, 1), err


async def test_idle_relays_report_to_a_restarted_bookkeeper(tmp_path: Path) -> None:
    """A relay that relays nothing still tells a new bookkeeper it is there: status lists every relay after a
    restart, not only those whose figures changed since they told the old one."""
    record = tmp_path / "r.jsonl"
    args = ("--workers", "2", "--metrics-url", "none")
    async with _supervised(record, *args, speed="20", relays=2) as (url, proc, s, st):
        keeper, relays = st["bookkeeping"]["pid"], st["bookkeeping"]["relay_pids"]
        os.kill(keeper, signal.SIGKILL)
        st = await _until(s, url, lambda st: st["bookkeeping"]["pid"] != keeper
                          and st["bookkeeping"]["relay_pids"] == relays, "listed both relays again")  # fmt: skip
        assert st["bookkeeping"]["restarts"]["bookkeeper"] == 1
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_killed_relay_is_restarted_and_status_lists_the_new_one(tmp_path: Path) -> None:
    record = tmp_path / "r.jsonl"
    args = ("--workers", "2", "--metrics-url", "none")
    async with _supervised(record, *args, speed="20", relays=2) as (url, proc, s, st):
        victim = st["bookkeeping"]["relay_pids"][0]
        os.kill(victim, signal.SIGKILL)
        # the new relay reports to the bookkeeper itself, the restart count comes from the main process once the
        # relay said it is ready: two messages, either first (on a busy host the count came second); status has both
        st = await _until(s, url, lambda st: len(st["bookkeeping"]["relay_pids"]) == 2
                          and victim not in st["bookkeeping"]["relay_pids"]
                          and st["bookkeeping"]["restarts"]["relay"] == 1, "a new relay, counted")  # fmt: skip
        assert st["bookkeeping"]["restarts"] == {"bookkeeper": 0, "relay": 1}
        new = next(p for p in st["bookkeeping"]["relay_pids"] if p != victim)
        assert _alive(new) and not _alive(victim)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_the_loss_at_exit_is_requests_finished_minus_records_written(tmp_path: Path) -> None:
    """kill -9 of the bookkeeper under 64 streams, with passthrough requests (GET /v1/models) going on: at the exit
    the lost records are exactly the inference requests finished minus the records in the file, by cause; the
    passthrough requests count as neither."""
    record = tmp_path / "r.jsonl"
    args = ("--workers", "2", "--metrics-url", "none")
    async with _supervised(record, *args, speed="20", relays=2) as (url, proc, s, st):
        keeper = st["bookkeeping"]["pid"]
        passthrough = 0
        stop = asyncio.Event()

        async def models() -> None:
            nonlocal passthrough
            while not stop.is_set():
                async with s.get(url + "/v1/models") as r:
                    await r.read()
                    passthrough += r.status == 200

        poller = asyncio.ensure_future(models())
        load = Load(s, url, 64)
        await load.until(100)
        os.kill(keeper, signal.SIGKILL)
        await _until(s, url, lambda st: st["bookkeeping"]["pid"] != keeper, "restarted")
        await load.until(load.ok + 60)
        await load.stop()
        stop.set()
        await poller
        assert load.broken == 0 and passthrough > 0
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    written = len(list(read_records(record)))
    last = err.strip().splitlines()[-1]
    assert rc == 1, err
    # "specproxy: error: N records were lost (cause: n, ...): F requests finished, W records written"
    lost = int(last.split("error: ", 1)[1].split()[0])
    finished = int(last.rsplit(": ", 1)[1].split()[0])
    said_written = int(last.rsplit(", ", 1)[1].split()[0])
    assert finished == load.ok, last  # inference only: the /v1/models requests are not in it
    assert said_written == written, last
    assert lost == finished - written > 0, last
    assert "bookkeeper_died" in last, last


async def test_sighup_reopens_the_record_file_and_cuts_no_stream(tmp_path: Path) -> None:
    """logrotate: the record file is renamed, SIGHUP sent; the streams in flight go on, the proxy too, and the next
    records go to a new file by the old name."""
    record = tmp_path / "r.jsonl"
    args = ("--workers", "2", "--metrics-url", "none")
    async with _supervised(record, *args, speed="5", relays=2) as (url, proc, s, _):
        load = Load(s, url, 8, max_tokens=100)
        await load.until(10)
        await _until(s, url, lambda st: st["records"]["written"] >= 5, "records written")
        record.rename(tmp_path / "r.jsonl.1")
        proc.send_signal(signal.SIGHUP)
        before = load.ok
        await load.until(before + 20)
        await load.stop()
        assert load.broken == 0 and proc.returncode is None
        code, _ = await _get(s, url)
        assert code == 200
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    assert rc == 0, err
    assert "SIGHUP: the record file is reopened" in err
    old = (tmp_path / "r.jsonl.1").read_bytes().splitlines()  # one record a line (read_records reads both files)
    new = record.read_bytes().splitlines()
    assert old and new and len(old) + len(new) == load.ok


async def test_a_stopped_bookkeeper_gets_a_partial_answer_within_its_wait(tmp_path: Path) -> None:
    """SIGSTOP of the bookkeeper under load: /specproxy/status (0.5 s wait) and /specproxy/metrics (2 s) answer within
    their wait (bound: 3 s) with the relay's own counters, marked partial; after SIGCONT the whole status again."""
    record = tmp_path / "r.jsonl"
    args = ("--workers", "1", "--metrics-url", "none", "--bookkeeping-buffer", "64KB")
    async with _supervised(record, *args, speed="10", relays=1) as (url, proc, s, st):
        keeper = st["bookkeeping"]["pid"]
        load = Load(s, url, 16, max_tokens=200)
        await load.until(5)
        os.kill(keeper, signal.SIGSTOP)
        try:
            for path in ("/specproxy/status", "/specproxy/metrics", "/specproxy/status"):
                t0 = time.monotonic()
                code, body = await _get(s, url, path)
                took = time.monotonic() - t0
                assert code == 200 and took < 3, (path, code, took, body)
                if path.endswith("status"):
                    assert body["partial"] is True and "backlog_bytes" in body["bookkeeping"], body
                else:
                    assert "specproxy_status_partial 1.0" in body and "specproxy_bookkeeping_backlog_bytes" in body
        finally:
            os.kill(keeper, signal.SIGCONT)
        await _until(s, url, lambda st: "partial" not in st, "whole again")
        await load.stop()
        assert load.broken == 0
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_bookkeeper_that_keeps_dying_stops_the_proxy_with_one_line(tmp_path: Path) -> None:
    """Past 5 deaths of the bookkeeper within a minute it is not restarted again: the proxy stops, exit 1, and
    its last line says why; the backoff grows between restarts."""
    record = tmp_path / "r.jsonl"
    async with _supervised(record, "--workers", "1", "--metrics-url", "none", speed="20", relays=1) as (
        url,
        proc,
        s,
        st,
    ):
        gaps = []
        for n in range(1, 6):
            keeper = st["bookkeeping"]["pid"]
            os.kill(keeper, signal.SIGKILL)
            t0 = time.monotonic()
            st = await _until(s, url, lambda st: st["bookkeeping"]["pid"] != keeper  # noqa: B023
                              and st["bookkeeping"]["relay_pids"], f"restart {n}")  # fmt: skip
            gaps.append(time.monotonic() - t0)
            assert st["bookkeeping"]["restarts"]["bookkeeper"] == n
        assert gaps[-1] > 1.0 > gaps[0]  # 0.1 s, doubled per death: 1.6 s for the fifth
        os.kill(st["bookkeeping"]["pid"], signal.SIGKILL)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
    assert rc == 1
    assert "the bookkeeper process ended 6 times within 60 s: not restarted" in err.strip().splitlines()[-1], err


async def test_when_the_main_process_is_killed_its_children_write_their_records_and_end(tmp_path: Path) -> None:
    """kill -9 of the main process (an OOM kill, a runaway script): the relays and the bookkeeper see their parent
    gone, the relays cut what is in flight, the bookkeeper writes the records it holds, and all of them end (they
    see it by their control socket's end, and by their parent's pid: children.open_control)."""
    record = tmp_path / "r.jsonl"
    async with _supervised(record, "--workers", "2", "--metrics-url", "none", speed="20", relays=2) as (
        url, proc, s, st,
    ):  # fmt: skip
        children = [st["bookkeeping"]["pid"], *st["bookkeeping"]["relay_pids"]]
        load = Load(s, url, 4)
        await load.until(12)
        await load.stop()
        finished = set(load.ids[: load.ok])
        proc.kill()
        await proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children):
            assert time.monotonic() < deadline, [pid for pid in children if _alive(pid)]
            await asyncio.sleep(0.05)
    recorded = {r["request_id"] for r in read_records(record)}
    assert finished and finished <= recorded  # what had finished before the kill is written


async def test_an_order_that_crosses_a_childs_last_word_does_not_lose_it() -> None:
    """A "cut" the main process sends while a relay says its last word and ends: the main process still reads that
    word. A Unix socket closed with data unread resets its peer, whose reader then raises before the line it had
    received (a relay "ended without saying how", exit 1, seen beside busy processes); the child now reads what was
    sent before it closes."""
    import socket

    from specproxy.proxy.children import last_word

    # the hazard itself: a child that says its word and closes with the order unread
    main_end, child_end = socket.socketpair()
    main_r, main_w = await asyncio.open_unix_connection(sock=main_end)
    main_w.write(b'{"do": "cut"}\n')
    await main_w.drain()
    child_end.sendall(b'{"cut":0}\n')
    child_end.close()
    deadline = asyncio.get_running_loop().time() + 10
    while main_r.exception() is None:  # the transport reads the word, then the reset
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    with pytest.raises(ConnectionResetError):  # and the reader raises before the line it holds
        await asyncio.wait_for(main_r.readline(), 10)
    main_w.close()
    for child_reads_first in (True, False):
        main_end, child_end = socket.socketpair()
        main_r, main_w = await asyncio.open_unix_connection(sock=main_end)
        child_r, child_w = await asyncio.open_unix_connection(sock=child_end)
        if not child_reads_first:
            main_w.write(b'{"do": "cut"}\n')  # crosses the last word: the child never asked for more orders
            await main_w.drain()
        ending = asyncio.ensure_future(last_word(child_r, child_w, cut=0))
        assert await asyncio.wait_for(main_r.readline(), 10) == b'{"cut":0}\n'
        if child_reads_first:
            main_w.write(b'{"do": "cut"}\n')  # after the last word: read and dropped all the same
            await main_w.drain()
        assert await asyncio.wait_for(main_r.readline(), 10) == b""  # its half-close: the main process sees the end
        main_w.close()  # as _reap does: the child's read ends, and so does it
        await asyncio.wait_for(ending, 10)
        child_w.close()
