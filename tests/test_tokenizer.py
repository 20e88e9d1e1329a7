"""Token counts without the server's usage: the model's own tokenizer.json (``--tokenizer PATH``), the engine's own
``POST /tokenize`` once per response (``--tokenizer server``), and ``cached_tokens`` from the server's usage.

The tokenizer is built here, trained in memory on a few sentences, so nothing is downloaded. Its counts differ from the
approximation's on long words, which is what shows the records used it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from specproxy.core.record import SCHEMA_VERSION, read_records
from specproxy.core.timeline import ResponseTimeline, with_counted_total
from specproxy.core.tokens import ApproxTokenizer, TokenizerError, load_model_tokenizer
from tests.proxyutil import proxy_process, running_proxy
from tests.upstreams import Script, start_upstream

pytest.importorskip("tokenizers", reason="the 'tokenizers' package (specproxy[tokenizer]) is needed")

SENTENCES = [
    "internationalization of the application needs careful configuration",
    "the proxy records every streamed chunk and its token count",
    "counting tokens exactly requires the model's own tokenizer",
]
# Chunks as an engine would stream them, one step each; long words make the approximation count differently.
PIECES = ["internationalization", " of the", " application", " needs careful", " configuration", "."]
TEXT = "".join(PIECES)


def make_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def count(path: Path, text: str) -> int:
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False).ids)


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_stream(pieces: list[str], *, usage: dict[str, Any] | None = None) -> list[bytes]:
    """A vLLM-shaped chat stream; with ``usage``, a final usage chunk (as include_usage without continuous stats)."""
    head = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        choice = {"index": 0, "delta": {"content": piece}, "finish_reason": "stop" if last else None}
        out.append(sse({**head, "choices": [choice]}))
    if usage is not None:
        out.append(sse({**head, "choices": [], "usage": usage}))
    return [*out, b"data: [DONE]\n\n"]


def body(stream: bool = True) -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


def test_counts_differ_from_the_approximation(tmp_path: Path) -> None:
    """The premise of the tests below: the approximation would give other counts than the model's tokenizer."""
    path = make_tokenizer(tmp_path)
    model = [count(path, p) for p in PIECES]
    assert model != [max(1, ApproxTokenizer().count(p)) for p in PIECES]
    tok = load_model_tokenizer(str(tmp_path))  # a folder holding tokenizer.json
    assert tok.source == "model_tokenizer" and [tok.count(p) for p in PIECES] == model


async def test_proxy_with_tokenizer_counts_a_stream_without_usage(tmp_path: Path) -> None:
    """``specproxy proxy --tokenizer PATH`` as a user runs it: every chunk is counted by that tokenizer."""
    path = make_tokenizer(tmp_path / "model")
    up = await start_upstream(lambda req, b: Script(chat_stream(PIECES)))
    record = tmp_path / "records.jsonl"
    try:
        async with proxy_process(up.url, record, "--tokenizer", str(path), "--metrics-url", "none") as (url, proc):
            async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body()) as r:
                assert (await r.read()).count(b"data:") == len(PIECES) + 2
            proc.terminate()  # type: ignore[attr-defined]
            await proc.wait()  # type: ignore[attr-defined]
    finally:
        await up.server.close()
    (rec,) = list(read_records(record))
    assert rec["token_source"] == "model_tokenizer"
    assert [n for _, n in rec["chunks"]] == [count(path, p) for p in PIECES]
    assert rec["completion_tokens"] == sum(count(path, p) for p in PIECES)
    assert "no_usage" in rec["flags"] and rec["cached_tokens"] is None


def tokenize_upstream(tok_path: Path | None, seen: list[dict[str, Any]]) -> Any:
    """A stream without usage, and a vLLM-shaped ``POST /tokenize`` counting with the given tokenizer (404 if
    none, as an engine without the endpoint)."""

    def script(req: web.Request, raw: bytes) -> Script:
        if req.path == "/tokenize":
            if tok_path is None:
                return Script([b'{"detail":"Not Found"}'], status=404, headers={"Content-Type": "application/json"})
            asked = orjson.loads(raw)
            seen.append(asked)
            n = count(tok_path, asked["prompt"])
            answer = {"count": n, "max_model_len": 4096, "tokens": list(range(n)), "token_strs": None}
            return Script([orjson.dumps(answer)], headers={"Content-Type": "application/json"})
        return Script(chat_stream(PIECES))

    return script


async def records_with_server_tokenize(up: Any, tmp_path: Path, requests: int = 1) -> list[Any]:
    """``requests`` chat streams through a proxy counting with the upstream's own /tokenize; their records."""
    try:
        over = {"rec_tokenizer": "server", "rec_tokenize_url": up.url + "/tokenize"}
        async with running_proxy(up.url, tmp_path, metrics=False, **over) as px:
            async with aiohttp.ClientSession() as s:
                for _ in range(requests):
                    async with s.post(px.url + "/v1/chat/completions", json=body()) as r:
                        await r.read()
            await px.flush()
            return px.records()
    finally:
        await up.server.close()


async def test_server_tokenize_counts_the_whole_response_once(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path / "model")
    seen: list[dict[str, Any]] = []
    recs = await records_with_server_tokenize(await start_upstream(tokenize_upstream(path, seen)), tmp_path, 2)
    assert seen == [{"model": "m", "prompt": TEXT, "add_special_tokens": False}] * 2  # one call per response
    total = count(path, TEXT)
    for rec in recs:
        assert rec["token_source"] == "server_tokenize" and rec["completion_tokens"] == total
        chunks = [n for _, n in rec["chunks"]]  # type: ignore[union-attr]
        assert sum(chunks) == total and all(n >= 1 for n in chunks) and len(chunks) == len(PIECES)
        assert "server_tokenize_failed" not in rec["flags"]  # type: ignore[operator]


async def test_server_tokenize_missing_keeps_local_counts_and_says_so(tmp_path: Path) -> None:
    (rec,) = await records_with_server_tokenize(await start_upstream(tokenize_upstream(None, [])), tmp_path)
    assert rec["token_source"] in ("tiktoken", "approx")
    assert "server_tokenize_failed" in rec["flags"]  # type: ignore[operator]
    assert rec["completion_tokens"] == sum(n for _, n in rec["chunks"])  # type: ignore[union-attr]


async def test_server_tokenize_is_not_called_when_usage_is_exact(tmp_path: Path) -> None:
    up = await start_upstream(
        lambda req, b: Script(chat_stream(PIECES, usage={"prompt_tokens": 3, "completion_tokens": 9}))
    )
    (rec,) = await records_with_server_tokenize(up, tmp_path)
    assert rec["completion_tokens"] == 9
    assert all(h["path"] != "/tokenize" for h in up.seen)


def test_with_counted_total_keeps_a_token_per_step() -> None:
    import dataclasses

    tl = ResponseTimeline(0, stream=True).result(0)
    tl = dataclasses.replace(tl, chunks=[(0.1, 1), (0.2, 3), (0.3, 0), (0.4, 2)])
    out = with_counted_total(tl, 10, "server_tokenize")
    assert [n for _, n in out.chunks] == [1, 6, 0, 3] and out.completion_tokens == 10
    assert out.token_source == "server_tokenize"
    few = with_counted_total(tl, 2, "server_tokenize")  # fewer than the steps: chunks left as they were
    assert few.chunks == tl.chunks and few.completion_tokens == 2


# -- cached_tokens ---------------------------------------------------------------------------------------------------
def timeline_of(pieces: list[bytes]) -> Any:
    tl = ResponseTimeline(0, stream=True)
    for i, piece in enumerate(pieces):
        tl.feed(i * 1_000_000, piece)
    return tl.result(len(pieces) * 1_000_000)


def test_cached_tokens_from_the_final_usage_chunk() -> None:
    usage = {"prompt_tokens": 40, "completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 32}}
    res = timeline_of(chat_stream(PIECES, usage=usage))
    assert (res.prompt_tokens, res.completion_tokens, res.cached_tokens) == (40, 6, 32)
    # vLLM without --enable-prompt-tokens-details sends null: nothing known
    res = timeline_of(chat_stream(PIECES, usage={**usage, "prompt_tokens_details": None}))
    assert res.cached_tokens is None and "bad_usage" not in res.flags
    res = timeline_of(chat_stream(PIECES, usage={**usage, "prompt_tokens_details": {"cached_tokens": -1}}))
    assert res.cached_tokens is None and "bad_usage" in res.flags


async def test_record_keeps_cached_tokens_of_a_non_streamed_response(tmp_path: Path) -> None:
    answer = {
        "id": "chatcmpl-n",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 48}},
    }
    up = await start_upstream(
        lambda req, b: Script([orjson.dumps(answer)], headers={"Content-Type": "application/json"})
    )
    try:
        async with running_proxy(up.url, tmp_path, metrics=False) as px:
            async with aiohttp.ClientSession() as s, s.post(px.url + "/v1/chat/completions", json=body(False)) as r:
                await r.read()
            await px.flush()
            (rec,) = px.records()
    finally:
        await up.server.close()
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["cached_tokens"]) == (50, 7, 48)
    assert rec["schema_version"] == SCHEMA_VERSION


# -- bad values --------------------------------------------------------------------------------------------------------
def cli(*args: str, env: dict[str, str] | None = None, pre: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys; {pre}from specproxy.cli import main; main(sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=env, cwd="/"
    )


@pytest.mark.parametrize("command", ["proxy", "run", "replay"])
def test_bad_tokenizer_is_one_line_exit_2(tmp_path: Path, command: str) -> None:
    garbage = tmp_path / "tokenizer.json"
    garbage.write_text('{"not": "a tokenizer"}')
    empty_cache = tmp_path / "hub"
    empty_cache.mkdir()
    import os

    env = {**os.environ, "HF_HUB_CACHE": str(empty_cache), "HF_HUB_OFFLINE": "1"}
    recording = tmp_path / "rec.jsonl"
    recording.write_text('{"request_id": "a", "schema_version": 1}\n')
    base = {
        "proxy": ["proxy", "--upstream", "http://127.0.0.1:9", "--record", "-"],
        "run": ["run", "--target", "http://127.0.0.1:9", "--workload", "ja_chat", "--out", str(tmp_path / "o.jsonl")],
        "replay": ["replay", str(recording), "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o.jsonl")],
    }[command]
    for value, needle in (
        (str(tmp_path / "missing.json"), "no tokenizer at"),
        (str(garbage), "cannot read tokenizer"),
        ("Org/NotCached", "nothing is downloaded"),
        ("", "--tokenizer"),
    ):
        p = cli(*base, "--tokenizer", value, env=env)
        assert p.returncode == 2, (value, p.returncode, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert needle in p.stderr, p.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_tokenizer_without_the_package_says_how_to_install(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path)
    p = cli(
        "proxy", "--upstream", "http://127.0.0.1:9", "--record", "-", "--tokenizer", str(path),
        pre="sys.modules['tokenizers'] = None; ",
    )  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "pip install 'specproxy[tokenizer]'" in p.stderr


def test_model_name_from_the_local_hugging_face_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORG/NAME is read from the hub cache's own layout (refs/main -> snapshot) and never fetched."""
    repo = tmp_path / "hub" / "models--acme--tiny"
    make_tokenizer(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    tok = load_model_tokenizer("acme/tiny")
    assert tok.name.endswith("snapshots/abc123/tokenizer.json") and tok.count(TEXT) > 0
    with pytest.raises(TokenizerError, match="nothing is downloaded"):
        load_model_tokenizer("acme/absent")
    with pytest.raises(TokenizerError, match="nothing is downloaded"):
        load_model_tokenizer("../acme")  # a path that is not there, never read as a name
