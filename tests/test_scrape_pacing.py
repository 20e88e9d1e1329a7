"""Scrapes stay off what they measure (recorder/scraper.py): none lands while a request waits for its first token,
none is asked for where the engine gives each request's figures itself, and status catches up once the engine is
quiet. Real sockets, an aiohttp engine that notes when each /metrics arrives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from specproxy.recorder.scraper import PER_REQUEST_RUN, Scraper
from tests.proxyutil import running_proxy
from tests.simutil import running_sim

METRICS = (Path(__file__).parent / "data" / "metrics-ngram-before-code.txt").read_text()


async def baseline(px: Any) -> Scraper:
    """The proxy's scraper, once its baseline scrape is in."""
    scraper: Scraper = px.recorder.scraper
    for _ in range(500):
        if scraper.state.ok:
            break
        await asyncio.sleep(0.01)
    return scraper


class Engine:
    """The first request streams a token, then holds until ``first_done``; the second waits in prefill until
    ``prefill_done``. Each /metrics arrival is noted in order with the rest."""

    def __init__(self) -> None:
        self.events: list[str] = []  # "metrics", "arrived", "first_token", in the order the engine saw them
        self.streaming = asyncio.Event()
        self.arrived = asyncio.Event()
        self.prefill_done = asyncio.Event()
        self.first_done = asyncio.Event()
        self.calls = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.calls += 1
        second = self.calls == 2
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if second:
            self.events.append("arrived")
            self.arrived.set()
            await self.prefill_done.wait()
            self.events.append("first_token")
        for i, word in enumerate(("Hello", " there", " friend")):
            chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": word}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if not second and i == 0:
                self.streaming.set()
                await self.first_done.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        self.events.append("metrics")
        return web.Response(text=METRICS, content_type="text/plain")

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """This engine on a port of its own; yields its URL."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/")
        finally:
            await server.close()


async def test_no_scrape_lands_while_a_request_waits_for_its_first_token(tmp_path: Path) -> None:
    """Two requests in flight: the periodic scrape is due, but one of them is in prefill, so it waits."""
    engine = Engine()
    body = {"model": "m", "messages": [], "stream": True}
    async with (
        engine.serve() as url,
        running_proxy(url, tmp_path, rec_scrape_interval_s=0.05) as px,
        aiohttp.ClientSession() as s,
    ):
        scraper = await baseline(px)
        first = asyncio.create_task(s.post(px.url + "/v1/chat/completions", json=body))
        await engine.streaming.wait()
        second = asyncio.create_task(s.post(px.url + "/v1/chat/completions", json=body))
        await engine.arrived.wait()
        for _ in range(500):  # the periodic scrape (every 50 ms with two in flight) is held back
            if scraper.deferred:
                break
            await asyncio.sleep(0.01)
        engine.prefill_done.set()
        for _ in range(500):  # and goes out once the second request's first token is through
            if engine.events[-1:] == ["metrics"]:
                break
            await asyncio.sleep(0.01)
        engine.first_done.set()
        for task in (first, second):
            resp = await task
            await resp.read()
        await px.flush()
    assert scraper.deferred >= 1
    arrived = engine.events.index("arrived")
    token = engine.events.index("first_token")
    assert "metrics" not in engine.events[arrived:token], engine.events
    assert "metrics" in engine.events[token:], engine.events


class ClosedLoopEngine(Engine):
    """The first request streams to its end at once; the second, sent by the client as soon as it has read the
    first's end, waits in prefill until ``prefill_done``."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.calls:
            return await super().chat(request)  # the second: held in prefill
        await request.read()
        self.calls += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Hello", " there", " friend"):  # more than one token chunk: its record waits for a scrape
            chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": word}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        self.events.append("ended")
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def test_a_closing_scrape_waits_for_the_next_request_of_a_closed_loop(tmp_path: Path) -> None:
    """Concurrency 1: the client sends its next request as soon as it reads the end of the last. The closing scrape
    of the first goes out after the second's first token, not between the first's end and that token (where it
    met the next request at the engine and added the render to its TTFT)."""
    engine = ClosedLoopEngine()
    body = {"model": "m", "messages": [], "stream": True}
    # a generous wait for the arrival (on a busy host the next request may take long to reach the bookkeeping),
    # and no floor between scrapes, which would hold the closing scrape back after the baseline by itself
    kw = {"rec_scrape_arrival_wait_s": 10.0, "rec_scrape_min_gap_s": 0.0}
    async with engine.serve() as url, running_proxy(url, tmp_path, **kw) as px, aiohttp.ClientSession() as s:
        scraper = await baseline(px)
        async with s.post(px.url + "/v1/chat/completions", json=body) as first:
            assert (await first.read()).endswith(b"data: [DONE]\n\n")
        second = asyncio.create_task(s.post(px.url + "/v1/chat/completions", json=body))
        await engine.arrived.wait()
        for _ in range(1000):  # the closing scrape, held back until the second request's first token
            if scraper.deferred:
                break
            await asyncio.sleep(0.01)
        engine.prefill_done.set()
        resp = await second
        await resp.read()
        await px.flush()
    ended, token = engine.events.index("ended"), engine.events.index("first_token")
    assert "metrics" not in engine.events[ended:token], engine.events
    assert "metrics" in engine.events[token:], engine.events
    assert scraper.deferred >= 1
    assert all(r["outcome"] == "ok" for r in px.records()) and len(px.records()) == 2


async def test_one_request_alone_gets_no_periodic_scrape(tmp_path: Path) -> None:
    """A request alone in flight is settled by its closing scrape: none is made while it streams."""
    engine = Engine()  # its first request streams one token, then holds until first_done
    async with (
        engine.serve() as url,
        running_proxy(url, tmp_path, rec_scrape_interval_s=0.02) as px,
        aiohttp.ClientSession() as s,
    ):
        await baseline(px)
        task = asyncio.create_task(
            s.post(px.url + "/v1/chat/completions", json={"model": "m", "messages": [], "stream": True})
        )
        await engine.streaming.wait()
        during = engine.events.count("metrics")
        # ten periodic intervals pass while it streams: an absence can only be waited for this way
        await asyncio.sleep(0.2)
        held = engine.events.count("metrics")
        engine.first_done.set()
        resp = await task
        await resp.read()
        await px.flush()
    assert held == during, engine.events
    (rec,) = px.records()
    assert rec["outcome"] == "ok"


async def test_engine_figures_slow_the_periodic_scrape_and_keep_the_cross_check(tmp_path: Path) -> None:
    """With vLLM's per-request figures on every response the counters are not needed to attribute: overlapping
    requests get fewer scrapes than the same requests without them, every record still has the counter estimate
    beside the engine's figures (its closing scrape), and the status ends up current."""
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "def f(x):"}],
        "stream": True,
        "stream_options": {"include_usage": True},  # vLLM sends its per-request figures on the usage chunk
    }
    counts = {}
    for detail in (None, "detailed"):
        (tmp_path / str(detail)).mkdir()
        async with (
            running_sim(speed=1.0, per_request_spec_metrics=detail) as sim,
            running_proxy(sim.url, tmp_path / str(detail), rec_calibration_hold_s=0.0) as px,
            aiohttp.ClientSession() as s,
        ):
            scraper = await baseline(px)

            async def one(tokens: int) -> None:
                async with s.post(px.url + "/v1/chat/completions", json={**body, "max_tokens": tokens}) as r:
                    await r.read()

            for _ in range(PER_REQUEST_RUN):  # alone: what tells the proxy the engine gives its figures
                await one(8)
            # overlapping, two seconds or more each in the simulator's real time: periodic scrapes part them, at
            # least every half second (their gap's ceiling, which a busy host's slow scrapes reach)
            await asyncio.gather(*(one(600) for _ in range(4)))
            await px.flush()
            counts[detail] = scraper.state.ok
            assert scraper.per_request_figures == (detail is not None)
            recs = px.records()
            assert len(recs) == PER_REQUEST_RUN + 4
            assert all((r["spec"]["source"] == "server") == bool(detail) for r in recs)
            assert all(r["spec"]["estimates"]["counters"] is not None for r in recs), [r["spec"] for r in recs]
            total = sum(r["spec"]["accepted"] for r in recs)
            for _ in range(1000):  # shares of the counters are rounded in the records
                if abs(px.recorder.status()["engine"]["accepted"] - total) < 0.01:
                    break
                await asyncio.sleep(0.01)
            status = px.recorder.status()
            assert abs(status["engine"]["accepted"] - total) < 0.01, (status, total)
            assert status["engine"]["per_request_figures"] is bool(detail)
    assert counts["detailed"] < counts[None], counts


async def test_an_engine_slow_to_render_its_metrics_is_scraped_less_often(tmp_path: Path) -> None:
    """The engine renders /metrics on the loop that streams tokens: where a render takes long, scrapes keep at most
    SCRAPE_DUTY of its time while requests overlap, however many end. Four clients' requests ending one after another
    ask for a closing scrape each; with a 20 ms render the scrapes are 0.5 s apart (the most the floor rises to), not
    0.1 s."""
    from specproxy.recorder.scraper import MAX_GAP_S, SCRAPE_DUTY

    render_s = 0.02
    hits: list[float] = []

    async def metrics(request: web.Request) -> web.Response:
        hits.append(asyncio.get_running_loop().time())
        await asyncio.sleep(render_s)
        return web.Response(text=METRICS, content_type="text/plain")

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("Hello", " there", " friend"):
            chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": word}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(0.1)  # the four clients' requests overlap
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    body = {"model": "m", "messages": [], "stream": True}
    try:
        async with (
            running_proxy(str(server.make_url("")).rstrip("/"), tmp_path) as px,
            aiohttp.ClientSession() as s,
        ):
            scraper = await baseline(px)
            first = len(hits)
            loop = asyncio.get_running_loop()
            t0 = loop.time()

            async def client() -> None:
                while loop.time() - t0 < 3.0:
                    async with s.post(px.url + "/v1/chat/completions", json=body) as r:
                        await r.read()

            await asyncio.gather(*(client() for _ in range(4)))
            assert scraper.flight_s is not None and scraper.flight_s >= render_s
            floor = min(MAX_GAP_S, render_s / SCRAPE_DUTY)
            assert px.recorder.status()["engine"]["scrape_gap_s"] >= floor
            # about 40 requests ended in 3 s, each asking for a scrape: 0.1 s apart that would be some 30 scrapes
            later = hits[first:]
            assert 1 <= len(later) <= 3.0 / floor + 2, later
    finally:
        await server.close()
