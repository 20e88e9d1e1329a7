"""The bookkeeper's watermark: a scrape's delta is settled only once every relay with a request in flight has sent
its events stamped past the scrape's window (proxy/bookkeeper.py, ``Bookkeeper.caught_up``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson

from specproxy.proxy.bookkeeper import CATCH_UP_MAX_S, Bookkeeper
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.events import CHUNK, STATS, frame
from specproxy.recorder.config import RecorderConfig


async def test_a_settle_waits_for_a_late_relay_and_no_longer_than_its_bound(tmp_path: Path) -> None:
    cfg = ProxyConfig(upstream="http://127.0.0.1:9", recorder=RecorderConfig(record_path=str(tmp_path / "r.jsonl")))
    async with aiohttp.ClientSession() as session:
        keeper = Bookkeeper.create(cfg, session)
        assert keeper.recorder.scraper.catch_up == keeper.caught_up  # wired to the scraper's settle
        late, idle = keeper.connect(lambda _: None), keeper.connect(lambda _: None)
        now = time.perf_counter_ns()
        # a relay with a request in flight, its events so far stamped a second ago
        late.received(frame(STATS, 0, now - 10**9, orjson.dumps({"in_flight": 1})))
        idle.received(frame(STATS, 0, now, orjson.dumps({"in_flight": 0})))  # nothing in flight: never waited on
        target = time.perf_counter_ns()

        waiting = asyncio.create_task(keeper.caught_up(target))
        await asyncio.sleep(0)
        assert not waiting.done()  # the late relay's chunks of the window may still be on their way
        late.received(frame(CHUNK, 1, time.perf_counter_ns(), b"data: {}\n\n"))  # of no request it knows: a stamp
        assert await asyncio.wait_for(waiting, 5) is True  # its watermark passed the window: settle now

        assert await keeper.caught_up(time.perf_counter_ns() - 10**9) is False  # everything is here already
        # a relay that stays silent holds a settle back for the bound at most
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await keeper.caught_up(time.perf_counter_ns() + 60 * 10**9) is True
        assert CATCH_UP_MAX_S <= loop.time() - t0 < 30
