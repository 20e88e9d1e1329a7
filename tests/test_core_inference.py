"""Which requests are inference (core.inference): what enters workloads and records."""

from __future__ import annotations

import pytest

from specproxy.core.inference import is_inference, kind_of


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
        "/generate",
        "/completion",
        "/openai/v1/chat/completions/",  # behind a prefix, with a trailing slash
        "/custom/gateway/route",  # unknown: taken as inference (a record too many is seen, one too few is not)
    ],
)
def test_posts_that_generate(path: str) -> None:
    assert is_inference("POST", path) and is_inference("post", path)


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v1/chat/completions"),
        ("HEAD", "/metrics"),
        ("GET", "/health"),
        ("OPTIONS", "/v1/completions"),
        ("POST", "/tokenize"),
        ("POST", "/v1/embeddings"),
        ("POST", "/openai/v1/embeddings"),
        ("POST", "/v1/score"),
        ("POST", "/rerank"),
        ("POST", "/api/embed"),
        ("POST", "/api/blobs/sha256:abc"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/load_lora_adapter"),
    ],
)
def test_what_generates_nothing(method: str, path: str) -> None:
    assert not is_inference(method, path)


def test_kinds() -> None:
    assert kind_of("GET", "/metrics") == "metrics"
    assert kind_of("GET", "/health") == "health"
    assert kind_of("GET", "/v1/models") == "models"
    assert kind_of("GET", "/v1/models/sim-model") == "models"
    for probe in ("/version", "/api/version", "/props", "/get_server_info"):
        assert kind_of("GET", probe) == "probe"
    assert kind_of("POST", "/tokenize") == "other"
