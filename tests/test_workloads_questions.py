"""Spec-Bench / MT-Bench question files (specproxy.workloads.questions): one conversation a line, its first turn the
request and the later ones follow-ups, its category kept, ids unique, errors naming the line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specproxy.workloads.questions import QUESTIONS_MAX_TOKENS, parse_questions
from specproxy.workloads.sniff import json_lines
from specproxy.workloads.types import WorkloadError


def _read(lines: list[Any], limit: int | None = None) -> Any:
    text = "\n".join(json.dumps(x) for x in lines)
    return parse_questions(json_lines(text, "question.jsonl"), source="question.jsonl", limit=limit)


def test_turns_become_a_request_and_its_followups_with_the_category() -> None:
    w = _read(
        [
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
            {"question_id": "sb-2", "category": "math", "turns": ["1+1?"], "reference": ["2"]},
        ]
    )
    assert (w.name, w.max_tokens, len(w.items)) == ("question", QUESTIONS_MAX_TOKENS, 2)
    a, b = w.items
    assert (a.id, a.messages, a.followups, a.category) == (
        "question-81",
        ({"role": "user", "content": "Write a poem."},),
        ("Now shorter.",),
        "writing",
    )
    assert (b.id, b.followups, b.category) == ("question-sb-2", (), "math")


def test_ids_default_to_the_position_and_repeats_are_made_unique() -> None:
    w = _read([{"turns": ["a"]}, {"question_id": 1, "turns": ["b"]}, {"question_id": 1, "turns": ["c"]}])
    assert [i.id for i in w.items] == ["question-1", "question-1#2", "question-1#3"]
    assert [i.category for i in w.items] == [None, None, None]


def test_an_empty_category_is_none_and_the_limit_stops_reading() -> None:
    w = _read([{"category": "", "turns": ["a"]}, {"turns": ["b"]}, "not even an object"], limit=2)
    assert [i.category for i in w.items] == [None, None] and len(w.items) == 2


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([1], 'question.jsonl:2: expected an object with "turns"'),
        ({"turns": []}, "question.jsonl:2: turns must be a non-empty list of non-empty strings"),
        ({"turns": ["ok", " "]}, "question.jsonl:2: turns must be a non-empty list of non-empty strings"),
        ({"turns": "text"}, "question.jsonl:2: turns must be a non-empty list of non-empty strings"),
        ({"turns": ["a"], "category": 3}, "question.jsonl:2: category must be a string"),
        ({"turns": ["a"], "question_id": True}, "question.jsonl:2: question_id must be a number or string"),
        ({"turns": ["a"], "question_id": [1]}, "question.jsonl:2: question_id must be a number or string"),
    ],
)
def test_a_bad_line_is_named(record: Any, message: str) -> None:
    with pytest.raises(WorkloadError) as e:
        _read([{"turns": ["fine"]}, record])
    assert str(e.value) == message


def test_an_empty_file_is_refused() -> None:
    with pytest.raises(WorkloadError, match="no questions in the file"):
        parse_questions([], source="question.jsonl")
