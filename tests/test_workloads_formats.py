"""Each workload format module on its own: text or decoded records in, items out, without files or sniffing.

tests/test_workloads.py covers the same readers end to end through `load_workload`; these pin what each module's
reader does with its input, including the places its error messages point at.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from specproxy.core.tokens import approx_token_count
from specproxy.workloads import azure, jsonl, mooncake, native, sharegpt
from specproxy.workloads.builtin import builtin_dir, builtin_names, load_builtin
from specproxy.workloads.corpus import MOONCAKE_BLOCK_TOKENS, PromptCorpus
from specproxy.workloads.load import load_workload
from specproxy.workloads.registry import ReadOptions
from specproxy.workloads.sniff import WorkloadText
from specproxy.workloads.types import WorkloadError


def words(text: str) -> int:
    """A counter simple enough to reason about: one token a word."""
    return len(text.split())


PARAGRAPHS = "\n\n".join(" ".join(f"p{p}w{w}" for w in range(40)) for p in range(12))


def small_corpus(count_tokens: Any = words) -> PromptCorpus:
    return PromptCorpus([PARAGRAPHS], count_tokens)


def read(module: Any, text: str, source: str, **options: Any) -> Any:
    opts = ReadOptions(count_tokens=options.pop("count_tokens", approx_token_count), **options)
    return module.FORMAT.read(WorkloadText(text, source), opts)


def error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(WorkloadError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def lines(*records: Any) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


# ---------------------------------------------------------------- native (the specproxy format)


def test_native_reads_items_in_order_with_default_ids() -> None:
    text = json.dumps(
        {
            "name": "support",
            "max_tokens": 100,
            "items": [
                {"id": "q1", "messages": [{"role": "user", "content": "Refund?"}], "max_tokens": 20},
                {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hours?"}]},
            ],
        }
    )
    w = read(native, text, "support.json")
    assert (w.name, w.max_tokens, w.source) == ("support", 100, "support.json")
    assert [item.id for item in w.items] == ["q1", "support-2"]
    assert [w.max_tokens_for(item) for item in w.items] == [20, 100]
    assert w.items[1].messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hours?"})


def test_native_error_points_at_the_message() -> None:
    assert error(native.parse_specproxy, {"name": "x", "items": [{"messages": []}]}, source="x.json") == (
        "x.json: items[0] (id 'x-1'): messages must be a non-empty list"
    )
    data = {"name": "x", "items": [{"id": "b", "messages": [{"role": "user", "content": "a"}] * 2}]}
    assert error(native.parse_specproxy, data, source="x.json") == (
        "x.json: items[0] (id 'b').messages[1]: role must be 'assistant' here (got 'user'): an optional system "
        "message, then user and assistant turns alternating"
    )


def test_native_reports_broken_json_with_its_position() -> None:
    assert error(read, native, '{"name": "x",\n "items": [,]}', "x.json").startswith(
        "x.json: invalid JSON at line 2 column"
    )


# ---------------------------------------------------------------- ShareGPT


def test_sharegpt_ids_replies_and_limit() -> None:
    data = [
        {"id": 7, "conversations": [{"from": "human", "value": "one"}, {"from": "gpt", "value": "a b c"}]},
        {"conversations": [{"from": "tool", "value": "skipped"}]},
        {"conversations": [{"from": "user", "value": "three"}]},
        {"id": "last", "conversations": [{"from": "human", "value": "four"}]},
    ]
    w = sharegpt.parse_sharegpt(data, source="dir/sg.json", count_tokens=words)
    assert [item.id for item in w.items] == ["7", "3", "last"]  # no id: the position, from 1
    assert [item.expected_output_tokens for item in w.items] == [3, None, None]  # measured by the given counter
    assert w.name == "sg"
    assert w.description == "ShareGPT conversations from dir/sg.json (1 skipped: no human turn or unknown speaker)"
    limited = sharegpt.parse_sharegpt(data, source="sg.json", count_tokens=words, limit=2)
    assert [item.id for item in limited.items] == ["7", "3"]  # the limit counts items, not entries skipped


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"conversations": []}, 'sg.json: ShareGPT data is a JSON list of {"conversations": [...]}'),
        ([{"conversations": []}, {"turns": []}], 'sg.json: [1]: expected {"conversations": [...]} (ShareGPT)'),
        ([{"conversations": [{"from": "gpt", "value": "hi"}]}], "sg.json: no usable ShareGPT conversation (1 skipped)"),
    ],
)
def test_sharegpt_errors(data: Any, expected: str) -> None:
    assert error(sharegpt.parse_sharegpt, data, source="sg.json", count_tokens=words) == expected


def test_sharegpt_format_reads_text() -> None:
    text = json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x" * 8}]}])
    (item,) = read(sharegpt, text, "sg.json").items
    assert item.messages == ({"role": "user", "content": "hi"},) and item.expected_output_tokens == 2


# ---------------------------------------------------------------- JSONL prompts and request bodies


def test_jsonl_lines_are_named_by_line_number() -> None:
    text = '"a"\n\n{"prompt": "b", "id": "named"}\n{"messages": [{"role": "user", "content": "c"}], "top_p": 0.5}\n'
    w = read(jsonl, text, "reqs.jsonl")
    assert [item.id for item in w.items] == ["reqs:1", "named", "reqs:4"]
    assert [item.prompt for item in w.items] == ["a", "b", None]
    assert w.items[2].body == {"messages": [{"role": "user", "content": "c"}], "top_p": 0.5}
    assert [item.id for item in read(jsonl, text, "reqs.jsonl", limit=1).items] == ["reqs:1"]


def test_jsonl_array_is_named_by_position() -> None:
    w = read(jsonl, json.dumps(["a", {"prompt": "b", "max_tokens": 9}]), "reqs.json")
    assert [(item.id, item.max_tokens) for item in w.items] == [("reqs:1", None), ("reqs:2", 9)]
    assert error(read, jsonl, '["a", 3]', "reqs.json").startswith("reqs.json: [1]: expected a prompt string")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"a"\n{"prompt": "b"\n', "reqs.jsonl:2: invalid JSON at column"),
        ('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n', "reqs.jsonl:2: duplicate id 'x'"),
        ('{"prompt": "a", "max_tokens": 0}\n', "reqs.jsonl:1: max_tokens must be a positive integer"),
        ('{"messages": []}\n', 'reqs.jsonl:1: messages must be a non-empty list of {"role": ..., ...}'),
        ("\n\n", "reqs.jsonl: no requests in the file"),
    ],
)
def test_jsonl_errors(text: str, expected: str) -> None:
    assert error(read, jsonl, text, "reqs.jsonl").startswith(expected)


# ---------------------------------------------------------------- Mooncake traces


def test_mooncake_blocks_share_text_by_hash_id() -> None:
    corpus = small_corpus()
    n = MOONCAKE_BLOCK_TOKENS
    records = [
        {"timestamp": 1000, "input_length": n + 10, "output_length": 5, "hash_ids": [3, 4]},
        {"timestamp": 1500, "input_length": n + 20, "output_length": 0, "hash_ids": [3, 8]},
        {"timestamp": 1200, "input_length": 30, "output_length": 2, "hash_ids": [3, 4, 5]},  # ids too many: no sharing
    ]
    w = mooncake.parse_mooncake(
        [(f"t.jsonl:{i + 1}", i + 1, r) for i, r in enumerate(records)], source="t.jsonl", corpus=corpus
    )
    first, second, third = (str(item.prompt) for item in w.items)
    assert first == corpus.block(3) + "\n\n" + corpus.text(4, 10)
    assert second == corpus.block(3) + "\n\n" + corpus.text(8, 20)
    assert third == corpus.text(2, 30)  # keyed by position instead
    assert [item.id for item in w.items] == ["t-1", "t-2", "t-3"]
    assert [item.arrival_s for item in w.items] == [0.0, 0.5, 0.2]  # file order kept, times from the earliest
    assert [(item.max_tokens, item.expected_output_tokens) for item in w.items] == [(5, 5), (1, 0), (2, 2)]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ([1, 2], "t.jsonl:1: expected a Mooncake record object"),
        ({"timestamp": True, "input_length": 1, "output_length": 1}, "t.jsonl:1: timestamp (ms) must be a number"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}, "hash_ids must be a list"),
        ({"timestamp": 0, "input_length": 1.5, "output_length": 1}, "input_length must be a non-negative integer"),
        ({"timestamp": 0, "input_length": 1}, "t.jsonl:1: output_length must be a non-negative integer (got None)"),
    ],
)
def test_mooncake_errors(record: Any, expected: str) -> None:
    message = error(read, mooncake, lines(record), "t.jsonl", corpus=small_corpus)
    assert message.startswith("t.jsonl:1: ") and expected in message


def test_mooncake_needs_a_corpus_and_uses_the_counter() -> None:
    text = lines({"timestamp": 0, "input_length": 50, "output_length": 1})
    assert error(read, mooncake, text, "t.jsonl") == "t.jsonl: no text to rebuild the trace's prompts from"
    (item,) = read(mooncake, text, "t.jsonl", corpus=small_corpus, count_tokens=words).items
    assert words(str(item.prompt)) == 50


# ---------------------------------------------------------------- Azure traces


def test_azure_columns_by_header_name() -> None:
    corpus = small_corpus()
    text = (
        "Extra,GeneratedTokens,TIMESTAMP,ContextTokens\nx,4,2023-11-16 18:15:46.5,30\n\ny,0,2023-11-16 18:15:46.0,12\n"
    )
    w = azure.parse_azure_csv(text, source="az.csv", corpus=corpus)
    assert [item.prompt for item in w.items] == [corpus.text(0, 30), corpus.text(1, 12)]
    assert [item.arrival_s for item in w.items] == [0.5, 0.0]
    assert [(item.max_tokens, item.expected_output_tokens) for item in w.items] == [(4, 4), (1, 0)]
    assert [item.id for item in w.items] == ["az-1", "az-2"]
    assert len(azure.parse_azure_csv(text, source="az.csv", corpus=corpus, limit=1).items) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-1,1\n", "az.csv:2: token counts must be"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n\n", "az.csv: no requests in the trace"),
        ("", "az.csv:1: expected a header TIMESTAMP,ContextTokens,GeneratedTokens"),
    ],
)
def test_azure_errors(text: str, expected: str) -> None:
    assert error(read, azure, text, "az.csv", corpus=small_corpus).startswith(expected)


# ---------------------------------------------------------------- the corpus and the built-ins


def test_corpus_cuts_to_the_counter() -> None:
    corpus = small_corpus()
    assert corpus.text(5, 100) == corpus.text(5, 100)
    assert words(corpus.text(5, 100)) == 100 and words(corpus.text(5, 7)) == 7
    assert corpus.text(5, 40).split()[0] != corpus.text(6, 40).split()[0]
    assert corpus.block(9) == corpus.text(9, MOONCAKE_BLOCK_TOKENS)
    assert error(PromptCorpus, ["", " \n\n "], words) == "prompt corpus: no text to build prompts from"


def test_builtins_load_from_their_own_folder() -> None:
    assert builtin_dir().name in ("workloads", "_builtin_workloads")
    assert not (builtin_dir() / "__init__.py").exists()  # the data folder, not the package of the same name
    for name in builtin_names():
        assert load_builtin(name) == load_workload(name)
