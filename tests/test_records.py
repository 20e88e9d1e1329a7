"""Records: capture modes, secrets never written, rotation read back in order, older schema versions upgraded, and
a slow client pushing back on the upstream instead of filling the proxy's memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson
import pytest

from specproxy.core.record import SCHEMA_VERSION, RecordError, parse_line, read_records, record_files
from tests.proxyutil import running_proxy
from tests.simutil import chat_body, running_sim, split_sse
from tests.upstreams import Script, start_upstream


@pytest.mark.parametrize("capture", ["none", "request", "full"])
async def test_capture_modes_and_secrets(tmp_path: Path, capture: str) -> None:
    body = chat_body(max_tokens=24) | {"api_key": "sk-in-body", "metadata": {"password": "hunter2", "note": "kept"}}
    async with (
        running_sim(speed=50.0) as sim,
        running_proxy(sim.url, tmp_path, rec_capture=capture) as px,
        aiohttp.ClientSession(cookies={"session": "cookie-secret"}) as s,
    ):
        headers = {"Authorization": "Bearer sk-header", "X-Api-Key": "sk-x-header"}
        async with s.post(px.url + "/v1/chat/completions", json=body, headers=headers) as r:
            text = await r.read()
        await px.flush()
        (rec,) = px.records()
    raw = (tmp_path / "records.jsonl").read_bytes()
    for secret in (b"sk-in-body", b"hunter2", b"sk-header", b"sk-x-header", b"cookie-secret"):
        assert secret not in raw
    if capture == "none":
        assert rec["request"] is None and rec["response_text"] is None
    else:
        assert rec["request"]["messages"] == body["messages"]
        assert rec["request"]["metadata"] == {"password": "[redacted]", "note": "kept"}
    if capture == "full":
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in split_sse(text).json if c["choices"])
        assert rec["response_text"] == streamed and streamed
    else:
        assert rec["response_text"] is None


async def test_rotation_keeps_every_record_in_order(tmp_path: Path) -> None:
    async with (
        running_sim(speed=50.0) as sim,
        running_proxy(sim.url, tmp_path, rec_rotate_bytes=4000) as px,
        aiohttp.ClientSession() as s,
    ):
        ids = []
        for _ in range(12):
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=8)) as r:
                await r.read()
                ids.append(r.headers["X-Specproxy-Request-Id"])
            await px.flush()  # one by one, so that the file order is the request order
    files = record_files(tmp_path / "records.jsonl")
    assert len(files) > 2
    assert files[-1].name == "records.jsonl" and files[0].name.endswith(f".{len(files) - 1}")
    assert [r["request_id"] for r in read_records(tmp_path / "records.jsonl")] == ids


def test_older_schema_is_upgraded_and_newer_refused(tmp_path: Path) -> None:
    v0 = {"request_id": "abc", "timeline": [[0.1, 1], [0.2, 3]], "workload": "w"}
    rec = parse_line(orjson.dumps(v0))
    assert rec is not None and rec["schema_version"] == SCHEMA_VERSION and rec["chunks"] == [(0.1, 1), (0.2, 3)]
    assert rec["label"] is None and rec["cached_tokens"] is None
    with pytest.raises(RecordError, match="newer"):
        parse_line(orjson.dumps({"request_id": "x", "schema_version": 99}))
    # a version 1 line (no cached_tokens), and a version 2 line that has one
    v1 = {"schema_version": 1, "request_id": "def", "prompt_tokens": 40, "completion_tokens": 8, "label": "L"}
    rec = parse_line(orjson.dumps(v1))
    assert rec is not None and rec["schema_version"] == SCHEMA_VERSION and rec["cached_tokens"] is None
    assert rec["engine"] is None and rec["engine_timings"] is None  # before version 4: engine unknown
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["label"]) == (40, 8, "L")
    rec = parse_line(orjson.dumps({**v1, "schema_version": 2, "cached_tokens": 32}))
    assert rec is not None and rec["cached_tokens"] == 32
    rec = parse_line(orjson.dumps({**v1, "schema_version": 2, "cached_tokens": "lots"}))
    assert rec is not None and rec["cached_tokens"] is None  # the wrong type reads as missing
    v4 = {**v1, "schema_version": 4, "engine": "ollama", "engine_timings": {"decode_tokens": 9, "decode_s": "x"}}
    rec = parse_line(orjson.dumps(v4))
    assert rec is not None and rec["engine"] == "ollama" and rec["engine_timings"] == {"decode_tokens": 9}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(orjson.dumps(v0) + b"\n{oops\n")
    with pytest.raises(RecordError, match=r"bad\.jsonl:2"):
        list(read_records(bad))


async def test_slow_client_backpressures_the_upstream(tmp_path: Path) -> None:
    piece = b"data: " + b"x" * 65_000 + b"\n\n"
    pieces = [piece] * 400  # 26 MB
    done: list[float] = []

    def script(_: object, __: bytes) -> Script:
        return Script(pieces)

    up = await start_upstream(script)
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            loop = asyncio.get_running_loop()
            async with s.post(px.url + "/v1/chat/completions", json={}) as r:
                got = 0
                t0 = loop.time()
                while loop.time() - t0 < 1.0:  # a slow reader: 64 KiB every 50 ms
                    chunk = await r.content.read(65536)
                    got += len(chunk)
                    await asyncio.sleep(0.05)
                # the upstream could not run ahead: what it sent but the client did not read is bounded by
                # socket buffers, not the whole 26 MB
                assert up.completed[0] == 0
                done.append(got)
            await px.flush()
            (rec,) = px.records()
            assert rec["outcome"] == "client_cancelled"
    finally:
        await up.server.close()
    assert done[0] < 5_000_000
