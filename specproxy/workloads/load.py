"""The loader: a workload from a built-in name or a file path, in a format the registry recognises or the caller
forces. This is the one place that knows every format; it lists them once, in `REGISTRY`.

Apart from reading the file (and the built-ins for trace prompts) everything is delegated: `sniff` describes the
text, the registry picks the format, the format's module reads it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from specproxy.core.tokens import approx_token_count
from specproxy.workloads import azure, jsonl, mooncake, native, questions, sharegpt
from specproxy.workloads.builtin import builtin_corpus, builtin_names, builtin_texts, load_builtin
from specproxy.workloads.conversations import SharedPrefixes, prefix_texts, with_shared_prefixes, with_think_time
from specproxy.workloads.corpus import CountTokens, PromptCorpus
from specproxy.workloads.registry import FormatRegistry, ReadOptions
from specproxy.workloads.sniff import WorkloadText, read_text
from specproxy.workloads.types import MAX_NAME_CHARS, Workload, WorkloadError, check

# Listed in this order in messages and in workloads/README.md. A file no format claims is read as a specproxy
# workload file, whose reader says where its JSON breaks or what the object lacks.
REGISTRY = FormatRegistry(
    formats=(native.FORMAT, sharegpt.FORMAT, jsonl.FORMAT, mooncake.FORMAT, questions.FORMAT, azure.FORMAT),
    default=native.FORMAT.name,
)
FORMATS = REGISTRY.names()


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
    content = WorkloadText(text, source)
    fmt = REGISTRY.detect(content) if format is None else REGISTRY.get(format, source)
    return fmt.read(content, ReadOptions(count_tokens or approx_token_count, corpus, limit))


def load_workload(
    spec: str, *, count_tokens: CountTokens | None = None, format: str | None = None, limit: int | None = None
) -> Workload:
    """A built-in workload by name, or a workload file by path (format from its extension and content unless given).

    `count_tokens` measures text for trace prompts and ShareGPT replies (default `approx_token_count`);
    `limit` reads only the first items of a large file.
    """
    names = builtin_names()
    if spec in names and format in (None, native.FORMAT.name):
        return load_builtin(spec)
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
        read_text(path, spec),
        source=spec,
        format=format,
        count_tokens=count_tokens,
        corpus=builtin_corpus,
        limit=limit,
    )


def split_categories(workload: Workload) -> tuple[Workload, ...]:
    """One workload per category when the items carry categories (Spec-Bench, MT-Bench), in order of first
    appearance; items without one stay in a workload of the file's name. A workload without categories is itself."""
    if all(item.category is None for item in workload.items):
        return (workload,)
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(workload.items):
        key = workload.name if item.category is None else _category_name(item.category)
        groups.setdefault(key, []).append(i)
    return tuple(
        replace(
            workload,
            name=key,
            description=f"{workload.description}, category {key}",
            items=tuple(workload.items[i] for i in idx),
        )
        for key, idx in groups.items()
    )


def _category_name(category: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", category.strip())[:MAX_NAME_CHARS] or "uncategorised"


def load_workloads(
    spec: str, *, count_tokens: CountTokens | None = None, format: str | None = None, limit: int | None = None
) -> tuple[Workload, ...]:
    """`load_workload`, with a file of categorised questions made into one workload per category."""
    return split_categories(load_workload(spec, count_tokens=count_tokens, format=format, limit=limit))


def shape_workloads(
    workloads: tuple[Workload, ...],
    *,
    think_time_s: float | None,
    prefixes: SharedPrefixes | None,
    seed: int,
    texts: list[str] | None = None,
    count_tokens: CountTokens | None = None,
) -> tuple[Workload, ...]:
    """The run's workloads with `--think-time` and `--shared-prefixes` applied. The prefixes are made once, from
    `texts` (default: the built-in workloads' text), and shared by every workload, as one deployment's system prompts
    are shared by all its traffic."""
    out = workloads
    if think_time_s is not None:
        out = tuple(with_think_time(w, think_time_s) for w in out)
    if prefixes is not None:
        counter = count_tokens or approx_token_count
        made = prefix_texts(prefixes, texts if texts is not None else builtin_texts(), counter)
        out = tuple(with_shared_prefixes(w, prefixes, made, seed) for w in out)
    return out
