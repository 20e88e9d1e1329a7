"""A buffering hop between the engine and the proxy, end to end: ``specproxy sim`` -> a hop -> ``specproxy proxy``
-> a client. The hop here is a small aiohttp server that forwards the stream in 4 or 8 KiB clumps (and the rest at
the end), as a proxy with a buffer does; the proxy's ``/specproxy/status`` and ``specproxy report`` must say
buffered, and the same without the hop must not. With nginx installed, the same through a real nginx."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from typer.testing import CliRunner

from specproxy.cli import app as cli_app
from tests.proxyutil import proxy_process
from tests.simutil import chat_body, sim_process

pytestmark = pytest.mark.slow

REQUESTS = 8
MIN_RESPONSES = 6  # responses the proxy must have judged before its status is read
UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
CLUMP = web.AppKey("clump", int)


async def _clumping(request: web.Request) -> web.StreamResponse:
    """Forward one exchange upstream; hand the answer on ``CLUMP`` bytes at a time, the rest when it ends."""
    size = request.app[CLUMP]
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
    async with request.app[SESSION].request(
        request.method, request.app[UPSTREAM] + request.path_qs, data=await request.read(), headers=headers
    ) as up:
        resp = web.StreamResponse(status=up.status)
        resp.content_type = up.content_type
        try:
            await resp.prepare(request)
            held = bytearray()
            async for data in up.content.iter_any():
                held += data
                while len(held) >= size:
                    await resp.write(bytes(held[:size]))
                    del held[:size]
            if held:
                await resp.write(bytes(held))
            await resp.write_eof()
        except ConnectionResetError:  # the proxy went away (its last scrape as it stops): nobody to tell
            pass
        return resp


@asynccontextmanager
async def clumping_hop(upstream: str, size: int) -> AsyncIterator[str]:
    hop = web.Application()
    hop[UPSTREAM] = upstream
    hop[CLUMP] = size
    hop.router.add_route("*", "/{tail:.*}", _clumping)
    async with aiohttp.ClientSession() as session:
        hop[SESSION] = session
        runner = web.AppRunner(hop)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def nginx(upstream: str, tmp: Path, extra: str) -> AsyncIterator[str]:
    """A real nginx (one process, no daemon) proxying to ``upstream`` with ``proxy_buffering on``."""
    port = _free_port()
    conf = tmp / "nginx.conf"
    temp = " ".join(f"{k}_temp_path {tmp / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf.write_text(
        f"daemon off; master_process off; pid {tmp / 'nginx.pid'}; error_log {tmp / 'error.log'} warn;\n"
        "events { worker_connections 64; }\n"
        f"http {{ access_log off; {temp}\n"
        f"  server {{ listen 127.0.0.1:{port};\n"
        f"    location / {{ proxy_pass {upstream}; proxy_http_version 1.1; proxy_buffering on; {extra} }} }} }}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        shutil.which("nginx") or "nginx", "-p", str(tmp), "-c", str(conf), stderr=asyncio.subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # wait until it listens
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                assert proc.returncode is None, (await proc.stderr.read()) if proc.stderr else b""
                assert time.monotonic() < deadline, "nginx did not start listening"
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def _traffic_and_status(upstream: str, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Streamed requests through ``specproxy proxy`` in front of ``upstream``; the proxy's buffering verdict once it
    judged enough of them, and its record file (written by the time this returns)."""
    record = tmp_path / "records.jsonl"
    async with proxy_process(upstream, record) as (url, _), aiohttp.ClientSession() as session:

        async def one(i: int) -> None:
            body = chat_body(f"request {i}: write a parser for arithmetic expressions", max_tokens=96)
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()

        for batch in range(0, REQUESTS, 4):
            await asyncio.gather(*(one(i) for i in range(batch, batch + 4)))
        deadline = time.monotonic() + 60
        while True:
            async with session.get(url + "/specproxy/status") as resp:
                status = await resp.json()
            verdict: dict[str, Any] = status["path"]["buffering"]
            if verdict["evidence"]["responses"] >= MIN_RESPONSES:
                return verdict, record
            assert time.monotonic() < deadline, verdict
            await asyncio.sleep(0.1)


def _report(record: Path, fmt: str) -> str:
    result = CliRunner().invoke(cli_app, ["report", str(record), "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.output


def _report_verdict(record: Path) -> tuple[str, str]:
    doc = orjson.loads(_report(record, "json"))
    (path,) = doc["paths"].values()
    return path["buffering"]["verdict"], _report(record, "table")


SIM_ARGS = ("--speed", "2", "--spec-method", "mtp")


@pytest.mark.parametrize("clump", [4096, 8192])
async def test_a_hop_that_clumps_the_stream_is_detected(tmp_path: Path, clump: int) -> None:
    async with sim_process(*SIM_ARGS) as sim, clumping_hop(sim, clump) as hop:
        verdict, record = await _traffic_and_status(hop, tmp_path)
    assert verdict["verdict"] == "buffered", verdict
    assert verdict["evidence"]["median_events_per_read"] >= 4
    assert verdict["evidence"]["buffer_sized_read_share"] > 0.2  # 96 tokens of ~335-byte events: 4-8 full reads
    kind, text = _report_verdict(record)
    assert kind == "buffered"
    assert "warning: the path looks buffered" in text


async def test_the_direct_path_is_not_buffered(tmp_path: Path) -> None:
    async with sim_process(*SIM_ARGS) as sim:
        verdict, record = await _traffic_and_status(sim, tmp_path)
    assert verdict["verdict"] == "unbuffered", verdict
    assert verdict["evidence"]["median_events_per_read"] <= 2  # one, but a busy host may coalesce
    kind, text = _report_verdict(record)
    assert kind == "unbuffered"
    assert "looks buffered" not in text


needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")


@needs_nginx
@pytest.mark.skipif(os.name != "posix", reason="nginx is started as a POSIX process")
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # proxy_buffering alone: nginx passes on what it read as soon as the client can take it (a fast local
        # client always can), so the stream is not clumped and must not be called buffered
        ("", "unbuffered"),
        # gzip on event streams holds the stream in its buffers: short responses come whole at their end
        ("gzip on; gzip_types text/event-stream; gzip_min_length 0;", "buffered"),
    ],
    ids=["proxy_buffering", "proxy_buffering+gzip"],
)
async def test_a_real_nginx_in_front_of_the_sim(tmp_path: Path, extra: str, expected: str) -> None:
    async with sim_process(*SIM_ARGS) as sim, nginx(sim, tmp_path, extra) as front:
        verdict, record = await _traffic_and_status(front, tmp_path)
    assert verdict["verdict"] == expected, verdict
    assert _report_verdict(record)[0] == expected
