"""Workloads: the built-in prompt sets, the workload file format, and readers for the datasets users already have.

A workload is a named list of requests. It comes from a specproxy workload file (`workloads/README.md` documents the
format; the built-ins are such files), a ShareGPT JSON file, a JSONL file of prompts or OpenAI request bodies, or a
recorded trace (Mooncake JSONL, Azure LLM inference CSV). A trace records lengths and times, not text, so its prompts
are made from the built-in text, cut to the recorded input length by a token counter.

Everything here is pure (text in, `Workload` out) except `builtin_names` and `load_workload`, which read files.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path, PurePath
from typing import Any

import orjson

from specproxy.workloads.corpus import (
    MOONCAKE_BLOCK_TOKENS,
    CountTokens,
    PromptCorpus,
    approx_token_count,
    trace_item,
)
from specproxy.workloads.types import (
    DEFAULT_MAX_TOKENS,
    Workload,
    WorkloadError,
    WorkloadItem,
    check,
    check_name,
    name_from,
    positive_int,
    unique_id,
)

FORMAT_VERSION = 1
FORMATS = ("specproxy", "sharegpt", "jsonl", "mooncake", "azure")

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
_PROMPT_KEYS = {"prompt", "id", "max_tokens"}  # a JSONL object with only these is a prompt, not a request body
_ITEM_KEYS = {"id", "messages", "max_tokens"}
_TOP_KEYS = {"format_version", "name", "description", "max_tokens", "items"}
_AZURE_TS_RE = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?")


# ---------------------------------------------------------------- the specproxy format


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
        items.append(WorkloadItem(id=item_id, messages=messages, max_tokens=item_max))
    return Workload(name=name, description=description, max_tokens=max_tokens, items=tuple(items), source=source)


# ---------------------------------------------------------------- datasets: ShareGPT, JSONL prompts and bodies


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


# ---------------------------------------------------------------- traces: Mooncake JSONL, Azure CSV


def _trace_int(record: dict[str, Any], key: str, where: str) -> int:
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WorkloadError(f"{where}: {key} must be a non-negative integer (got {value!r})")
    return value


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
        in_len, out_len = _trace_int(rec, "input_length", where), _trace_int(rec, "output_length", where)
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


def parse_azure_timestamp(value: str) -> int:
    """Azure trace time ("2023-11-16 18:15:46.6805900", 7 fraction digits) in ns since the epoch (naive = UTC)."""
    m = _AZURE_TS_RE.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"not a timestamp like 2023-11-16 18:15:46.6805900: {value!r}")
    date, clock, frac, zone = m.groups()
    offset = UTC
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    whole = datetime.fromisoformat(f"{date}T{clock}").replace(tzinfo=offset)
    return int(whole.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))


def parse_azure_csv(text: str, *, source: str, corpus: PromptCorpus, limit: int | None = None) -> Workload:
    """Azure LLM inference trace CSV: a header with TIMESTAMP, ContextTokens, GeneratedTokens, one request a row."""
    reader = csv.reader(text.splitlines())
    header = [h.strip().lower() for h in next(reader, [])]
    wanted = ("timestamp", "contexttokens", "generatedtokens")
    check(all(w in header for w in wanted), f"{source}:1", "expected a header TIMESTAMP,ContextTokens,GeneratedTokens")
    cols = [header.index(w) for w in wanted]
    rows: list[tuple[int, int, int]] = []
    for row in reader:
        if limit is not None and len(rows) >= limit:
            break
        if not any(cell.strip() for cell in row):
            continue
        where = f"{source}:{reader.line_num}"
        check(len(row) >= len(header), where, f"expected {len(header)} columns, got {len(row)}")
        try:
            ts_ns = parse_azure_timestamp(row[cols[0]])
            context, generated = int(row[cols[1]]), int(row[cols[2]])
        except ValueError as e:
            raise WorkloadError(f"{where}: {e}") from None
        check(context >= 0 and generated >= 0, where, "token counts must be non-negative")
        rows.append((ts_ns, context, generated))
    check(bool(rows), source, "no requests in the trace")
    start_ns = min(r[0] for r in rows)
    name = name_from(source)
    items = tuple(
        trace_item(f"{name}-{n + 1}", corpus.text(n, context), generated, (ts - start_ns) / 1e9)
        for n, (ts, context, generated) in enumerate(rows)
    )
    return Workload(
        name=name,
        description=f"Azure LLM inference trace {source}: prompts rebuilt from built-in text",
        max_tokens=DEFAULT_MAX_TOKENS,
        items=items,
        source=source,
    )


# ---------------------------------------------------------------- detection and files

_UNPARSED = object()


def _loads(text: str, source: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise WorkloadError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def _first_record(text: str) -> Any:
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return _UNPARSED


def _detect(text: str, suffix: str) -> tuple[str, Any]:
    """The format from the extension, then the content; also the decoded JSON when the whole text was parsed."""
    head = text.lstrip()
    if suffix == ".csv" or not head.startswith(("{", "[", '"')):
        first_line = head.split("\n", 1)[0].lower()
        is_csv = suffix == ".csv" or ("timestamp" in first_line and "," in first_line)
        return ("azure" if is_csv else "specproxy"), _UNPARSED  # not CSV: report it as broken JSON, with the position
    if suffix not in (".jsonl", ".ndjson"):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            data = _UNPARSED
        if isinstance(data, list):
            is_sharegpt = bool(data) and isinstance(data[0], dict) and "conversations" in data[0]
            return ("sharegpt" if is_sharegpt else "jsonl"), data
        one_record = (
            isinstance(data, dict) and "items" not in data and bool({"messages", "prompt", "input_length"} & set(data))
        )
        if data is not _UNPARSED and not one_record:
            return "specproxy", data
        if data is _UNPARSED and _first_record(text) is _UNPARSED:
            return "specproxy", _UNPARSED  # broken JSON, not JSON lines: report where it breaks
    first = _first_record(text)
    return ("mooncake" if isinstance(first, dict) and "input_length" in first else "jsonl"), _UNPARSED


def parse_workload(
    text: str,
    *,
    source: str,
    format: str | None = None,
    count_tokens: CountTokens | None = None,
    corpus: Callable[[CountTokens], PromptCorpus] | None = None,
    limit: int | None = None,
) -> Workload:
    """Parse a workload file's text in `format` (one of FORMATS; detected when None).

    `corpus` supplies the text for trace prompts; it is called only for a trace.
    """
    data: Any = _UNPARSED
    if format is None:
        format, data = _detect(text, PurePath(source).suffix.lower())
    check(format in FORMATS, source, f"unknown format {format!r}; known formats: {', '.join(FORMATS)}")
    counter = count_tokens or approx_token_count
    if format in ("mooncake", "azure"):
        if corpus is None:
            raise WorkloadError(f"{source}: no text to rebuild the trace's prompts from")
        if format == "azure":
            return parse_azure_csv(text, source=source, corpus=corpus(counter), limit=limit)
        return parse_mooncake(_lines(text, source), source=source, corpus=corpus(counter), limit=limit)
    if format == "jsonl" and not text.lstrip().startswith("["):
        return parse_requests(_lines(text, source), source=source, limit=limit)
    if data is _UNPARSED:
        data = _loads(text, source)
    if format == "sharegpt":
        return parse_sharegpt(data, source=source, count_tokens=counter, limit=limit)
    if format == "jsonl":  # a JSON array of prompts or request bodies
        check(isinstance(data, list), source, "expected a JSON list of prompts or request bodies")
        return parse_requests(((f"{source}: [{i}]", i + 1, r) for i, r in enumerate(data)), source=source, limit=limit)
    return parse_specproxy(data, source=source)


def _lines(text: str, source: str) -> Iterator[tuple[str, int, Any]]:
    """(where, line number, record) for each non-blank line of JSON lines."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{source}:{lineno}", lineno, orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise WorkloadError(f"{source}:{lineno}: invalid JSON at column {e.colno}: {e.msg}") from None


def _builtin_dir() -> Path:
    # The wheel maps workloads/ to specproxy/_builtin_workloads (pyproject force-include). Look there first: in an
    # installed wheel, ../workloads would be a top-level "workloads" in site-packages, which may be anyone's.
    package = Path(__file__).resolve().parent.parent  # specproxy/, this file being specproxy/workloads/__init__.py
    packaged = package / "_builtin_workloads"
    return packaged if packaged.is_dir() else package.parent / "workloads"  # a checkout


def builtin_names() -> list[str]:
    """Names of the built-in workloads, sorted."""
    return sorted(p.stem for p in _builtin_dir().glob("*.json"))


def _read_text(path: Path, source: str) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WorkloadError(f"{source}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkloadError(f"{source}:{line}: not UTF-8 text (byte {e.start})") from None


def _builtin_corpus(count_tokens: CountTokens) -> PromptCorpus:
    texts: list[str] = []
    for name in builtin_names():
        for item in load_workload(name).items:
            texts.extend(str(m["content"]) for m in item.messages if m["role"] != "system")
    return PromptCorpus(texts, count_tokens)


def load_workload(
    spec: str, *, count_tokens: CountTokens | None = None, format: str | None = None, limit: int | None = None
) -> Workload:
    """A built-in workload by name, or a workload file by path (format from its extension and content unless given).

    `count_tokens` measures text for trace prompts and ShareGPT replies (default `approx_token_count`);
    `limit` reads only the first items of a large file.
    """
    names = builtin_names()
    if spec in names and format in (None, "specproxy"):
        path = _builtin_dir() / f"{spec}.json"
        return parse_workload(_read_text(path, str(path)), source=str(path), format="specproxy")
    path = Path(spec)
    looks_like_path = "/" in spec or "\\" in spec or path.suffix != "" or path.exists()
    check(
        looks_like_path,
        f"unknown workload {spec!r}",
        f"built-in workloads are {', '.join(names)}; or give the path of a workload file",
    )
    if not path.exists():
        raise WorkloadError(f"{spec}: no such file (built-in workloads are {', '.join(names)})")
    return parse_workload(
        _read_text(path, spec),
        source=spec,
        format=format,
        count_tokens=count_tokens,
        corpus=_builtin_corpus,
        limit=limit,
    )


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FORMATS",
    "FORMAT_VERSION",
    "MOONCAKE_BLOCK_TOKENS",
    "CountTokens",
    "PromptCorpus",
    "Workload",
    "WorkloadError",
    "WorkloadItem",
    "approx_token_count",
    "builtin_names",
    "check_name",
    "load_workload",
    "parse_azure_csv",
    "parse_azure_timestamp",
    "parse_mooncake",
    "parse_requests",
    "parse_sharegpt",
    "parse_specproxy",
    "parse_workload",
]
