"""Records that survive anything, and nothing on disk that should not be: a real proxy with ``--capture full`` writes
no secret of any form a client may send, keeps what replay needs, records bodies nested too deep as a placeholder
without flooding the log; negative usage is not a count; trace lengths are bounded; replay never sends a recorded
path that would leave the target."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from specproxy.core.openai_stream import interpret_json
from specproxy.core.record import as_record
from specproxy.core.redact import REDACTED, TOO_DEEP
from specproxy.core.timeline import ResponseTimeline
from specproxy.loadgen.replay import plan_replay
from specproxy.workloads import WorkloadError, load_workload
from tests.proxyutil import running_proxy
from tests.upstreams import Script, capture_pieces, start_upstream

# One distinct secret per form a client may use; none of them may reach the record file.
S = {name: f"SECRET-{name}-7f3a9c" for name in ("openai", "token", "bearer", "invalid", "form", "query", "multi")}
S["sk"] = "sk-proj-Q1w2E3r4T5y6U7i8O9p0"
S["text"] = "Zx81-TEXT-bearer-credential"
HEADERS = {"Authorization": "Bearer SECRET-header-1", "Cookie": "session=SECRET-cookie-2", "X-Api-Key": "SECRET-x-3"}


def _sse_upstream() -> Any:
    pieces = capture_pieces("chat-stream-ngram-k3-code.sse")
    return start_upstream(lambda req, body: Script(pieces))


async def test_no_secret_of_any_form_reaches_the_record_file(tmp_path: Path) -> None:
    json_body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"here is my key {S['sk']} thanks"}],
        "stream": True,
        "openai_api_key": S["openai"],
        "token": S["token"],
        "auth": {"bearer": S["bearer"]},
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "top_k": 20,
        "logit_bias": {"50256": -100},
        "skip_special_tokens": False,
        "stop_token_ids": [2],
        "truncate_prompt_tokens": 512,
    }
    multipart = (
        f'--bnd\r\nContent-Disposition: form-data; name="password"\r\n\r\n{S["multi"]}\r\n'
        '--bnd\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n--bnd--\r\n'
    )
    bodies: list[tuple[bytes, str]] = [
        (orjson.dumps(json_body), "application/json"),
        (b'{"model": "m", "api_key": "' + S["invalid"].encode() + b'", "max_tokens": 8,', "application/json"),
        (f"api_key={S['form']}&model=m&max_tokens=8".encode(), "application/x-www-form-urlencoded"),
        (f"?token={S['query']}&top_k=3".encode(), "application/x-www-form-urlencoded"),
        (multipart.encode(), "multipart/form-data; boundary=bnd"),
        (f"model: m\nAuthorization: Token {S['text']}\n".encode(), "text/plain"),
    ]
    up = await _sse_upstream()
    try:
        async with (
            running_proxy(up.url, tmp_path, metrics=False, rec_capture="full") as px,
            aiohttp.ClientSession() as s,
        ):
            for data, ctype in bodies:
                headers = {**HEADERS, "Content-Type": ctype}
                async with s.post(px.url + "/v1/chat/completions", data=data, headers=headers) as r:
                    assert r.status == 200
                    await r.read()
            await px.flush()
            records = px.records()
    finally:
        await up.server.close()
    raw = (tmp_path / "records.jsonl").read_bytes()
    for secret in [*S.values(), "SECRET-header-1", "SECRET-cookie-2", "SECRET-x-3"]:
        assert secret.encode() not in raw, secret
    assert len(records) == len(bodies)
    req = records[0]["request"]
    assert isinstance(req, dict)
    for kept in ("max_tokens", "max_completion_tokens", "top_k", "logit_bias", "skip_special_tokens", "stop_token_ids"):
        assert req[kept] == json_body[kept], kept
    assert req["truncate_prompt_tokens"] == 512 and req["auth"] == REDACTED
    assert req["messages"][0]["content"] == f"here is my key {REDACTED} thanks"
    assert all(isinstance(r["request"], str) and REDACTED in r["request"] for r in records[1:])


@pytest.mark.parametrize("depth", [300, 1_000, 100_000])
async def test_a_body_nested_too_deep_is_still_one_record_and_a_quiet_log(
    tmp_path: Path, depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = b'{"model": "m", "x": ' + b"[" * depth + b"]" * depth + b"}"
    up = await _sse_upstream()
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            async with s.post(px.url + "/v1/chat/completions", data=body) as r:
                assert r.status == 200
                await r.read()
            await px.flush()
            records = px.records()
            dropped = px.recorder.sink.dropped
    finally:
        await up.server.close()
    (rec,) = records
    assert rec["request"] == TOO_DEEP and rec["outcome"] == "ok" and dropped == 0
    assert "body_too_deep" in rec["flags"]
    assert rec["completion_tokens"] == 101  # the response was recorded as ever
    assert len(caplog.text) < 2_000, caplog.text[:2_000]


# -- usage: a negative count is no count ---------------------------------------------------------------------------
def test_negative_usage_is_missing_and_marked() -> None:
    c = interpret_json({"choices": [], "usage": {"prompt_tokens": -5, "completion_tokens": 7}})
    assert (c.prompt_tokens, c.completion_tokens, c.bad_usage) == (None, 7, True)
    c = interpret_json({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": -1}})
    assert (c.prompt_tokens, c.completion_tokens, c.bad_usage) == (5, None, True)
    c = interpret_json({"choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 0}})
    assert (c.prompt_tokens, c.completion_tokens, c.bad_usage) == (0, 0, False)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_negative_usage_never_becomes_a_record_count() -> None:
    tl = ResponseTimeline(0, stream=True)
    delta = {"index": 0, "delta": {"content": "hello there"}, "finish_reason": None}
    tl.feed(1_000_000, _event({"id": "x", "choices": [delta]}))
    tl.feed(2_000_000, _event({"id": "x", "choices": [delta]}))
    tl.feed(3_000_000, _event({"id": "x", "choices": [], "usage": {"prompt_tokens": -9, "completion_tokens": -4}}))
    tl.feed(4_000_000, b"data: [DONE]\n\n")
    res = tl.result(5_000_000)
    assert res.prompt_tokens is None and res.completion_tokens is not None and res.completion_tokens > 0
    assert "bad_usage" in res.flags
    body = ResponseTimeline(0, stream=False)
    body.feed(1_000_000, orjson.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": -1}}))
    assert "bad_usage" in body.result(2_000_000).flags and body.result(2_000_000).prompt_tokens is None


async def test_negative_usage_reaches_the_record_as_a_flag(tmp_path: Path) -> None:
    delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}
    pieces = [
        _event({"id": "x", "choices": [delta], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
        _event({"id": "x", "choices": [delta], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
        _event({"id": "x", "choices": [], "usage": {"prompt_tokens": -3, "completion_tokens": -2}}),
        b"data: [DONE]\n\n",
    ]
    up = await start_upstream(lambda req, body: Script(pieces))
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px, aiohttp.ClientSession() as s:
            async with s.post(px.url + "/v1/chat/completions", json={"model": "m", "stream": True}) as r:
                await r.read()
            await px.flush()
            (rec,) = px.records()
    finally:
        await up.server.close()
    assert "bad_usage" in rec["flags"]
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (3, 2)  # the last sound figures, never -3 / -2


# -- trace lengths -------------------------------------------------------------------------------------------------
def _error_of(path: Path) -> str:
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    return str(info.value)


@pytest.mark.timeout(20)  # before the bound, a trace asking 10^11 tokens built its prompt until memory ran out
@pytest.mark.parametrize("length", [10_000_001, 99_999_999_999])
@pytest.mark.parametrize("key", ["input_length", "output_length"])
def test_mooncake_lengths_are_bounded(tmp_path: Path, key: str, length: int) -> None:
    line = {"timestamp": 0, "input_length": 10, "output_length": 10, "hash_ids": [1]}
    path = tmp_path / "t.jsonl"
    path.write_text(orjson.dumps({**line, "output_length": 10_000_000}).decode() + "\n")
    assert load_workload(str(path)).items[0].max_tokens == 10_000_000  # the bound itself is a length a trace may ask
    path.write_text(orjson.dumps(line).decode() + "\n" + orjson.dumps({**line, key: length}).decode() + "\n")
    message = _error_of(path)
    assert message.startswith(f"{path}:2: {key} {length} is beyond the 10,000,000 tokens") and "\n" not in message


@pytest.mark.timeout(20)
@pytest.mark.parametrize("column", [1, 2])
def test_azure_lengths_are_bounded(tmp_path: Path, column: int) -> None:
    row = ["2023-11-16 18:15:46.6805900", "4808", "10"]
    row[column] = "99999999999"
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:45.0,1,1\n" + ",".join(row) + "\n")
    name = ("ContextTokens", "GeneratedTokens")[column - 1]
    assert _error_of(path).startswith(f"{path}:3: {name} 99999999999 is beyond")


# -- replay paths --------------------------------------------------------------------------------------------------
def _rec(rid: str, path: str, request: Any = None) -> Any:
    request = {"model": "m"} if request is None else request
    return as_record({"request_id": rid, "started_at": 1.0, "method": "POST", "path": path, "request": request})


@pytest.mark.parametrize(
    "path",
    ["@evil.example:80/x", "//evil.example/x", "v1/chat/completions", "/v1/x\r\nHost: evil", "/v1 /x", "/\\evil"],
)
def test_replay_never_sends_a_path_that_leaves_the_target(path: str) -> None:
    plan = plan_replay([_rec("ok", "/v1/chat/completions"), _rec("bad", path), _rec("none", "")], speed=None)
    assert [e.path for _, e in plan.timed] == ["/v1/chat/completions", "/v1/chat/completions"]
    assert [e.replay_of for _, e in plan.timed] == ["ok", "none"]  # no path recorded: the default endpoint
    assert plan.bad_path == 1
    assert any(n.startswith("1 of 3 recorded requests had a path that does not start with") for n in plan.notes())


def test_replay_counts_bodies_it_could_not_capture() -> None:
    plan = plan_replay([_rec("deep", "/v1/chat/completions", TOO_DEEP), _rec("form", "/v1/x", "a=1")], speed=None)
    assert plan.timed == () and (plan.not_json, plan.no_body) == (2, 0)
    assert plan.notes() == ["2 of 2 recorded requests had a body that is not a JSON object (text, or nested too deep "
                            "to capture): not replayed"]  # fmt: skip


async def test_a_key_the_model_echoes_is_not_written_with_capture_full(tmp_path: Path) -> None:
    key = "sk-proj-4f9c2b7e1a0d8c6b5a4f3e2d1c0b9a8f"
    app = web.Application()

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in ("your key is ", key, " keep it safe"):
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": piece}}],
            }
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with running_proxy(f"http://127.0.0.1:{port}", tmp_path, metrics=False, rec_capture="full") as px:
            async with aiohttp.ClientSession() as s, s.post(px.url + "/v1/chat/completions", json={"model": "m"}) as r:
                assert key in (await r.read()).decode()  # the client gets the text as it came
            await px.flush()
            (rec,) = px.records()
    finally:
        await runner.cleanup()
    assert rec["response_text"] is not None and "keep it safe" in rec["response_text"]
    assert key not in px.record.read_text()
