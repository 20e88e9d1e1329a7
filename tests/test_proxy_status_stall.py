"""``/specproxy/status`` while the bookkeeping process is stalled: the relay answers within half a second with what
it knows itself (its counters and the last whole status it got, with its age), marked partial, with 200 so that
probes keep a relaying proxy alive; once the bookkeeper runs again, the whole status.

Real processes (``python -m specproxy proxy`` in front of the simulator), the bookkeeper stopped with SIGSTOP;
every wait is on a condition, every timing a bound. The late answer and the bound on awaited answers are checked on
the test's loop, the bookkeeper a fake that holds its answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from specproxy.proxy.events import QUERY, REPLY, frame, reply_payload
from specproxy.proxy.link import MAX_LATE_QUERIES, STATUS_WAIT_S, EventLink
from tests.proxyutil import proxy_process
from tests.simutil import CODE_PROMPT, chat_body, sim_process
from tests.test_proxy_link import FakeBookkeeper

BOUND_S = 1.5  # well under the 2 s the scraper waits, over the relay's 0.5 s, with room for a busy machine


async def _status(s: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    async with s.get(url + "/specproxy/status") as r:
        doc = await r.json()
        return r.status, doc, time.monotonic() - t0


async def _whole(s: aiohttp.ClientSession, url: str, ok: Any, what: str, within_s: float = 30.0) -> dict[str, Any]:
    """Poll status until it is whole (not partial) and ``ok(status)`` holds."""
    deadline = time.monotonic() + within_s
    doc: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            code, doc, _ = await _status(s, url)
            if code == 200 and not doc.get("partial") and ok(doc):
                return doc
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {what}: {doc}")


async def _relay(s: aiohttp.ClientSession, url: str, n: int) -> None:
    for _ in range(n):
        async with s.post(url + "/v1/chat/completions", json=chat_body(CODE_PROMPT, max_tokens=8)) as r:
            await r.read()
            assert r.status == 200


async def _health(url: str) -> tuple[int, str]:
    """``specproxy health`` as a probe runs it, giving up as a probe does after 1.5 s."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "health", "--url", url + "/specproxy/status", "--timeout", str(BOUND_S),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


@pytest.mark.parametrize("door", ["fast lane", "aiohttp"])
async def test_a_stalled_bookkeeper_gets_the_relays_partial_status_within_half_a_second(
    tmp_path: Path, door: str
) -> None:
    """SIGSTOP of the bookkeeper: status answers 200 well within 2 s, partial, with the relay's live counters and
    the last whole status it got (and its age); `specproxy health` with a probe's short timeout passes; after
    SIGCONT the whole status again."""
    args = ["--workers", "1", "--metrics-url", "none"] + (["--no-fast-lane"] if door == "aiohttp" else [])
    async with (
        sim_process("--speed", "20") as sim_url,
        proxy_process(sim_url, tmp_path / "r.jsonl", *args) as (url, proc_),
        aiohttp.ClientSession() as s,
    ):
        proc: asyncio.subprocess.Process = proc_  # type: ignore[assignment]
        await _relay(s, url, 3)
        st = await _whole(s, url, lambda st: st["bookkeeping"]["relay_pids"] and st["records"]["written"] >= 3, "up")
        keeper = st["bookkeeping"]["pid"]
        os.kill(keeper, signal.SIGSTOP)
        try:
            code, doc, took = await _status(s, url)
            assert code == 200 and took < BOUND_S, (code, took, doc)
            assert doc["partial"] is True, doc
            bk = doc["bookkeeper"]
            assert bk["answered"] is False and 0 < bk["waited_s"] < BOUND_S, bk
            assert bk["last_full_age_s"] is not None and bk["last_full_age_s"] >= 0, bk
            assert doc["last_full"]["bookkeeping"]["pid"] == keeper, doc
            own = doc["bookkeeping"]
            for key in ("pid", "in_flight", "requests", "lost_records", "shed", "backlog_bytes"):
                assert key in own, (key, own)
            before = own["requests"]
            assert before >= 3, own

            # the relay still relays, and its partial view follows it
            await _relay(s, url, 1)
            code, doc, took = await _status(s, url)
            assert code == 200 and took < BOUND_S and doc["partial"] is True, (code, took, doc)
            assert doc["bookkeeping"]["requests"] > before, doc
            assert doc["bookkeeper"]["last_full_age_s"] is not None, doc

            rc, err = await _health(url)
            assert rc == 0, err
        finally:
            os.kill(keeper, signal.SIGCONT)
        st = await _whole(s, url, lambda st: st["bookkeeping"]["pid"] == keeper, "whole again")
        assert "bookkeeper" not in st and "last_full" not in st, st
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_a_late_status_becomes_the_last_whole_one_and_late_answers_are_bounded() -> None:
    """A status the bookkeeper sends after the relay answered partially is kept as ``last_full``; the answers still
    awaited stay bounded however many queries a stalled bookkeeper leaves unanswered."""
    link = EventLink(soft_bytes=1 << 20, hard_bytes=1 << 21, capture_max_bytes=1 << 20, header_names=())
    bk = FakeBookkeeper(link)  # answers nothing until told
    link.attach_local(bk.send)
    t0 = time.monotonic()
    code, _, body = await link.query("/specproxy/status")
    assert time.monotonic() - t0 < BOUND_S
    doc = orjson.loads(body)
    assert (code, doc["partial"], doc["last_full"]) == (200, True, None), doc
    assert doc["bookkeeper"] == {"answered": False, "waited_s": STATUS_WAIT_S, "last_full_age_s": None}, doc

    (qid,) = [f[1] for f in bk.frames if f[0] == QUERY]
    link.received(frame(REPLY, qid, 200, reply_payload("application/json", b'{"records":{"written":7}}')))
    doc = orjson.loads((await link.query("/specproxy/status"))[2])
    assert doc["partial"] is True and doc["last_full"] == {"records": {"written": 7}}, doc
    assert 0 <= doc["bookkeeper"]["last_full_age_s"] < 60, doc

    await asyncio.gather(*(link.query("/specproxy/status") for _ in range(MAX_LATE_QUERIES + 10)))
    assert len(link._queries) <= MAX_LATE_QUERIES
    await link.close(within_s=0.1)
