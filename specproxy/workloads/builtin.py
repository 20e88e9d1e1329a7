"""The built-in workloads: where their files are, their names, and the text trace prompts are rebuilt from.

The files live in the repository's top-level `workloads/` folder; the wheel ships that folder as
`specproxy/_builtin_workloads` (pyproject.toml, force-include), beside this package rather than inside it, so the
two never share a directory. Built-ins are specproxy-format files, read without sniffing, and the multi-turn
variants `conversations` makes from them (`ja_chat_multi`, `code_agent_multi`).
"""

from __future__ import annotations

from pathlib import Path

from specproxy.workloads.conversations import MULTI_TURN_BUILTINS, as_conversations
from specproxy.workloads.corpus import CountTokens, PromptCorpus
from specproxy.workloads.native import parse_specproxy
from specproxy.workloads.sniff import loads, read_text
from specproxy.workloads.types import Workload

# specproxy/, this file being specproxy/workloads/builtin.py
_PACKAGE = Path(__file__).resolve().parent.parent


def builtin_dir() -> Path:
    # Look for the wheel's copy first: in an installed wheel, ../workloads would be a top-level "workloads" in
    # site-packages, which may be anyone's.
    packaged = _PACKAGE / "_builtin_workloads"
    return packaged if packaged.is_dir() else _PACKAGE.parent / "workloads"  # a checkout


def _file_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.json"))


def builtin_names() -> list[str]:
    """Names of the built-in workloads, sorted: the files and the multi-turn variants made from them."""
    files = _file_names()
    return sorted([*files, *(n for n, v in MULTI_TURN_BUILTINS.items() if v.base in files)])


def load_builtin(name: str) -> Workload:
    """The built-in workload `name` (one of `builtin_names()`); its source is the file's path."""
    variant = MULTI_TURN_BUILTINS.get(name)
    if variant is not None:
        return as_conversations(load_builtin(variant.base), name, variant)
    path = builtin_dir() / f"{name}.json"
    source = str(path)
    return parse_specproxy(loads(read_text(path, source), source), source=source)


def builtin_texts() -> list[str]:
    """Every built-in's user and assistant text (not the system prompts), in file order."""
    texts: list[str] = []
    for name in _file_names():
        for item in load_builtin(name).items:
            texts.extend(str(m["content"]) for m in item.messages if m["role"] != "system")
    return texts


def builtin_corpus(count_tokens: CountTokens) -> PromptCorpus:
    """The text trace prompts are made of: `builtin_texts`."""
    return PromptCorpus(builtin_texts(), count_tokens)
