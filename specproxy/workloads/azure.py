"""Azure LLM inference traces (format name "azure"): CSV with a header TIMESTAMP,ContextTokens,GeneratedTokens and
one request a row, as in Microsoft's public Azure LLM inference trace files.

A trace has lengths and times, not text: each prompt is cut from the corpus to the recorded context length, and the
arrival time becomes seconds after the trace's first request. Pure: text and a corpus in, `Workload` out.
"""

from __future__ import annotations

import csv
import re
from datetime import UTC, datetime, timedelta, timezone

from specproxy.workloads.corpus import PromptCorpus, trace_item
from specproxy.workloads.registry import ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import WorkloadText
from specproxy.workloads.types import DEFAULT_MAX_TOKENS, Workload, WorkloadError, check, name_from, trace_length

_AZURE_TS_RE = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?")


def parse_azure_timestamp(value: str) -> int:
    """Azure trace time (``YYYY-MM-DD hh:mm:ss.fffffff``, 7 fraction digits) in ns since the epoch (naive = UTC)."""
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
        context = trace_length(context, where, "ContextTokens")
        generated = trace_length(generated, where, "GeneratedTokens")
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


def _sniff(text: WorkloadText) -> bool:
    # Named .csv, or, whatever the name, text that does not start like JSON and whose first line looks like the
    # header (a trace saved without its extension, or under another one).
    if text.suffix == ".csv":
        return True
    first_line = text.first_line.lower()
    return not text.looks_like_json and "timestamp" in first_line and "," in first_line


def _read(text: WorkloadText, options: ReadOptions) -> Workload:
    return parse_azure_csv(text.text, source=text.source, corpus=options.trace_corpus(text.source), limit=options.limit)


FORMAT = WorkloadFormat(name="azure", sniff=_sniff, read=_read)
