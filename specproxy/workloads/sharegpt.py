"""ShareGPT datasets (format name "sharegpt"): a JSON list of `{"id": ..., "conversations": [{"from": ..., "value":
...}]}`, the shape of the ShareGPT dumps that serving benchmarks commonly replay.

Each conversation becomes one chat request, cut after its last human turn; the reply that followed, if any, gives the
item's expected output length, measured by the caller's token counter. Pure: decoded JSON in, `Workload` out.
"""

from __future__ import annotations

from typing import Any

from specproxy.workloads.corpus import CountTokens
from specproxy.workloads.registry import ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import WorkloadText
from specproxy.workloads.types import DEFAULT_MAX_TOKENS, Workload, WorkloadItem, check, name_from, unique_id

# Speakers as the dumps spell them; anything else (tool, function, ...) makes the conversation unusable.
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


def _sharegpt_messages(turns: Any) -> tuple[list[dict[str, Any]], str | None] | None:
    """Map a conversation's turns and cut it after the last human turn; None when it has no usable human turn."""
    if not isinstance(turns, list):
        return None
    merged: list[dict[str, Any]] = []
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            return None
        role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None or (role == "system" and merged):
            return None
        if merged and merged[-1]["role"] == role:  # some dumps split one turn in two: join them
            merged[-1]["content"] += "\n\n" + turn["value"]
        else:
            merged.append({"role": role, "content": turn["value"]})
    last_user = max((k for k, m in enumerate(merged) if m["role"] == "user"), default=-1)
    if last_user < 0 or not merged[last_user]["content"].strip():
        return None
    reply = merged[last_user + 1]["content"] if last_user + 1 < len(merged) else None
    messages = merged[: last_user + 1]
    if len(messages) > 1 and messages[0]["role"] == "assistant":  # a bot greeting first: templates want user first
        messages = messages[1:]
    return messages, reply


def parse_sharegpt(data: Any, *, source: str, count_tokens: CountTokens, limit: int | None = None) -> Workload:
    """ShareGPT: `[{"id": ..., "conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}]`.

    Each conversation is cut after its last human turn; the reply after it, if any, gives expected_output_tokens.
    Conversations without a human turn or with unknown speakers are skipped and counted in the description.
    """
    check(isinstance(data, list), source, 'ShareGPT data is a JSON list of {"conversations": [...]}')
    items: list[WorkloadItem] = []
    seen: set[str] = set()
    skipped = 0
    for i, entry in enumerate(data):
        if limit is not None and len(items) >= limit:
            break
        check(
            isinstance(entry, dict) and "conversations" in entry,
            f"{source}: [{i}]",
            'expected {"conversations": [...]} (ShareGPT)',
        )
        mapped = _sharegpt_messages(entry["conversations"])
        if mapped is None:
            skipped += 1
            continue
        messages, reply = mapped
        raw_id = entry.get("id")
        item_id = unique_id(str(raw_id) if isinstance(raw_id, (str, int)) else f"{i + 1}", seen)
        items.append(
            WorkloadItem(
                id=item_id, messages=tuple(messages), expected_output_tokens=count_tokens(reply) if reply else None
            )
        )
    check(bool(items), source, f"no usable ShareGPT conversation ({skipped} skipped)")
    note = f" ({skipped} skipped: no human turn or unknown speaker)" if skipped else ""
    return Workload(
        name=name_from(source),
        description=f"ShareGPT conversations from {source}{note}",
        max_tokens=DEFAULT_MAX_TOKENS,
        items=tuple(items),
        source=source,
    )


def _sniff(text: WorkloadText) -> bool:
    # Only the first entry is looked at: a dataset with a broken entry further down is still ShareGPT, and its
    # reader says which entry is wrong.
    doc = text.document
    return isinstance(doc, list) and bool(doc) and isinstance(doc[0], dict) and "conversations" in doc[0]


def _read(text: WorkloadText, options: ReadOptions) -> Workload:
    return parse_sharegpt(text.decode(), source=text.source, count_tokens=options.count_tokens, limit=options.limit)


FORMAT = WorkloadFormat(name="sharegpt", sniff=_sniff, read=_read, refines="jsonl")
