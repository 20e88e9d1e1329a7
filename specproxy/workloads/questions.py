"""Question files of the speculative-decoding benchmarks (format name "questions"): Spec-Bench's `question.jsonl`
and MT-Bench's `question.jsonl`, JSON lines of `{"question_id": ..., "category": "...", "turns": ["...", ...]}`.

These are the prompt sets published acceptance and speedup figures are measured on, so a user can put their own
server's figures beside the published ones. Nothing is downloaded: the user gives the file (docs/traffic.md says
where each is published). Each line becomes one conversation: its first turn is the request, later turns (MT-Bench's
second question) are follow-ups sent after the model's own reply. Each item keeps its category; the loader makes one
workload per category (`load.split_categories`), as both benchmarks report per category. Other keys (`reference`,
Spec-Bench's `question_id` strings) are ignored or kept as ids. Pure: records in, `Workload` out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specproxy.workloads.registry import ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import WorkloadText, json_lines
from specproxy.workloads.types import Workload, WorkloadItem, check, name_from, unique_id

# Spec-Bench generates up to 1,024 new tokens per turn (its evaluation scripts' max_new_tokens); MT-Bench's answer
# generation uses the same bound.
QUESTIONS_MAX_TOKENS = 1024


def parse_questions(records: Iterable[tuple[str, int, Any]], *, source: str, limit: int | None = None) -> Workload:
    name = name_from(source)
    items: list[WorkloadItem] = []
    seen: set[str] = set()
    for where, _number, rec in records:
        if limit is not None and len(items) >= limit:
            break
        check(isinstance(rec, dict), where, 'expected an object with "turns"')
        turns = rec.get("turns")
        check(
            isinstance(turns, list) and len(turns) > 0 and all(isinstance(t, str) and t.strip() for t in turns),
            where,
            "turns must be a non-empty list of non-empty strings",
        )
        category = rec.get("category")
        check(category is None or isinstance(category, str), where, "category must be a string")
        qid = rec.get("question_id", len(items) + 1)
        check(isinstance(qid, int | str) and not isinstance(qid, bool), where, "question_id must be a number or string")
        items.append(
            WorkloadItem(
                id=unique_id(f"{name}-{qid}", seen),
                messages=({"role": "user", "content": turns[0]},),
                followups=tuple(turns[1:]),
                category=category or None,
            )
        )
    check(bool(items), source, "no questions in the file")
    return Workload(
        name=name,
        description=f"questions from {source}",
        max_tokens=QUESTIONS_MAX_TOKENS,
        items=tuple(items),
        source=source,
    )


def _sniff(text: WorkloadText) -> bool:
    first = text.first_record if text.is_json_lines else None
    return isinstance(first, dict) and isinstance(first.get("turns"), list) and "messages" not in first


def _read(text: WorkloadText, options: ReadOptions) -> Workload:
    return parse_questions(json_lines(text.text, text.source), source=text.source, limit=options.limit)


FORMAT = WorkloadFormat(name="questions", sniff=_sniff, read=_read, refines="jsonl")
