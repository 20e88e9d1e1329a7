"""Built-in workloads, the workload file format, and the readers for ShareGPT, JSONL, Mooncake and Azure files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from specproxy.workloads import (
    FORMATS,
    MOONCAKE_BLOCK_TOKENS,
    Workload,
    WorkloadError,
    approx_token_count,
    builtin_names,
    load_workload,
    parse_azure_timestamp,
    parse_specproxy,
)

ROOT = Path(__file__).resolve().parent.parent
BUILTINS = ["code_agent", "ja_chat", "ja_long", "ja_medium"]  # the files
MULTI_TURN = ["code_agent_multi", "ja_chat_multi"]  # made from them
JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
FENCE = re.compile(r"```([\w+-]*)\n(.*?)```", re.S)


def last_user(workload: Workload) -> list[str]:
    return [str(item.messages[-1]["content"]) for item in workload.items]


def common_prefix(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def error_of(spec: str, **kwargs: Any) -> str:
    with pytest.raises(WorkloadError) as info:
        load_workload(spec, **kwargs)
    message = str(info.value)
    assert "\n" not in message  # one line, for the CLI
    return message


# ---------------------------------------------------------------- built-ins


def test_builtin_names() -> None:
    assert builtin_names() == sorted(BUILTINS + MULTI_TURN)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_is_well_formed(name: str) -> None:
    w = load_workload(name)
    assert w.name == name and w.description
    assert Path(w.source).is_file()
    assert len(w.items) >= 40
    assert len({item.id for item in w.items}) == len(w.items)
    assert len(set(last_user(w))) == len(w.items), "every item must end with a different user message"
    for item in w.items:
        roles = [m["role"] for m in item.messages]
        turns = roles[1:] if roles[0] == "system" else roles
        assert turns == ["user", "assistant"] * (len(turns) // 2) + ["user"], item.id
        assert all(str(m["content"]).strip() for m in item.messages)
        assert item.prompt is None and item.body is None and item.arrival_s is None


@pytest.mark.parametrize(
    ("name", "max_tokens"), [("ja_chat", 512), ("code_agent", 2048), ("ja_medium", 256), ("ja_long", 512)]
)
def test_builtin_max_tokens(name: str, max_tokens: int) -> None:
    w = load_workload(name)
    assert w.max_tokens == max_tokens
    assert {w.max_tokens_for(item) for item in w.items} == {max_tokens}


@pytest.mark.parametrize("name", ["ja_chat", "ja_medium", "ja_long"])
def test_japanese_builtins_are_japanese(name: str) -> None:
    for item in load_workload(name).items:
        for m in item.messages:
            text = str(m["content"])
            assert len(JAPANESE.findall(text)) > len(text) / 2, (item.id, text[:40])


def test_ja_chat_has_personas_and_earlier_turns() -> None:
    items = load_workload("ja_chat").items
    assert all(item.messages[0]["role"] == "system" for item in items)
    assert len({item.messages[0]["content"] for item in items}) >= 8
    exchanges = [(len(item.messages) - 2) // 2 for item in items]
    assert max(exchanges) == 3
    assert sum(1 for e in exchanges if e >= 1) >= len(items) / 2
    assert sum(1 for e in exchanges if e >= 2) >= 10


def test_code_agent_carries_real_code() -> None:
    items = load_workload("code_agent").items
    languages: set[str] = set()
    sized = 0
    for item in items:
        assert item.messages[0]["role"] == "system"
        text = "\n".join(str(m["content"]) for m in item.messages[1:])
        blocks = FENCE.findall(text)
        assert blocks, f"{item.id} has no fenced code"
        languages.update(lang for lang, _ in blocks if lang)
        sized += any(20 <= len(body.splitlines()) <= 80 for _, body in blocks)
        assert len(text.encode("ascii", "ignore")) > 0.98 * len(text), f"{item.id} is not English"
    assert {"python", "ts", "go", "rust", "sql"} <= languages and len(languages) >= 10
    assert sized >= 25
    assert sum(1 for item in items if len(item.messages) > 2) >= 3  # follow-ups to an earlier answer


@pytest.mark.parametrize(
    ("name", "low", "high", "mean_low", "mean_high"), [("ja_medium", 70, 150, 90, 135), ("ja_long", 150, 300, 180, 250)]
)
def test_japanese_prompt_lengths(name: str, low: int, high: int, mean_low: int, mean_high: int) -> None:
    counts = [approx_token_count(text) for text in last_user(load_workload(name))]
    assert all(low <= c <= high for c in counts), counts
    assert mean_low <= sum(counts) / len(counts) <= mean_high


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_files_are_pretty_printed_utf8(name: str) -> None:
    text = (ROOT / "workloads" / f"{name}.json").read_text(encoding="utf-8")
    assert text.startswith('{\n  "format_version": 1,\n  "name": ')
    assert "\\u" not in text  # written with ensure_ascii=False
    assert json.loads(text)["name"] == name


def test_readme_examples_parse(tmp_path: Path) -> None:
    readme = (ROOT / "workloads" / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", readme, re.S)
    w = parse_specproxy(json.loads(blocks[0]), source="README.md")
    assert [item.id for item in w.items] == ["refund-1", "shipping-2"]
    assert [w.max_tokens_for(item) for item in w.items] == [300, 120]
    lines = load_workload(write(tmp_path, "readme.jsonl", blocks[1]))
    assert len(lines.items) == 4
    assert [item.body is not None for item in lines.items] == [False, False, True, True]


# ---------------------------------------------------------------- errors


def test_unknown_name_lists_the_builtins() -> None:
    message = error_of("ja_chatt")
    assert "ja_chatt" in message
    assert all(name in message for name in BUILTINS)


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.json")
    assert path in error_of(path) and "no such file" in error_of(path)


def test_unreadable_file_names_it(tmp_path: Path) -> None:
    message = error_of(str(tmp_path) + "/")
    assert str(tmp_path) in message and "cannot read" in message


def test_bad_json_reports_path_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.json", '{\n  "name": "x",\n  "items": [,]\n}\n')
    message = error_of(path)
    assert message.startswith(f"{path}: invalid JSON at line 3 column")


def test_bad_jsonl_line_reports_path_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "prompts.jsonl", '"first"\n\n{"prompt": "third"\n')
    assert error_of(path).startswith(f"{path}:3: invalid JSON")


def test_not_utf8_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'"ok"\n"caf\xe9"\n')
    assert error_of(str(path)).startswith(f"{path}:2: not UTF-8")


def conversation(*roles: str) -> list[dict[str, str]]:
    return [{"role": r, "content": f"{r} text {i}"} for i, r in enumerate(roles)]


def native(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format_version": 1,
        "name": "mine",
        "max_tokens": 64,
        "items": [{"id": "a", "messages": conversation("system", "user")}],
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (native(name="has space"), "workload name must be"),
        (native(name="x" * 65), "workload name must be"),
        (native(format_version=2), "format_version 2 is not supported"),
        (native(items=[]), "items must be a non-empty list"),
        (native(max_tokens=0), "max_tokens must be a positive integer"),
        (native(max_token=10), "unknown keys ['max_token']"),
        (
            native(items=[{"id": "a", "messages": conversation("user", "assistant")}]),
            "last message must be a user turn",
        ),
        (
            native(items=[{"id": "a", "messages": conversation("user", "user")}]),
            "messages[1]: role must be 'assistant'",
        ),
        (native(items=[{"id": "a", "messages": conversation("user", "system", "user")}]), "role must be 'assistant'"),
        (native(items=[{"id": "a", "messages": [{"role": "user", "content": ""}]}]), "non-empty string"),
        (native(items=[{"id": "a", "messages": [{"role": "user", "content": "x", "name": "n"}]}]), "nothing else"),
        (native(items=[{"id": "a", "messages": conversation("user")}] * 2), "items[1]: duplicate id 'a'"),
        (native(items=[{"id": "a", "messages": conversation("user"), "max_tokens": -1}]), "positive integer"),
        ("just text", "JSON object"),
    ],
)
def test_native_validation(tmp_path: Path, data: Any, expected: str) -> None:
    path = write(tmp_path, "mine.json", json.dumps(data))
    message = error_of(path)
    assert message.startswith(path) and expected in message


def test_native_defaults_and_notes(tmp_path: Path) -> None:
    data = {"name": "mine", "_note": "kept out", "items": [{"messages": conversation("user"), "_why": "x"}]}
    w = load_workload(write(tmp_path, "mine.json", json.dumps(data)))
    assert (w.name, w.description, w.max_tokens) == ("mine", "", 512)
    assert w.items[0].id == "mine-1" and w.items[0].max_tokens is None


# ---------------------------------------------------------------- ShareGPT and JSONL


def test_sharegpt(tmp_path: Path) -> None:
    data = [
        {
            "id": "c1",
            "conversations": [
                {"from": "human", "value": "Hi"},
                {"from": "gpt", "value": "Hello!"},
                {"from": "human", "value": "Tell me a joke"},
                {"from": "gpt", "value": "x" * 400},
            ],
        },
        {
            "id": "c2",
            "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "What is 2+2?"}],
        },
        {"id": "c3", "conversations": [{"from": "gpt", "value": "only the bot"}]},
        {
            "id": "c1",
            "conversations": [
                {"from": "human", "value": "Part one"},
                {"from": "human", "value": "part two"},
                {"from": "gpt", "value": "ok"},
                {"from": "tool", "value": "?"},
            ],
        },
        {"id": "c5", "conversations": [{"from": "gpt", "value": "Welcome!"}, {"from": "human", "value": "Thanks"}]},
    ]
    w = load_workload(write(tmp_path, "sg.json", json.dumps(data)))
    assert w.name == "sg" and "2 skipped" in w.description
    assert [item.id for item in w.items] == ["c1", "c2", "c5"]
    first, second, third = w.items
    assert [m["role"] for m in first.messages] == ["user", "assistant", "user"]
    assert first.messages[-1]["content"] == "Tell me a joke" and first.expected_output_tokens == 100
    assert second.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"})
    assert second.expected_output_tokens is None
    assert third.messages == ({"role": "user", "content": "Thanks"},)


def test_sharegpt_merges_split_turns_and_keeps_duplicate_ids_apart(tmp_path: Path) -> None:
    data = [
        {"id": "dup", "conversations": [{"from": "human", "value": "a"}]},
        {"id": "dup", "conversations": [{"from": "human", "value": "b"}, {"from": "human", "value": "c"}]},
    ]
    w = load_workload(write(tmp_path, "sg.json", json.dumps(data)))
    assert [item.id for item in w.items] == ["dup", "dup#2"]
    assert w.items[1].messages == ({"role": "user", "content": "b\n\nc"},)


def test_jsonl_prompts(tmp_path: Path) -> None:
    text = '"Explain TCP."\n\n{"prompt": "Write a haiku.", "max_tokens": 64}\n{"prompt": "Named", "id": "n1"}\n'
    w = load_workload(write(tmp_path, "prompts.jsonl", text))
    assert [item.id for item in w.items] == ["prompts:1", "prompts:3", "n1"]
    assert [item.prompt for item in w.items] == ["Explain TCP.", "Write a haiku.", "Named"]
    assert all(item.body is None for item in w.items)
    assert w.items[1].messages == ({"role": "user", "content": "Write a haiku."},)
    assert [w.max_tokens_for(item) for item in w.items] == [512, 64, 512]


def test_jsonl_request_bodies(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Summarise"}]
    chat = {"messages": messages, "max_tokens": 256, "temperature": 0.2}
    completion = {"model": "m", "prompt": "def fib(n):", "max_completion_tokens": 128}
    w = load_workload(write(tmp_path, "bodies.jsonl", json.dumps(chat) + "\n" + json.dumps(completion) + "\n"))
    a, b = w.items
    assert a.body == chat and a.messages == tuple(messages) and a.max_tokens == 256 and a.prompt is None
    assert b.body == completion and b.prompt == "def fib(n):" and b.max_tokens == 128


def test_jsonl_bad_record(tmp_path: Path) -> None:
    path = write(tmp_path, "bodies.jsonl", '{"prompt": "ok"}\n{"input": "no"}\n')
    message = error_of(path)
    assert message.startswith(f"{path}:2:") and "request body" in message


def test_json_array_of_prompts_and_forced_format(tmp_path: Path) -> None:
    w = load_workload(write(tmp_path, "list.json", json.dumps(["one", {"prompt": "two"}])))
    assert [item.prompt for item in w.items] == ["one", "two"]
    forced = load_workload(write(tmp_path, "prompts.txt", '"a"\n"b"\n"c"\n'), format="jsonl", limit=2)
    assert [item.prompt for item in forced.items] == ["a", "b"]
    assert "known formats: " + ", ".join(FORMATS) in error_of(str(tmp_path / "prompts.txt"), format="yaml")


# ---------------------------------------------------------------- traces


def within(count: int, target: int, tolerance: float = 0.10) -> bool:
    return abs(count - target) <= tolerance * target + 2


def test_mooncake_trace(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [
        {"timestamp": 5000, "input_length": 1500, "output_length": 52, "hash_ids": [0, 1, 2]},
        {"timestamp": 5250, "input_length": 700, "output_length": 10, "hash_ids": [0, 9]},
        {"timestamp": 9000, "input_length": 12000, "output_length": 0, "hash_ids": []},
        {"timestamp": 9001, "input_length": 300, "output_length": 7, "hash_ids": [5, 6]},  # ids don't fit the length
    ]
    path = write(tmp_path, "mooncake.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    w = load_workload(path)
    assert w.name == "mooncake" and "Mooncake" in w.description
    assert [item.arrival_s for item in w.items] == [0.0, 0.25, 4.0, 4.001]
    assert [item.max_tokens for item in w.items] == [52, 10, 1, 7]
    assert [item.expected_output_tokens for item in w.items] == [52, 10, 0, 7]
    for item, record in zip(w.items, records, strict=True):
        assert item.prompt is not None and item.messages == ({"role": "user", "content": item.prompt},)
        assert within(approx_token_count(item.prompt), record["input_length"]), item.id
    first, second, third, _ = (str(item.prompt) for item in w.items)
    shared = common_prefix(first, second)
    assert approx_token_count(shared) >= 0.9 * MOONCAKE_BLOCK_TOKENS  # hash id 0 is the same block of text
    assert approx_token_count(shared) <= 1.1 * MOONCAKE_BLOCK_TOKENS  # then ids 1 and 9 differ
    assert approx_token_count(common_prefix(first, third)) < 50
    assert load_workload(path).items == w.items  # deterministic


def test_mooncake_lengths_follow_the_given_counter(tmp_path: Path) -> None:
    def by_bytes(text: str) -> int:  # a stand-in for a model tokenizer with a different ratio
        return len(text.encode("utf-8")) // 3

    path = write(
        tmp_path,
        "t.jsonl",
        json.dumps({"timestamp": 0, "input_length": 4000, "output_length": 1, "hash_ids": list(range(8))}) + "\n",
    )
    prompt = str(load_workload(path, count_tokens=by_bytes).items[0].prompt)
    assert within(by_bytes(prompt), 4000)
    assert not within(approx_token_count(prompt), 4000)


def test_mooncake_bad_record(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 1}\n'
        '{"timestamp": 1, "input_length": -3, "output_length": 1}\n',
    )
    assert error_of(path).startswith(f"{path}:2: input_length must be a non-negative integer")


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,4808,10
2023-11-16 18:15:50.7241850,3180,8

2023-11-16 18:16:01.0000000,12,0
"""


def test_azure_trace(tmp_path: Path) -> None:
    w = load_workload(write(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE))
    assert w.name == "AzureLLMInferenceTrace_code" and "Azure" in w.description
    arrivals = [item.arrival_s for item in w.items]
    assert arrivals == pytest.approx([0.0, 4.043595, 14.31941], abs=1e-7)
    assert [item.max_tokens for item in w.items] == [10, 8, 1]
    assert [item.expected_output_tokens for item in w.items] == [10, 8, 0]
    for item, target in zip(w.items, [4808, 3180, 12], strict=True):
        assert within(approx_token_count(str(item.prompt)), target), item.id
    assert len({item.prompt for item in w.items}) == 3


def test_azure_detected_without_extension_and_limited(tmp_path: Path) -> None:
    w = load_workload(write(tmp_path, "trace", AZURE), limit=1)
    assert len(w.items) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("time,tokens\n1,2\n", ":1: expected a header TIMESTAMP,ContextTokens,GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\nyesterday,1,1\n", ":3: not a timestamp"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,many,1\n", ":2: invalid literal"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1\n", ":2: expected 3 columns"),
    ],
)
def test_azure_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "bad.csv", text)
    message = error_of(path)
    assert message.startswith(path) and expected in message


def test_azure_timestamps() -> None:
    base = parse_azure_timestamp("2023-11-16 18:15:46.6805900")
    assert parse_azure_timestamp("2023-11-16 18:15:46.68059") == base
    assert parse_azure_timestamp("2023-11-16T18:15:46.6805900Z") == base
    assert parse_azure_timestamp("2023-11-17 03:15:46.6805900+09:00") == base
    assert parse_azure_timestamp("2023-11-16 18:15:47") - base == 319_410_000
    with pytest.raises(ValueError):
        parse_azure_timestamp("16/11/2023 18:15")


# ---------------------------------------------------------------- token approximation


@pytest.mark.parametrize(("text", "tokens"), [("", 0), ("abcd", 1), ("abcde", 2), ("日本語", 3), ("GPUで速い", 4)])
def test_approx_token_count(text: str, tokens: int) -> None:
    assert approx_token_count(text) == tokens


def test_workload_error_is_a_value_error() -> None:
    assert issubclass(WorkloadError, ValueError)
