"""The specproxy workload file format (format name "specproxy"): the format of the built-in workloads and of the files
users write by hand. `workloads/README.md` documents it for users.

A file of this kind is one JSON object with "name" and "items"; it is also the format a file no other format claims
is read as, so that broken JSON gets an error with its line and column. Pure: decoded JSON in, `Workload` out.
"""

from __future__ import annotations

from typing import Any

from specproxy.workloads.registry import ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import UNPARSED, WorkloadText
from specproxy.workloads.types import (
    DEFAULT_MAX_TOKENS,
    Workload,
    WorkloadItem,
    check,
    check_name,
    positive_int,
)

FORMAT_VERSION = 1

_TOP_KEYS = {"format_version", "name", "description", "max_tokens", "items", "think_time_s"}
_ITEM_KEYS = {"id", "messages", "max_tokens", "followups"}
# A pause longer than this between two turns is a typo (milliseconds given as seconds), not a user.
MAX_THINK_TIME_S = 3600.0


def _check_conversation(messages: Any, where: str) -> tuple[dict[str, Any], ...]:
    check(isinstance(messages, list) and len(messages) > 0, where, "messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for j, m in enumerate(messages):
        at = f"{where}.messages[{j}]"
        check(
            isinstance(m, dict) and set(m) == {"role", "content"},
            at,
            'each message must be {"role": ..., "content": ...} and nothing else',
        )
        check(isinstance(m["content"], str) and m["content"].strip() != "", at, "content must be a non-empty string")
        # An optional system message, then user and assistant alternating, so a template never sees two in a row.
        first_turn = 1 if messages[0].get("role") == "system" else 0
        expected = "system" if j < first_turn else ("user" if (j - first_turn) % 2 == 0 else "assistant")
        check(
            m["role"] == expected,
            at,
            f"role must be {expected!r} here (got {m['role']!r}): an optional system message, then user and "
            "assistant turns alternating",
        )
        out.append({"role": m["role"], "content": m["content"]})
    check(out[-1]["role"] == "user", where, "the last message must be a user turn")
    return tuple(out)


def parse_specproxy(data: Any, *, source: str) -> Workload:
    """A decoded specproxy workload file (see workloads/README.md). Keys starting with "_" are notes, ignored."""
    check(isinstance(data, dict), source, 'a workload file is a JSON object with "name" and "items"')
    unknown = sorted(k for k in data if k not in _TOP_KEYS and not k.startswith("_"))
    check(not unknown, source, f"unknown keys {unknown}; allowed: {sorted(_TOP_KEYS)}")
    version = data.get("format_version", FORMAT_VERSION)
    check(version == FORMAT_VERSION, source, f"format_version {version!r} is not supported (this reads 1)")
    name = check_name(data.get("name"), source)
    description = data.get("description", "")
    check(isinstance(description, str), source, "description must be a string")
    max_tokens = data.get("max_tokens", DEFAULT_MAX_TOKENS)
    check(positive_int(max_tokens), source, f"max_tokens must be a positive integer (got {max_tokens!r})")
    think = data.get("think_time_s", 0.0)
    check(
        isinstance(think, int | float) and not isinstance(think, bool) and 0 <= think <= MAX_THINK_TIME_S,
        source,
        f"think_time_s must be a number of seconds from 0 to {MAX_THINK_TIME_S:g} (got {think!r})",
    )
    raw_items = data.get("items")
    check(isinstance(raw_items, list) and len(raw_items) > 0, source, "items must be a non-empty list")
    items: list[WorkloadItem] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_items):
        where = f"{source}: items[{i}]"
        check(isinstance(raw, dict), where, "an item must be an object with messages")
        unknown = sorted(k for k in raw if k not in _ITEM_KEYS and not k.startswith("_"))
        check(not unknown, where, f"unknown keys {unknown}; allowed: {sorted(_ITEM_KEYS)}")
        item_id = raw.get("id", f"{name}-{i + 1}")
        check(isinstance(item_id, str) and item_id != "", where, "id must be a non-empty string")
        check(item_id not in seen, where, f"duplicate id {item_id!r}")
        seen.add(item_id)
        item_max = raw.get("max_tokens")
        check(item_max is None or positive_int(item_max), where, "max_tokens must be a positive integer")
        messages = _check_conversation(raw.get("messages"), f"{where} (id {item_id!r})")
        followups = check_followups(raw.get("followups", []), f"{where} (id {item_id!r}).followups")
        items.append(WorkloadItem(id=item_id, messages=messages, max_tokens=item_max, followups=followups))
    return Workload(
        name=name,
        description=description,
        max_tokens=max_tokens,
        items=tuple(items),
        source=source,
        think_time_s=float(think),
    )


def check_followups(value: Any, where: str) -> tuple[str, ...]:
    """The user turns sent after the model's own replies: a list of non-empty strings (possibly empty)."""
    check(isinstance(value, list), where, "followups must be a list of user messages (strings)")
    for j, text in enumerate(value):
        check(isinstance(text, str) and text.strip() != "", f"{where}[{j}]", "a follow-up must be a non-empty string")
    return tuple(value)


def _sniff(text: WorkloadText) -> bool:
    # One JSON document that is neither a list (a dataset) nor a single request or trace record (JSON lines). Any
    # such value is claimed, not only objects, so that `"just text"` is told it is not a workload object.
    doc = text.document
    return doc is not UNPARSED and not isinstance(doc, list) and not text.is_json_lines


def _read(text: WorkloadText, options: ReadOptions) -> Workload:
    return parse_specproxy(text.decode(), source=text.source)


FORMAT = WorkloadFormat(name="specproxy", sniff=_sniff, read=_read)
