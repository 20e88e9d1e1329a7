"""Workloads: the built-in prompt sets, the workload file format, and readers for the datasets users already have.

A workload is a named list of requests. It comes from a specproxy workload file (`workloads/README.md` documents the
format; the built-ins are such files), a ShareGPT JSON file, a JSONL file of prompts or OpenAI request bodies, or a
recorded trace (Mooncake JSONL, Azure LLM inference CSV). A trace records lengths and times, not text, so its prompts
are made from the built-in text, cut to the recorded input length by a token counter.

This package re-exports the public API; the modules behind it are:

- `types`: `Workload`, `WorkloadItem`, `WorkloadError` and the checks every reader shares;
- `native`, `sharegpt`, `jsonl`, `mooncake`, `questions`, `azure`: one input format each, declared as a
  `registry.WorkloadFormat` (its name, how to recognise a file of its kind, how to read it);
- `registry`: how those declarations are looked up by name and how a file's format is recognised;
- `sniff`: a file's text and the decodings the formats recognise it by;
- `corpus`: the text trace prompts are cut from, and the approximate token count;
- `builtin`: where the built-in workloads are and their names;
- `conversations`: the multi-turn built-ins and shared prefixes;
- `load`: `load_workload`, `load_workloads` and `parse_workload`, the one place that lists every format.

Everything is pure (text in, `Workload` out) except `builtin_names` and `load_workload`, which read files.
"""

from specproxy.core.tokens import approx_token_count
from specproxy.workloads.azure import parse_azure_csv, parse_azure_timestamp
from specproxy.workloads.builtin import builtin_names
from specproxy.workloads.conversations import SharedPrefixes, with_shared_prefixes, with_think_time
from specproxy.workloads.corpus import MOONCAKE_BLOCK_TOKENS, CountTokens, PromptCorpus
from specproxy.workloads.jsonl import parse_requests
from specproxy.workloads.load import (
    FORMATS,
    load_workload,
    load_workloads,
    parse_workload,
    shape_workloads,
    split_categories,
)
from specproxy.workloads.mooncake import parse_mooncake
from specproxy.workloads.native import FORMAT_VERSION, parse_specproxy
from specproxy.workloads.sharegpt import parse_sharegpt
from specproxy.workloads.types import DEFAULT_MAX_TOKENS, Workload, WorkloadError, WorkloadItem, check_name

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FORMATS",
    "FORMAT_VERSION",
    "MOONCAKE_BLOCK_TOKENS",
    "CountTokens",
    "PromptCorpus",
    "SharedPrefixes",
    "Workload",
    "WorkloadError",
    "WorkloadItem",
    "approx_token_count",
    "builtin_names",
    "check_name",
    "load_workload",
    "load_workloads",
    "parse_azure_csv",
    "parse_azure_timestamp",
    "parse_mooncake",
    "parse_requests",
    "parse_sharegpt",
    "parse_specproxy",
    "parse_workload",
    "shape_workloads",
    "split_categories",
    "with_shared_prefixes",
    "with_think_time",
]
