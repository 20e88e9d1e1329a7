"""The plan's OpenAI chat body said the way each other API says it (specproxy.loadgen.dialect_bodies): streaming
always on, temperature and the token limit under each API's own name, system messages where each API wants them."""

from __future__ import annotations

from typing import Any

import pytest

from specproxy.loadgen.dialect_bodies import DIALECT_ENDPOINTS, dialect_body

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
CHAT: dict[str, Any] = {"model": "m", "messages": MSGS, "max_tokens": 32, "temperature": 0.5}
NO_LIMIT: dict[str, Any] = {"model": "m", "messages": MSGS}


def test_every_endpoint_has_its_path() -> None:
    assert {e: dialect_body(e, CHAT)[0] for e in DIALECT_ENDPOINTS} == DIALECT_ENDPOINTS


def test_ollama() -> None:
    assert dialect_body("ollama-chat", CHAT) == (
        "/api/chat",
        {"model": "m", "stream": True, "messages": MSGS, "options": {"temperature": 0.5, "num_predict": 32}},
    )
    assert dialect_body("ollama-generate", NO_LIMIT) == (
        "/api/generate",
        {"model": "m", "stream": True, "prompt": "Be brief.\n\nHi", "options": {"temperature": 0.0}},
    )


def test_anthropic_messages_take_the_system_apart_and_need_a_limit() -> None:
    assert dialect_body("messages", CHAT)[1] == {
        "model": "m", "messages": [MSGS[1]], "max_tokens": 32, "temperature": 0.5, "stream": True,
        "system": "Be brief.",
    }  # fmt: skip
    body = dialect_body("messages", {"model": "m", "messages": [MSGS[1]]})[1]
    assert body["max_tokens"] == 1024 and "system" not in body


def test_responses() -> None:
    assert dialect_body("responses", CHAT)[1] == {
        "model": "m", "input": MSGS, "temperature": 0.5, "stream": True, "max_output_tokens": 32,
    }  # fmt: skip
    assert "max_output_tokens" not in dialect_body("responses", NO_LIMIT)[1]


def test_llamacpp_and_sglang() -> None:
    assert dialect_body("llamacpp", CHAT)[1] == {
        "prompt": "Be brief.\n\nHi", "n_predict": 32, "temperature": 0.5, "stream": True,
    }  # fmt: skip
    assert dialect_body("llamacpp", NO_LIMIT)[1]["n_predict"] == -1
    assert dialect_body("sglang", CHAT)[1] == {
        "text": "Be brief.\n\nHi", "sampling_params": {"temperature": 0.5, "max_new_tokens": 32}, "stream": True,
    }  # fmt: skip
    assert dialect_body("sglang", NO_LIMIT)[1]["sampling_params"] == {"temperature": 0.0}


def test_an_unknown_endpoint_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        dialect_body("chat", CHAT)
