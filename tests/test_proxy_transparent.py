"""The proxy is transparent: bytes, headers and timing of what the client sees are what the upstream sent."""

from __future__ import annotations

import asyncio
import gzip
import io
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.proxyutil import running_proxy
from tests.upstreams import DATA, Script, capture_pieces, start_upstream


async def fetch(url: str, **kw: object) -> tuple[int, dict[str, str], bytes, list[tuple[float, bytes]]]:
    arrivals: list[tuple[float, bytes]] = []
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(auto_decompress=False) as s, s.request(kw.pop("method", "POST"), url, **kw) as r:  # type: ignore[arg-type]
        body = bytearray()
        async for piece in r.content.iter_any():
            arrivals.append((loop.time(), piece))
            body += piece
        return r.status, dict(r.headers), bytes(body), arrivals


@pytest.mark.parametrize("capture", sorted(p.name for p in DATA.glob("*.sse")))
async def test_sse_capture_byte_identical(capture: str, tmp_path: Path) -> None:
    pieces = capture_pieces(capture)
    up = await start_upstream(lambda req, body: Script(pieces))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            req = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
            status, headers, body, _ = await fetch(
                px.url + "/v1/chat/completions?x=1", data=req, headers={"Content-Type": "application/json"}
            )
            assert status == 200
            assert body == b"".join(pieces)
            assert headers["X-Accel-Buffering"] == "no"
            assert headers["Content-Type"].startswith("text/event-stream")
            assert len(headers["X-Specproxy-Request-Id"]) == 16
            assert up.seen[0]["body"] == req and up.seen[0]["path"] == "/v1/chat/completions?x=1"
            await px.flush()
            (rec,) = px.records()
            assert rec["outcome"] == "ok" and rec["stream"] is True
            assert rec["request_id"] == headers["X-Specproxy-Request-Id"]
    finally:
        await up.server.close()


AWKWARD = [
    b": keep-alive\r\n\r\n",
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\r\n\r\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"a',
    b'b"}}]}\r',
    b"\n\r\n",
    b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 300_000 + b'"}}]}\n\n',
    b'event: message\nid: 3\ndata: {"choices":[{"index":0,"delta":{"content":"\\u3053\\u3093"}}]}\r\r',
    b"data: not json at all\n\n",
    'data: {"choices":[{"index":0,"delta":{"content":"日本'.encode()[:-1],
    'data: {"choices":[{"index":0,"delta":{"content":"日本'.encode()[-1:] + '語"}}]}\n\n'.encode(),
    b"data: [DONE]\n\n",
]


async def test_awkward_sse_passthrough_and_recorded(tmp_path: Path) -> None:
    up = await start_upstream(lambda req, body: Script(AWKWARD, pause_s=0.01))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            status, _, body, arrivals = await fetch(px.url + "/v1/chat/completions", data=b'{"stream":true}')
            assert status == 200 and body == b"".join(AWKWARD)
            assert len(arrivals) >= 5  # relayed as it came, not buffered into one piece
            await px.flush()
            (rec,) = px.records()
            assert rec["keepalives"] == 1
            assert "non_json_events" in rec["flags"]
            assert rec["token_source"] in ("tiktoken", "approx")
            assert "no_usage" in rec["flags"]
            assert len(rec["chunks"]) == 4  # ab, the huge line, こん, 日本語
    finally:
        await up.server.close()


async def test_streaming_is_not_buffered(tmp_path: Path) -> None:
    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")[:12]
    up = await start_upstream(lambda req, body: Script(pieces, pause_s=0.05))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            _, _, _, arrivals = await fetch(px.url + "/v1/chat/completions", data=b"{}")
            assert len(arrivals) >= 10
            span = arrivals[-1][0] - arrivals[0][0]
            assert span > 0.3  # 11 gaps of 50 ms arrived spread out, not all at the end
    finally:
        await up.server.close()


async def test_large_non_streaming_body_with_content_length_and_gzip(tmp_path: Path) -> None:
    big = orjson.dumps({"choices": [{"index": 0, "message": {"content": "y" * (12 * 1024 * 1024)}}]})
    gz = gzip.compress(big, compresslevel=1)
    script = Script(
        [gz[i : i + 100_000] for i in range(0, len(gz), 100_000)],
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip", "X-Custom": "1"},
        content_length=True,
    )
    up = await start_upstream(lambda req, body: script)
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            status, headers, body, _ = await fetch(px.url + "/v1/chat/completions", data=b"{}")
            assert status == 200
            assert body == gz  # not decompressed on the way
            assert headers["Content-Encoding"] == "gzip"
            assert headers["Content-Length"] == str(len(gz))
            assert headers["X-Custom"] == "1"
            # a client that decompresses gets the original
            async with aiohttp.ClientSession() as s, s.post(px.url + "/v1/x", data=b"{}") as r:
                assert await r.read() == big
    finally:
        await up.server.close()


async def test_large_request_body_and_limit(tmp_path: Path) -> None:
    up = await start_upstream(lambda req, body: Script([b'{"ok":true}'], headers={"Content-Type": "application/json"}))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False, max_body_bytes=20 * 1024 * 1024) as px:
            payload = b'{"prompt":"' + b"z" * (15 * 1024 * 1024) + b'"}'
            status, _, _, _ = await fetch(px.url + "/v1/completions", data=io.BytesIO(payload))
            assert status == 200 and up.seen[-1]["body"] == payload
            # forwarded in the pieces it came in, still with its length: not re-framed as chunked
            headers = up.seen[-1]["headers"]
            assert isinstance(headers, dict) and headers.get("Content-Length") == str(len(payload))
            assert "Transfer-Encoding" not in headers

            # a chunked request body of the same size: forwarded with the length it turned out to have
            async def chunked() -> AsyncIterator[bytes]:
                for i in range(0, len(payload), 1 << 20):
                    yield payload[i : i + (1 << 20)]

            status, _, _, _ = await fetch(px.url + "/v1/completions", data=chunked())
            assert status == 200 and up.seen[-1]["body"] == payload
            assert up.seen[-1]["headers"].get("Content-Length") == str(len(payload))  # type: ignore[attr-defined]
            status, _, _, _ = await fetch(px.url + "/v1/completions", data=io.BytesIO(b"z" * (21 * 1024 * 1024)))
            assert status == 413
    finally:
        await up.server.close()


async def test_every_method_and_header_rules(tmp_path: Path) -> None:
    up = await start_upstream(lambda req, body: Script([b"ok"], headers={"Content-Type": "text/plain"}))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"):
                status, _, _, _ = await fetch(
                    px.url + "/any/path",
                    method=method,
                    headers={
                        "X-Specproxy-Workload": "ja_chat",
                        "Authorization": "Bearer sk-secret",
                        "Connection": "keep-alive, X-Hop",
                        "X-Hop": "1",
                        "X-Keep": "2",
                    },
                )
                assert status == 200
                h = up.seen[-1]["headers"]
                assert isinstance(h, dict)
                assert up.seen[-1]["method"] == method
                assert "X-Specproxy-Workload" not in h and "X-Hop" not in h
                assert h["X-Keep"] == "2" and h["Authorization"] == "Bearer sk-secret"
            await px.flush()
            # relayed alike, but none of these methods asks an engine to generate: counted, not recorded
            assert px.records() == []
            assert px.recorder.status()["passthrough"] == {"other": {"ok": 5}}
            assert px.recorder.status()["workloads"] == {}
    finally:
        await up.server.close()


async def test_openai_client_streams_through_the_proxy(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")
    up = await start_upstream(lambda req, body: Script(pieces))

    def run(base: str) -> tuple[str, int | None]:
        client = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
        text = []
        usage = None
        with client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text.append(chunk.choices[0].delta.content)
                if chunk.usage:
                    usage = chunk.usage.completion_tokens
        client.close()
        return "".join(text), usage

    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            direct = await asyncio.to_thread(run, up.url)
            proxied = await asyncio.to_thread(run, px.url)
            assert proxied == direct
            assert direct[1] == 101 and direct[0].startswith("```python")
            await px.flush()
            (rec,) = px.records()
            assert rec["completion_tokens"] == 101
            assert rec["token_source"] == "usage"
            assert b"sk-test" not in px.record.read_bytes()
    finally:
        await up.server.close()


async def test_own_metrics_and_status_not_forwarded(tmp_path: Path) -> None:
    up = await start_upstream(lambda req, body: Script([b"x"]))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            async with s.get(px.url + "/specproxy/metrics") as r:
                assert r.status == 200
                assert "specproxy_in_flight_requests" in await r.text()
            async with s.get(px.url + "/specproxy/status") as r:
                assert (await r.json())["in_flight"] == 0
            assert up.seen == []
    finally:
        await up.server.close()


async def test_gzip_event_stream_relayed_compressed_and_still_recorded(tmp_path: Path) -> None:
    pieces = capture_pieces("chat-stream-draftmodel-k3-code.sse")
    comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    gz = [comp.compress(p) + comp.flush(zlib.Z_SYNC_FLUSH) for p in pieces] + [comp.flush()]
    headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
    up = await start_upstream(lambda req, body: Script(gz, headers=headers))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False, rec_k=3) as px:
            status, h, body, _ = await fetch(px.url + "/v1/chat/completions", data=b"{}")
            assert status == 200 and h["Content-Encoding"] == "gzip" and body == b"".join(gz)
            await px.flush()
            (rec,) = px.records()
            assert rec["completion_tokens"] == 93 and rec["token_source"] == "usage"
            assert rec["spec"]["accepted"] == 69
    finally:
        await up.server.close()


async def test_several_choices_are_not_steps(tmp_path: Path) -> None:
    def chunk(index: int, text: str, done: int) -> bytes:
        c = {"choices": [{"index": index, "delta": {"content": text}}], "usage": {"completion_tokens": done}}
        return b"data: " + orjson.dumps(c) + b"\n\n"

    pieces = [chunk(0, "a", 1), chunk(1, "b", 2), chunk(0, "cd", 4), chunk(1, "e", 5), b"data: [DONE]\n\n"]
    up = await start_upstream(lambda req, body: Script(pieces))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False, rec_k=3) as px:
            await fetch(px.url + "/v1/chat/completions", data=b'{"n": 2, "stream": true}')
            await px.flush()
            (rec,) = px.records()
            assert "several_choices" in rec["flags"] and rec["chunks_are_steps"] is False
    finally:
        await up.server.close()


async def test_decompression_bomb_is_relayed_but_not_inflated(tmp_path: Path) -> None:
    bomb = gzip.compress(b"data: " + b"0" * (200 * 1024 * 1024), compresslevel=9)  # ~200 KB that inflate to 200 MB
    headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
    up = await start_upstream(
        lambda req, body: Script([bomb[i : i + 65536] for i in range(0, len(bomb), 65536)], headers=headers)
    )
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            status, _, body, _ = await fetch(px.url + "/v1/chat/completions", data=b"{}")
            assert status == 200 and body == bomb
            await px.flush()
            (rec,) = px.records()
            assert "compressed_not_parsed" in rec["flags"] and rec["outcome"] == "ok"
    finally:
        await up.server.close()


async def test_endless_line_stops_recording_not_relaying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specproxy.core import timeline

    monkeypatch.setattr(timeline, "EVENT_PARSE_LIMIT", 1_000_000)
    pieces = [b'data: {"x": "'] + [b"y" * 65536] * 40 + [b'"}\n\n', b"data: [DONE]\n\n"]
    up = await start_upstream(lambda req, body: Script(pieces))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            status, _, body, _ = await fetch(px.url + "/v1/chat/completions", data=b"{}")
            assert status == 200 and body == b"".join(pieces)
            await px.flush()
            (rec,) = px.records()
            assert "event_too_large" in rec["flags"] and rec["outcome"] == "ok"
    finally:
        await up.server.close()
