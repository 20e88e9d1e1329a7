"""Prompts and OpenAI request bodies (format name "jsonl"): one JSON value a line, or a JSON array of the same values.

This is how users bring real traffic: exported production requests (chat or completions bodies, sent as they are
apart from model and streaming options) or plain prompt lists. Each value is a prompt string, `{"prompt": ...}`
(optionally with "id" and "max_tokens"), or a request body with "messages" or "prompt". Items are named
`<file name>:<line>`. Pure: text or decoded records in, `Workload` out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specproxy.workloads.registry import ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import WorkloadText, json_lines
from specproxy.workloads.types import DEFAULT_MAX_TOKENS, Workload, WorkloadItem, check, name_from, positive_int

_PROMPT_KEYS = {"prompt", "id", "max_tokens"}  # a JSONL object with only these is a prompt, not a request body


def _request_item(record: Any, where: str, default_id: str) -> WorkloadItem:
    """One JSONL record: a prompt string, {"prompt": ...}, or an OpenAI chat or completions request body."""
    if isinstance(record, str):
        check(record.strip() != "", where, "empty prompt")
        return WorkloadItem(id=default_id, messages=({"role": "user", "content": record},), prompt=record)
    check(
        isinstance(record, dict) and ("messages" in record or "prompt" in record),
        where,
        'expected a prompt string, {"prompt": ...}, or an OpenAI request body with "messages" or "prompt"',
    )
    max_tokens = record.get("max_tokens", record.get("max_completion_tokens"))
    check(max_tokens is None or positive_int(max_tokens), where, "max_tokens must be a positive integer")
    if "messages" in record:
        msgs = record["messages"]
        check(
            isinstance(msgs, list)
            and len(msgs) > 0
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs),
            where,
            'messages must be a non-empty list of {"role": ..., ...}',
        )
        return WorkloadItem(id=default_id, messages=tuple(msgs), max_tokens=max_tokens, body=record)
    prompt = record["prompt"]
    check(isinstance(prompt, str) and prompt.strip() != "", where, "prompt must be a non-empty string")
    item_id = record.get("id", default_id) if set(record) <= _PROMPT_KEYS else default_id
    check(isinstance(item_id, str) and item_id != "", where, "id must be a non-empty string")
    body = None if set(record) <= _PROMPT_KEYS else record
    return WorkloadItem(
        id=item_id, messages=({"role": "user", "content": prompt},), max_tokens=max_tokens, prompt=prompt, body=body
    )


def parse_requests(records: Iterable[tuple[str, int, Any]], *, source: str, limit: int | None = None) -> Workload:
    """(where, number, record) triples, each record a prompt or an OpenAI request body; ids are `name:number`."""
    name = name_from(source)
    items: list[WorkloadItem] = []
    seen: set[str] = set()
    for where, number, record in records:
        if limit is not None and len(items) >= limit:
            break
        item = _request_item(record, where, f"{name}:{number}")
        check(item.id not in seen, where, f"duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    check(bool(items), source, "no requests in the file")
    return Workload(
        name=name,
        description=f"requests from {source}",
        max_tokens=DEFAULT_MAX_TOKENS,
        items=tuple(items),
        source=source,
    )


def _sniff(text: WorkloadText) -> bool:
    # Any JSON list or JSON lines: the general case that ShareGPT lists and Mooncake traces refine.
    return isinstance(text.document, list) or text.is_json_lines


def _read(text: WorkloadText, options: ReadOptions) -> Workload:
    source, limit = text.source, options.limit
    if not text.text.lstrip().startswith("["):  # JSON lines, read a line at a time
        return parse_requests(json_lines(text.text, source), source=source, limit=limit)
    data = text.decode()
    check(isinstance(data, list), source, "expected a JSON list of prompts or request bodies")
    return parse_requests(((f"{source}: [{i}]", i + 1, r) for i, r in enumerate(data)), source=source, limit=limit)


FORMAT = WorkloadFormat(name="jsonl", sniff=_sniff, read=_read)
