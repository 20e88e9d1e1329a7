"""Mooncake traces (format name "mooncake"): JSON lines of `{"timestamp": ms, "input_length": N, "output_length": M,
"hash_ids": [...]}`, as published with the Mooncake serving system (Kimi's production traffic).

A trace has lengths, times and prompt-block hashes, not text. Each prompt is rebuilt from the corpus block by block,
one block of `MOONCAKE_BLOCK_TOKENS` per hash id, so requests that shared a prompt prefix in the trace share the same
text here and a prefix cache sees the same reuse. Pure: records and a corpus in, `Workload` out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specproxy.workloads.corpus import MOONCAKE_BLOCK_TOKENS, PromptCorpus, trace_item
from specproxy.workloads.registry import ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import WorkloadText, json_lines
from specproxy.workloads.types import DEFAULT_MAX_TOKENS, Workload, check, name_from, trace_length


def parse_mooncake(
    records: Iterable[tuple[str, int, Any]], *, source: str, corpus: PromptCorpus, limit: int | None = None
) -> Workload:
    """Mooncake trace records `{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}`.

    Prompt text is built block by block from hash_ids, so requests sharing a hash id share that prompt prefix.
    """
    rows: list[tuple[float, int, int, list[int]]] = []
    for where, _number, rec in records:
        if limit is not None and len(rows) >= limit:
            break
        check(isinstance(rec, dict), where, "expected a Mooncake record object")
        ts = rec.get("timestamp")
        check(isinstance(ts, (int, float)) and not isinstance(ts, bool), where, "timestamp (ms) must be a number")
        hash_ids = rec.get("hash_ids", [])
        check(
            isinstance(hash_ids, list) and all(isinstance(h, int) for h in hash_ids),
            where,
            "hash_ids must be a list of integers",
        )
        in_len = trace_length(rec.get("input_length"), where, "input_length")
        out_len = trace_length(rec.get("output_length"), where, "output_length")
        rows.append((float(ts), in_len, out_len, hash_ids))
    check(bool(rows), source, "no records in the trace")
    start_ms = min(r[0] for r in rows)
    name = name_from(source)
    items = []
    for n, (ts, in_len, out_len, hash_ids) in enumerate(rows):
        full = len(hash_ids) - 1
        if hash_ids and full * MOONCAKE_BLOCK_TOKENS < in_len <= len(hash_ids) * MOONCAKE_BLOCK_TOKENS:
            tail = corpus.text(hash_ids[-1], in_len - full * MOONCAKE_BLOCK_TOKENS)
            text = "".join(corpus.block(h) + "\n\n" for h in hash_ids[:-1]) + tail
        else:  # hash ids missing or not matching the length: plain text, no sharing
            text = corpus.text(n, in_len)
        items.append(trace_item(f"{name}-{n + 1}", text, out_len, (ts - start_ms) / 1000.0))
    return Workload(
        name=name,
        description=f"Mooncake trace {source}: prompts rebuilt from built-in text",
        max_tokens=DEFAULT_MAX_TOKENS,
        items=tuple(items),
        source=source,
    )


def _sniff(text: WorkloadText) -> bool:
    # JSON lines whose first record has the trace's length key; a request body never has "input_length".
    first = text.first_record if text.is_json_lines else None
    return isinstance(first, dict) and "input_length" in first


def _read(text: WorkloadText, options: ReadOptions) -> Workload:
    records = json_lines(text.text, text.source)
    return parse_mooncake(records, source=text.source, corpus=options.trace_corpus(text.source), limit=options.limit)


FORMAT = WorkloadFormat(name="mooncake", sniff=_sniff, read=_read, refines="jsonl")
