"""The format registry: sniffing picks the right format for each kind of file, and lookups by name."""

from __future__ import annotations

import json

import pytest

from specproxy.workloads import FORMATS
from specproxy.workloads.load import REGISTRY
from specproxy.workloads.registry import FormatRegistry, ReadOptions, WorkloadFormat
from specproxy.workloads.sniff import UNPARSED, WorkloadText
from specproxy.workloads.types import Workload, WorkloadError

NATIVE = json.dumps({"name": "x", "items": [{"messages": [{"role": "user", "content": "hi"}]}]})
SHAREGPT = json.dumps([{"id": "c1", "conversations": [{"from": "human", "value": "hi"}]}])
MOONCAKE = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n' * 2
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,48,10\n"
PROMPTS = '"a"\n{"prompt": "b"}\n'

# (file name, text, the format sniffing must pick, the formats whose sniff claims it before refinement)
QUESTIONS = (
    '{"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it in haiku."]}\n'
    '{"question_id": 91, "category": "coding", "turns": ["Write a function that reverses a list."]}\n'
)

SAMPLES = [
    ("mine.json", NATIVE, "specproxy", {"specproxy"}),
    ("mine", "\n  " + NATIVE, "specproxy", {"specproxy"}),
    ("mine.json", '"just text"', "specproxy", {"specproxy"}),  # a JSON value, but not a workload object
    ("mine.json", "null", "specproxy", set()),  # does not start like JSON a workload uses: left to the default
    ("mine.json", json.dumps({"prompt": "p", "items": []}), "specproxy", {"specproxy"}),  # "items": a workload file
    ("mine.json", '{\n  "items": [,]\n}\n', "specproxy", set()),  # broken JSON: nobody claims it, the default reports
    ("notes.txt", "hello\nworld\n", "specproxy", set()),
    ("sg.json", SHAREGPT, "sharegpt", {"sharegpt", "jsonl"}),
    ("sg", SHAREGPT, "sharegpt", {"sharegpt", "jsonl"}),
    ("sg.jsonl", SHAREGPT, "jsonl", {"jsonl"}),  # named as JSON lines: one line holding a list
    ("list.json", json.dumps(["a", {"prompt": "b"}]), "jsonl", {"jsonl"}),
    ("list.json", "[]", "jsonl", {"jsonl"}),
    ("prompts.jsonl", PROMPTS, "jsonl", {"jsonl"}),
    ("prompts.ndjson", PROMPTS, "jsonl", {"jsonl"}),
    ("prompts.json", PROMPTS, "jsonl", {"jsonl"}),  # not one document, but its first line is one
    ("prompts", PROMPTS, "jsonl", {"jsonl"}),
    ("one.json", '{"messages": [{"role": "user", "content": "hi"}]}', "jsonl", {"jsonl"}),  # a single request
    ("broken.jsonl", '{"prompt": \n', "jsonl", {"jsonl"}),  # its reader reports the line
    ("trace.jsonl", MOONCAKE, "mooncake", {"mooncake", "jsonl"}),
    ("trace.JSONL", MOONCAKE, "mooncake", {"mooncake", "jsonl"}),
    ("trace", MOONCAKE, "mooncake", {"mooncake", "jsonl"}),
    ("one.json", MOONCAKE.splitlines()[0], "mooncake", {"mooncake", "jsonl"}),  # a single trace record
    ("mixed.jsonl", PROMPTS + MOONCAKE, "jsonl", {"jsonl"}),  # the first record decides
    ("question.jsonl", QUESTIONS, "questions", {"questions", "jsonl"}),  # Spec-Bench / MT-Bench
    ("question", QUESTIONS, "questions", {"questions", "jsonl"}),
    ("azure.csv", AZURE, "azure", {"azure"}),
    ("azure.CSV", AZURE, "azure", {"azure"}),
    ("azure", "\n" + AZURE, "azure", {"azure"}),  # no extension: the header
    ("odd.csv", NATIVE, "azure", {"azure"}),  # named .csv: never taken for JSON
    ("odd.json", AZURE, "azure", {"azure"}),
]


@pytest.mark.parametrize(("source", "text", "expected", "claimants"), SAMPLES)
def test_sniffing_picks_the_format(source: str, text: str, expected: str, claimants: set[str]) -> None:
    sample = WorkloadText(text, source)
    assert {f.name for f in REGISTRY.formats if f.sniff(sample)} == claimants
    assert len(REGISTRY.claims(sample)) == min(1, len(claimants))  # never two claims left after refinement
    assert REGISTRY.detect(sample).name == expected


def test_every_format_is_sniffed_by_some_sample() -> None:
    assert {expected for _, _, expected, _ in SAMPLES} == set(FORMATS)


def test_formats_are_listed_in_the_documented_order() -> None:
    assert FORMATS == ("specproxy", "sharegpt", "jsonl", "mooncake", "questions", "azure")
    assert REGISTRY.get("mooncake", "x").name == "mooncake"
    with pytest.raises(WorkloadError) as info:
        REGISTRY.get("yaml", "prompts.txt")
    assert str(info.value) == (
        "prompts.txt: unknown format 'yaml'; known formats: specproxy, sharegpt, jsonl, mooncake, questions, azure"
    )


def test_the_sniffed_document_is_handed_to_the_reader() -> None:
    sample = WorkloadText(SHAREGPT, "sg.json")
    assert REGISTRY.detect(sample).name == "sharegpt"
    assert sample.decode() is sample.document  # decoded once, for sniffing and reading
    named_lines = WorkloadText(SHAREGPT, "sg.jsonl")
    assert named_lines.document is UNPARSED and named_lines.decode() == json.loads(SHAREGPT)
    with pytest.raises(WorkloadError, match=r"^x\.json: invalid JSON at line 1 column"):
        WorkloadText("{,", "x.json").decode()


def _toy_read(text: WorkloadText, options: ReadOptions) -> Workload:
    return Workload(name="toy", description="", max_tokens=1, items=(), source=text.source)


def _toy(name: str, suffix: str, refines: str | None = None) -> WorkloadFormat:
    return WorkloadFormat(name=name, sniff=lambda t: t.suffix == suffix, read=_toy_read, refines=refines)


def test_a_registry_of_other_formats() -> None:
    general, special = _toy("text", ".txt"), _toy("notes", ".txt", refines="text")
    registry = FormatRegistry((general, special, _toy("fallback", ".never")), default="fallback")
    assert registry.detect(WorkloadText("x", "a.txt")) is special
    assert registry.detect(WorkloadText("x", "a.md")).name == "fallback"
    with pytest.raises(AssertionError, match="claimed by text, other"):
        FormatRegistry((general, _toy("other", ".txt")), default="text").detect(WorkloadText("x", "a.txt"))


@pytest.mark.parametrize(
    "formats",
    [
        (_toy("a", ".a"), _toy("a", ".b")),  # the same name twice
        (_toy("a", ".a", refines="b"),),  # refines a format that is not there
    ],
)
def test_a_registry_checks_its_declarations(formats: tuple[WorkloadFormat, ...]) -> None:
    with pytest.raises(ValueError):
        FormatRegistry(formats, default="a")
    with pytest.raises(ValueError):
        FormatRegistry((_toy("a", ".a"),), default="missing")
