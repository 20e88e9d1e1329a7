"""The record's fields as one table: name, JSON type, meaning, and how ``specproxy export`` writes it (its columns) or
why it does not. The TypedDict :class:`specproxy.core.record.Record`, the export's columns and the table in
``docs/records.md`` are checked against this one (``tests/test_core_schema.py``); the docs' table is printed by

    python -m specproxy.core.schema

Pure: data and a renderer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Field:
    names: tuple[str, ...]  # one row of the docs' table may describe several fields of one kind
    type: str  # as JSON readers see it: int, float, str, bool, list of ..., object; "or null" when it may be null
    meaning: str  # markdown
    export: tuple[str, ...] | str  # the export's columns for these fields, or why they have none


FIELDS: tuple[Field, ...] = (
    Field(
        ("schema_version",),
        "int",
        (
            "9 (version 8 wrote no correction lines, version 7 had no `spans`, version 6 no `shadow_of`, "
            "version 5 no `trace_parent` nor "
            "`buffer_sized_reads`, version 4 no "
            "`chunk_token_source`, "
            "version 3 no `engine` / `engine_timings`, version 2 no `conversation` and `turn`, version 1 no "
            "`cached_tokens`; readers upgrade them with nulls)"
        ),
        "not exported: a table is written from records upgraded to the current version",
    ),
    Field(
        ("request_id",),
        "str",
        "specproxy's id for the request; also sent to the client as header `X-Specproxy-Request-Id`",
        ("request_id",),
    ),
    Field(
        ("upstream_id",),
        "str or null",
        "the response's own `id` (e.g. `chatcmpl-...`)",
        ("upstream_id",),
    ),
    Field(
        ("started_at",),
        "float",
        "wall clock, epoch seconds, when the request arrived",
        ("started_at",),
    ),
    Field(
        ("workload",),
        "str",
        "from header `X-Specproxy-Workload`, a rules file, or `default`; at most 100 distinct, the rest `other`",
        ("workload",),
    ),
    Field(
        ("label",),
        "str or null",
        "the run's configuration label (`--label`, e.g. `MTP-FP16-n3`)",
        ("label",),
    ),
    Field(
        ("run_id",),
        "str",
        "one id per proxy process or load-generator run (with `repeat`, per repeat)",
        ("run_id",),
    ),
    Field(
        ("repeat",),
        "int or null",
        "repeat index for `specproxy run --repeat N` (0-based), null for the proxy",
        ("repeat",),
    ),
    Field(
        ("method", "path"),
        "str",
        (
            "HTTP method and the request target's path as the client sent it and the proxy forwarded it, raw "
            "(`%7e`, dot segments, `//` kept as sent); the query string and any fragment are dropped, never "
            "written (they may carry keys)"
        ),
        ("method", "path"),
    ),
    Field(
        ("model",),
        "str or null",
        "the request body's `model`",
        ("model",),
    ),
    Field(
        ("status",),
        "int or null",
        "upstream HTTP status (null when no response arrived)",
        ("status",),
    ),
    Field(
        ("stream",),
        "bool",
        "whether the response was an event stream",
        ("stream",),
    ),
    Field(
        ("outcome",),
        "str",
        (
            "`ok`, `upstream_error` (status >= 400, an in-stream error event, or upstream unreachable), "
            "`upstream_reset` (the upstream connection broke mid-response, or its body stopped being valid "
            "HTTP/1.1: the client's stream is broken within two seconds, never finished cleanly), "
            "`client_cancelled` (the client left before the end of the answer had been relayed to it; one that "
            "closes right after it is `ok`, flag `client_closed_at_end`), `timeout` (connect timeout, or no "
            "upstream byte for `--idle-timeout`, before or after the response headers), `proxy_error`, `shutdown`"
            " (the proxy's own stop cut the stream: below)"
        ),
        ("outcome",),
    ),
    Field(
        ("error",),
        "str or null",
        (
            "a reason when `outcome` is not `ok`: one printable line without raw bytes, query strings or the "
            "upstream's address (below)"
        ),
        ("error",),
    ),
    Field(
        ("finish_reason",),
        "str or null",
        "the first choice's finish reason (`stop`, `length`, ...)",
        ("finish_reason",),
    ),
    Field(
        ("truncated",),
        "bool",
        '`finish_reason == "length"`: counters may exceed the emitted tokens (the last step\'s unemitted drafts)',
        ("truncated",),
    ),
    Field(
        ("prompt_tokens",),
        "int or null",
        "from the server's usage",
        ("prompt_tokens",),
    ),
    Field(
        ("completion_tokens",),
        "int or null",
        (
            "from usage when present, else the engine's `/tokenize` count of the response text (`--tokenizer "
            "server`), else the sum of chunk counts"
        ),
        ("completion_tokens",),
    ),
    Field(
        ("cached_tokens",),
        "int or null",
        (
            "the server's `usage.prompt_tokens_details.cached_tokens`: prompt tokens served from its prefix cache"
            " (vLLM sends it with `--enable-prompt-tokens-details`; null when the engine did not say)"
        ),
        ("cached_tokens",),
    ),
    Field(
        ("token_source",),
        "str",
        (
            "where token counts came from: `usage`, `token_ids` (exact, from the server's stream), "
            "`model_tokenizer` (the model's `tokenizer.json` given with `--tokenizer PATH`, per chunk), "
            "`server_tokenize` (`--tokenizer server`: the engine's `POST /tokenize` counted the whole response "
            "once at the end, and the chunk counts of the relay path are scaled to that total), `tiktoken`, "
            "`approx` (approximate), `none`. This is the source of the totals (`completion_tokens`): a stream "
            'that asked for the final usage only (`stream_options: {"include_usage": true}`, as aiperf and the '
            "openai SDK do) says `usage` here, exact, and `chunk_token_source` says how the split over its chunks"
            " was estimated"
        ),
        ("token_source",),
    ),
    Field(
        ("chunk_token_source",),
        "str",
        (
            "where the token count of each chunk came from: the same as `token_source` where the server counted "
            "each chunk (continuous usage, token ids), else the tokenizer that estimated it (`model_tokenizer`, "
            "`tiktoken`, `approx`); such estimates are scaled to add up to an exact total where there is one "
            "(flag `chunk_counts_scaled`). Chunk-derived acceptance is taken as exact only when this is `usage`, "
            "`token_ids` or `model_tokenizer`"
        ),
        ("chunk_token_source",),
    ),
    Field(
        ("ttft_s",),
        "float or null",
        "first token-bearing event minus request start",
        ("ttft_s",),
    ),
    Field(
        ("e2e_s",),
        "float",
        "last byte minus request start",
        ("e2e_s",),
    ),
    Field(
        ("decode_tok_s",),
        "float or null",
        (
            "(completion tokens - 1) / (last token time - first token time); when the engine times its own "
            "decoding (Ollama `eval_count / eval_duration`, llama.cpp `predicted_n / predicted_ms`), that figure,"
            " flagged `decode_rate_from_engine` (vLLM's own figure is not used here: see `engine_timings`)"
        ),
        ("decode_tok_s",),
    ),
    Field(
        ("tpot_s",),
        "float or null",
        "(last token time - first token time) / (completion tokens - 1)",
        ("tpot_s",),
    ),
    Field(
        ("upstream_headers_s",),
        "float or null",
        "when the upstream's response headers arrived",
        ("upstream_headers_s",),
    ),
    Field(
        ("chunks",),
        "list of `[offset_s, tokens]`",
        (
            "one entry per SSE data event that carried tokens or text, in arrival order. Counted from text, an "
            "event is an engine step and carries at least one token: an event with no text counts one (vLLM "
            "streams a step whose tokens end inside a character with empty text, and the end-of-sequence step "
            "too), except the one that only announces the assistant's role"
        ),
        "with --chunks: list columns chunk_offsets_s and chunk_tokens (Parquet), or a second table (--chunks table)",
    ),
    Field(
        ("events", "reads", "multi_event_reads", "keepalives"),
        "int",
        "SSE events seen, upstream reads, reads that held more than one token-bearing event, comment lines",
        ("events", "reads", "multi_event_reads", "keepalives"),
    ),
    Field(
        ("buffer_sized_reads",),
        "int or null",
        (
            "upstream reads of exactly 1, 2, 4, 8, 16, 32 or 64 KiB, as read (before decompression): a buffer's size, "
            "what a buffering hop (nginx with `proxy_buffering` or `gzip`) releases when its buffer fills "
            "([Buffering hops](#buffering-hops)); null in records older than version 6"
        ),
        ("buffer_sized_reads",),
    ),
    Field(
        ("chunks_are_steps",),
        "bool",
        "whether one chunk can be taken as one engine step (see `flags`)",
        ("chunks_are_steps",),
    ),
    Field(
        ("flags",),
        "list of str",
        "what to know before trusting a figure (list below)",
        ("flags",),
    ),
    Field(
        ("proxy_overhead_s",),
        "object or null",
        (
            "the time recording added per relayed read (SSE scan, JSON parse, timeline; the bytes are written to "
            'the client before it): `{"mean", "max", "count"}`'
        ),
        ("proxy_overhead_mean_s", "proxy_overhead_max_s"),
    ),
    Field(
        ("spec",),
        "object or null",
        "speculative decoding for this request, below",
        (
            "spec_source",
            "spec_accepted",
            "spec_drafts",
            "spec_draft_tokens",
            "spec_k",
            "acceptance_rate",
            "mean_acceptance_length",
            "spec_per_position",
        ),
    ),
    Field(
        ("spans",),
        "object or null",
        (
            "where the drafts landed: decode steps, tokens, accepted drafts and draft tokens per span type of the "
            "text and per output position, below ([Spans](#spans)); null when the response was not streamed or had "
            "no decode step, and in records older than version 8"
        ),
        "not exported: nested per span type and position; read it from the JSONL (`report` pools it)",
    ),
    Field(
        ("request",),
        "object, str or null",
        (
            "the request body (with `--capture request` or `full`; never headers), secrets replaced: see [what a "
            "captured body keeps](#what-a-captured-body-keeps)"
        ),
        "not exported: a nested body of any size; read it from the JSONL",
    ),
    Field(
        ("response_text",),
        "str or null",
        "the generated text (`--capture full` only), with credential-shaped substrings replaced as in `request`",
        "not exported: text of any size; read it from the JSONL",
    ),
    Field(
        ("replay_of",),
        "str or null",
        "for `specproxy replay`: the `request_id` this request re-sent",
        ("replay_of",),
    ),
    Field(
        ("shadow_of",),
        "str or null",
        (
            "for a shadow (`specproxy proxy --shadow LABEL=URL`): the `request_id` of the live request it copied to "
            "the candidate server named by `label`; the pair is compared in the proxy's status and by `compare` "
            "([docs/shadow.md](shadow.md)). Null otherwise, and in records older than version 7"
        ),
        ("shadow_of",),
    ),
    Field(
        ("conversation",),
        "str or null",
        "for a multi-turn workload (`specproxy run`): the id shared by every turn of one conversation",
        ("conversation",),
    ),
    Field(
        ("turn",),
        "int or null",
        "that request's turn in its conversation, from 1; `report --by workload,turn` groups by it",
        ("turn",),
    ),
    Field(
        ("engine",),
        "str or null",
        (
            "`vllm`, `sglang`, `ollama` or `llamacpp`: `--engine`, or what `--engine auto` found "
            "([docs/engines.md](engines.md)); null when nothing told"
        ),
        ("engine",),
    ),
    Field(
        ("engine_timings",),
        "object or null",
        (
            "the engine's own counts and durations for this request, in tokens and seconds: `prompt_tokens`, "
            "`prompt_s`, `decode_tokens`, `decode_s`, `load_s`, `total_s` (Ollama), `draft_tokens`, "
            "`draft_accepted` (llama.cpp); from vLLM run with `--enable-per-request-metrics`, `queue_s`, `ttft_s`"
            " (from the step that scheduled it), `decode_s` (first token to last, on the engine core's clock) and"
            " `decode_tokens` (`completion_tokens` − 1), so `decode_tokens / decode_s` is the engine's decode "
            "rate beside the chunk-timed `decode_tok_s`; only the keys the engine sent"
        ),
        "not exported: its keys differ by engine; read it from the JSONL",
    ),
    Field(
        ("trace_parent",),
        "str or null",
        (
            "the client's W3C `traceparent` header, as sent, when the proxy exports spans (`--otlp-endpoint`, "
            "[docs/otel.md](otel.md)) and the header is valid; the request's span is its child. Null otherwise"
        ),
        "not exported: a trace id, for finding the request in a tracing backend; read it from the JSONL",
    ),
    Field(
        ("read_bytes_per_token",),
        "float, optional",
        (
            "never written by the recorder; a measured figure you may add for `specproxy roofline`, which then "
            "prefers it to its estimate"
        ),
        "not exported: never written by the recorder",
    ),
)


def by_name() -> dict[str, Field]:
    return {n: f for f in FIELDS for n in f.names}


def markdown_table() -> str:
    """The field table of docs/records.md."""
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for f in FIELDS:
        rows.append(f"| {', '.join(f'`{n}`' for n in f.names)} | {f.type} | {f.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
