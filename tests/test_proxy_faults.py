"""Faults: the proxy never breaks a client's stream for its own reasons, never fakes a clean finish, frees the
engine when a client leaves, and never loses a record."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from specproxy.core.record import read_records
from tests.proxyutil import proxy_process, running_proxy
from tests.simutil import CODE_PROMPT, chat_body, running_sim, sim_process, truth
from tests.upstreams import Script, capture_pieces, start_raw_upstream, start_upstream

HAVE_DEV_FULL = os.path.exists("/dev/full")  # writes to it fail with ENOSPC: a full disk on demand


async def _records(px: object) -> list[dict[str, object]]:
    await px.flush()  # type: ignore[attr-defined]
    return px.records()  # type: ignore[attr-defined,no-any-return]


async def _sim_requests(s: aiohttp.ClientSession, sim_url: str) -> list[dict[str, Any]]:
    async with s.get(sim_url + "/sim/requests") as r:
        listing = await r.json()
    return listing if isinstance(listing, list) else listing.get("requests", [])  # type: ignore[no-any-return]


async def _all_aborted(s: aiohttp.ClientSession, sim_url: str) -> list[dict[str, Any]]:
    """Poll the simulator's truth until every request it saw is aborted (or fail after 10 s); their whole truths."""
    reqs: list[dict[str, Any]] = []
    for _ in range(500):
        reqs = await _sim_requests(s, sim_url)
        if reqs and all(q.get("aborted") for q in reqs):
            truths = []
            for q in reqs:
                async with s.get(f"{sim_url}/sim/requests/{q['id']}") as r:
                    truths.append(await r.json())
            return truths
        await asyncio.sleep(0.02)
    raise AssertionError(f"not every request was aborted: {reqs}")


async def _until_received(s: aiohttp.ClientSession, sim_url: str) -> None:
    for _ in range(500):
        if await _sim_requests(s, sim_url):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the request never reached the simulator")


async def test_upstream_down_gives_502_json_and_a_record(tmp_path: Path) -> None:
    # a port nobody listens on: bind then close
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    async with running_proxy(f"http://127.0.0.1:{port}", tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
        async with s.post(px.url + "/v1/chat/completions", json=chat_body()) as r:
            assert r.status == 502
            body = await r.json()
            assert body["error"]["code"] == 502 and "unreachable" in body["error"]["message"]
        (rec,) = await _records(px)
        assert rec["outcome"] == "upstream_error" and rec["status"] is None


async def test_upstream_error_status_relayed(tmp_path: Path) -> None:
    async with running_sim(speed=50.0) as sim, running_proxy(sim.url, tmp_path) as px, aiohttp.ClientSession() as s:
        async with s.post(
            px.url + "/v1/chat/completions", json=chat_body(), headers={"X-Sim-Fault": "status=503"}
        ) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == 503
        async with s.post(px.url + "/v1/chat/completions", json={"model": "sim-model"}) as r:
            assert r.status == 400  # vLLM's 400 for a malformed request, relayed as is
        recs = await _records(px)
        assert [r["outcome"] for r in recs] == ["upstream_error", "upstream_error"]
        assert {r["status"] for r in recs} == {503, 400}


async def test_in_stream_error_event(tmp_path: Path) -> None:
    async with running_sim(speed=50.0) as sim, running_proxy(sim.url, tmp_path) as px, aiohttp.ClientSession() as s:
        headers = {"X-Sim-Fault": "error_event_after=3"}
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(), headers=headers) as r:
            body = await r.read()
        assert b'"error"' in body and body.endswith(b"data: [DONE]\n\n")
        (rec,) = await _records(px)
        assert rec["outcome"] == "upstream_error" and rec["error"]


async def test_upstream_reset_mid_stream_is_not_a_clean_finish(tmp_path: Path) -> None:
    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=0.005, reset_after=10))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            got = bytearray()
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.post(px.url + "/v1/chat/completions", json=chat_body()) as r:
                    async for piece in r.content.iter_any():
                        got += piece
            assert bytes(got) == b"".join(pieces[:10])
            (rec,) = await _records(px)
            assert rec["outcome"] == "upstream_reset"
            assert len(rec["chunks"]) == 9  # role chunk carries no token: 9 content chunks arrived
    finally:
        await up.server.close()


@pytest.mark.parametrize("framing", ["chunk size", "HTTP/1.0 body cut"])
async def test_a_broken_body_ends_the_clients_stream_at_once(tmp_path: Path, framing: str) -> None:
    """An invalid chunk size mid-stream breaks the client's stream at once (a relay that waited for more of that
    body would hold the client until it gave up: aiohttp's client did). An HTTP/1.0 body that ends with its
    connection is the contrast: it ends cleanly, and is never cut."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    if framing == "chunk size":
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        reply = [head + b"%x\r\n%s\r\n" % (len(event), event), b"zz\r\nboom\r\n"]
    else:
        reply = [b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + event, b"data: [DONE]\n\n"]
    up = await start_raw_upstream(reply, close_after=framing != "chunk size")
    try:
        async with (
            running_proxy(up.url, tmp_path, metrics=False) as px,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=8)) as s,  # a client that gives up
        ):
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            got = bytearray()
            if framing == "chunk size":
                with pytest.raises(aiohttp.ClientPayloadError):
                    async with s.post(px.url + "/v1/chat/completions", json=chat_body()) as r:
                        async for piece in r.content.iter_any():
                            got += piece
                assert bytes(got) == event
            else:
                async with s.post(px.url + "/v1/chat/completions", json=chat_body()) as r:
                    assert await r.read() == event + b"data: [DONE]\n\n"
            assert loop.time() - t0 < 5  # a hang lasts until the client quits (8 s)
            (rec,) = await _records(px)
            if framing == "chunk size":
                assert rec["outcome"] == "upstream_reset", rec
                assert "broke mid-response: an invalid chunk size" in str(rec["error"]), rec
            else:
                assert rec["outcome"] == "ok", rec
    finally:
        await up.close()


async def test_idle_timeout_breaks_the_stream_and_records_timeout(tmp_path: Path) -> None:
    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")[:6]
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=1.0))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False, idle_timeout_s=0.3) as px:
            async with aiohttp.ClientSession() as s:
                with pytest.raises(aiohttp.ClientPayloadError):
                    async with s.post(px.url + "/v1/chat/completions", json=chat_body()) as r:
                        await r.read()
            (rec,) = await _records(px)
            assert rec["outcome"] == "timeout"
    finally:
        await up.server.close()


@pytest.mark.parametrize("when", ["mid_stream", "before_first_byte"])
async def test_client_disconnect_cancels_upstream_within_1s(tmp_path: Path, when: str) -> None:
    async with running_sim(speed=1.0) as sim, running_proxy(sim.url, tmp_path) as px:
        headers = {"X-Sim-Fault": "stall=5"} if when == "before_first_byte" else {}
        rid = None
        async with aiohttp.ClientSession() as s:
            body = chat_body(CODE_PROMPT, max_tokens=2000)

            first_chunk = asyncio.Event()

            async def go() -> None:
                nonlocal rid
                async with s.post(px.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    rid = r.headers["X-Specproxy-Request-Id"]
                    async for _ in r.content.iter_any():
                        first_chunk.set()

            task = asyncio.create_task(go())
            if when == "mid_stream":
                await asyncio.wait_for(first_chunk.wait(), 20)
            else:
                await _until_received(s, sim.url)
                assert not first_chunk.is_set()  # the stall holds the first byte back
            task.cancel()  # the client goes away: its connection closes
            cancelled_at = sim.state.now()  # the simulator runs in this process: its clock, read directly
            with pytest.raises(asyncio.CancelledError):
                await task
        # the simulator saw the abort (vLLM frees the GPU at that moment)
        async with aiohttp.ClientSession() as s:
            (req,) = await _all_aborted(s, sim.url)
            assert float(req["aborted_at_s"]) - cancelled_at < 1.0
        (rec,) = await _records(px)
        assert rec["outcome"] == "client_cancelled"


async def test_real_proxy_process_frees_the_engine_when_client_leaves_during_prefill(tmp_path: Path) -> None:
    """The same through ``specproxy proxy`` as a user starts it (the server's handler cancellation is what makes a
    disconnect before the first byte reach the engine)."""
    async with (
        sim_process() as sim_url,
        proxy_process(sim_url, tmp_path / "r.jsonl") as (url, _),
        aiohttp.ClientSession() as s,
    ):

        async def go() -> None:
            headers = {"X-Sim-Fault": "stall=5"}
            async with s.post(url + "/v1/chat/completions", json=chat_body(), headers=headers) as r:
                await r.read()

        task = asyncio.create_task(go())
        await _until_received(s, sim_url)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        (req,) = await _all_aborted(s, sim_url)
        # on the simulator's clock, from its taking the request (before the test saw it and cancelled) to the
        # abort: at least the cancel-to-abort time, and nothing of the wait for the truth to show it, however busy
        assert float(req["aborted_at_s"]) - float(req["started_at_s"]) < 1.0


async def test_metrics_hanging_does_not_slow_traffic(tmp_path: Path) -> None:
    async with running_sim(speed=20.0, metrics_fault="hang") as sim, aiohttp.ClientSession() as s:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with s.post(sim.url + "/v1/chat/completions", json=chat_body(max_tokens=64)) as r:
            direct = await r.read()
        direct_s = loop.time() - t0
        async with running_proxy(sim.url, tmp_path, rec_scrape_timeout_s=0.3, rec_finalize_wait_s=0.5) as px:
            t0 = loop.time()
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=64)) as r:
                proxied = await r.read()
            proxied_s = loop.time() - t0
            assert proxied.count(b"data:") == direct.count(b"data:")
            assert proxied_s < direct_s * 3 + 0.2  # the hung scrape is not on the relay path
            (rec,) = await _records(px)
            assert rec["outcome"] == "ok"
            assert rec["spec"]["source"] in ("chunks", None) or rec["spec"]["estimates"]["counters"] is None
            assert "metrics_unavailable" in rec["flags"]


async def test_shutdown_does_not_wait_out_a_hanging_closing_scrape(tmp_path: Path) -> None:
    """/metrics stops answering while a stream runs, and the proxy is stopped right after it ends: the record is
    written without its closing scrape within about a second, not after the scrape timeout (docker stop's 10 s
    allows the drain's 8 s and little more)."""
    loop = asyncio.get_running_loop()
    async with running_sim(speed=20.0) as sim, aiohttp.ClientSession() as s:
        async with running_proxy(sim.url, tmp_path, rec_scrape_timeout_s=30.0, rec_finalize_wait_s=30.0) as px:
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=60)) as r:
                await r.content.readline()
                async with s.post(sim.url + "/sim/faults", json={"metrics": "hang"}) as f:
                    assert f.status == 200
                await r.read()
            t0 = loop.time()
        closed_s = loop.time() - t0
    (rec,) = [r for r in read_records(tmp_path / "records.jsonl") if r["path"].endswith("/completions")]
    assert rec["outcome"] == "ok" and rec["completion_tokens"] == 60
    assert closed_s < 3.0, closed_s


async def test_a_bookkeeping_failure_still_writes_the_record(tmp_path: Path) -> None:
    """A bug in the counter ledger (here: it raises whenever asked for a request's share) costs the request its
    figures, never its record, and the client's stream is whole."""
    async with (
        running_sim(speed=20.0) as sim,
        running_proxy(sim.url, tmp_path, rec_k=3) as px,
        aiohttp.ClientSession() as s,
    ):

        def broken(rid: str) -> None:
            raise RuntimeError("ledger bug")

        px.recorder.ledger.pop = broken  # type: ignore[method-assign]
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=40)) as r:
            body = await r.read()
        assert r.status == 200 and body.rstrip().endswith(b"data: [DONE]")
        (rec,) = await _records(px)
        assert rec["outcome"] == "proxy_error" and "ledger bug" in str(rec["error"])


async def test_a_failing_scrape_does_not_stop_scraping(tmp_path: Path) -> None:
    """A bug in what a scrape feeds (here the ledger raises on its first delta) loses that scrape, not the scraper:
    later scrapes settle, records are written, and the proxy closes cleanly."""
    async with (
        running_sim(speed=20.0) as sim,
        running_proxy(sim.url, tmp_path, rec_k=3) as px,
        aiohttp.ClientSession() as s,
    ):
        ledger = px.recorder.ledger
        settle, failures = ledger.settle, []

        def settle_once_broken(*args: object, **kwargs: object) -> None:
            if not failures:
                failures.append(1)
                raise RuntimeError("ledger bug")
            settle(*args, **kwargs)  # type: ignore[arg-type]

        ledger.settle = settle_once_broken  # type: ignore[method-assign]
        for _ in range(2):
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=40)) as r:
                assert r.status == 200
                await r.read()
        recs = await _records(px)
        scraper = px.recorder.scraper
        assert failures and scraper.state.errors >= 1 and ledger.aligned + ledger.time_cut >= 1, scraper.state
    assert len(recs) == 2 and all(r["outcome"] == "ok" for r in recs)


async def test_counter_reset_detected_no_negative_or_inflated(tmp_path: Path) -> None:
    async with (
        running_sim(speed=20.0) as sim,
        running_proxy(sim.url, tmp_path, rec_k=3) as px,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(1000):  # the scraper has its first snapshot: the counters' baseline before the reset
            if px.recorder.scraper.state.ok:
                break
            await asyncio.sleep(0.01)
        assert px.recorder.scraper.state.ok
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=200)) as r:
            await r.read()
        async with s.post(sim.url + "/sim/reset-counters") as r:
            assert r.status < 300
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=200)) as r:
            await r.read()
        recs = await _records(px)
        for rec in recs:
            t = await truth(s, sim, rec["upstream_id"])
            c = rec["spec"]["estimates"]["counters"]
            if c is not None:
                assert 0 <= c["accepted"] <= t["counted_accepted"]
                assert 0 <= c["drafts"] <= t["drafts"]
        assert px.recorder.scraper.state.resets >= 1


async def test_failing_record_sink_never_breaks_traffic(tmp_path: Path) -> None:
    if not HAVE_DEV_FULL:
        pytest.skip("needs /dev/full to simulate a full disk")
    async with (
        running_sim(speed=50.0) as sim,
        running_proxy(sim.url, tmp_path, rec_record_path="/dev/full") as px,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(3):
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=16)) as r:
                assert r.status == 200
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
        for _ in range(200):
            if px.recorder.sink.errors:
                break
            await asyncio.sleep(0.01)
        async with s.get(px.url + "/specproxy/metrics") as r:
            text = await r.text()
        assert "specproxy_record_sink_errors_total" in text
        assert px.recorder.sink.errors >= 1 and not px.recorder.sink.healthy


async def test_fail_closed_refuses_traffic_when_records_fail(tmp_path: Path) -> None:
    if not HAVE_DEV_FULL:
        pytest.skip("needs /dev/full to simulate a full disk")
    async with (
        running_sim(speed=50.0) as sim,
        running_proxy(sim.url, tmp_path, rec_record_path="/dev/full", fail_closed=True) as px,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=8)) as r:
            assert r.status == 200
        for _ in range(200):
            if not px.recorder.sink.healthy:
                break
            await asyncio.sleep(0.01)
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=8)) as r:
            assert r.status == 503


async def test_sigterm_mid_stream_drains_and_loses_no_record(tmp_path: Path) -> None:
    record = tmp_path / "rec.jsonl"
    async with sim_process("--speed", "2") as sim_url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "specproxy",
            "proxy",
            "--upstream",
            sim_url,
            "--listen",
            "127.0.0.1:0",
            "--record",
            str(record),
            "--drain-timeout",
            "20",
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 20)
        url = line.split()[2].decode()
        async with aiohttp.ClientSession() as s:
            flowing = asyncio.Semaphore(0)

            async def stream() -> bytes:
                async with s.post(url + "/v1/chat/completions", json=chat_body(max_tokens=300)) as r:
                    body = await r.content.readany()
                    flowing.release()
                    return body + await r.read()

            tasks = [asyncio.create_task(stream()) for _ in range(3)]
            for _ in tasks:  # every stream flows, however slow the host: the signal comes mid-stream
                await asyncio.wait_for(flowing.acquire(), 20)
            proc.send_signal(signal.SIGTERM)
            bodies = await asyncio.gather(*tasks)
        rc = await asyncio.wait_for(proc.wait(), 30)
        assert rc == 0
        assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)  # in-flight streams finished
        recs = list(read_records(record))
        assert len(recs) == 3 and {r["outcome"] for r in recs} == {"ok"}
        assert all(orjson.dumps(r) for r in recs)
