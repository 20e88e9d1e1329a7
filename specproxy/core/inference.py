"""Which relayed requests are inference: the ones the engine generates tokens for, and the only ones that enter
workloads, records, status rates and reports.

The rest is relayed the same (health checks, ``GET /metrics`` polls, ``/v1/models``, engine probes, tokenizer and
embedding calls, admin endpoints) but only counted, by kind, never recorded: a benchmark client that polls
``/metrics`` (aiperf) or ``/health`` (guidellm) must not show up as a workload with its own request rate and errors,
nor take a share of the engine's speculative counters. Pure.

The rule: a request generates only when its method is ``POST`` (no engine generates on ``GET`` or ``HEAD``: vLLM,
SGLang, llama.cpp's server and Ollama all route generation by POST), and its path is not one of the engines'
endpoints that answer without generating (:data:`NOT_GENERATING`, matched on the path's last segments so that a
prefix such as ``/openai`` in front of them still matches). An unknown POST path is taken as inference: an engine
behind a gateway may serve generation anywhere, and a record too many is seen, a record too few is not.
"""

from __future__ import annotations

# Endpoints that take a POST and generate nothing, by the last segments of their paths. vLLM:
# vllm/entrypoints/openai/api_server.py and serve/*; SGLang: python/sglang/srt/entrypoints/http_server.py;
# llama.cpp: tools/server/server.cpp; Ollama: server/routes.go.
NOT_GENERATING: frozenset[str] = frozenset(
    {
        # tokenizers
        "tokenize",
        "detokenize",
        "v1/tokenize",
        "v1/detokenize",
        "apply-template",
        # embeddings, pooling, scoring
        "embeddings",
        "embedding",
        "v1/embeddings",
        "pooling",
        "classify",
        "score",
        "v1/score",
        "rerank",
        "v1/rerank",
        "v2/rerank",
        "reranking",
        "api/embed",
        "api/embeddings",
        # engine administration
        "reset_prefix_cache",
        "reset_mm_cache",
        "sleep",
        "wake_up",
        "is_sleeping",
        "pause",
        "resume",
        "start_profile",
        "stop_profile",
        "collective_rpc",
        "scale_elastic_ep",
        "v1/load_lora_adapter",
        "v1/unload_lora_adapter",
        "flush_cache",
        "update_weights_from_disk",
        "slots",
        "lora-adapters",
        "api/show",
        "api/pull",
        "api/push",
        "api/create",
        "api/copy",
        "api/delete",
        "api/blobs",
    }
)


def is_inference(method: str, path: str) -> bool:
    """Whether a request of ``method`` to ``path`` (the request target's path, no query) asks the engine to
    generate."""
    if method.upper() != "POST":
        return False
    segments = [s for s in path.lower().split("/") if s]
    if not segments:
        return True
    last = segments[-1]
    two = "/".join(segments[-2:])
    return (
        last not in NOT_GENERATING
        and two not in NOT_GENERATING
        and not (
            len(segments) >= 2 and segments[-2] == "blobs"  # Ollama's POST /api/blobs/:digest
        )
    )


def kind_of(method: str, path: str) -> str:
    """What a request that is not inference was, for its count: ``metrics``, ``health``, ``models``, ``probe``
    (the engine probes of specproxy's own load generator and of other tools), or ``other``."""
    segments = [s for s in path.lower().split("/") if s]
    last = segments[-1] if segments else ""
    if last == "metrics":
        return "metrics"
    if last in ("health", "healthz", "ready", "readyz", "livez", "ping"):
        return "health"
    if last == "models" or (len(segments) >= 2 and segments[-2] == "models"):
        return "models"
    if last in ("version", "props", "get_server_info", "server_info", "get_model_info", "model_info", "tags"):
        return "probe"
    return "other"
