"""Conversations that grow: the multi-turn variants of the built-in workloads, and shared prefixes.

A multi-turn item (`WorkloadItem.followups`) sends its first request, then each follow-up as the next user turn after
the model's own replies, so ngram and suffix drafting see the conversation's own text grow. The built-ins
`ja_chat_multi` and `code_agent_multi` are made here from the items `ja_chat` and `code_agent` already have: each
item's first user turn opens the conversation, its later user turns follow (their canned assistant replies are
dropped: the model's own replies take their place), and generic follow-ups of the workload's kind fill it up to
`MULTI_TURNS` turns.

Shared prefixes (`with_shared_prefixes`) put one of a few long system prompts before a share of the requests, as
production traffic with fixed system prompts or documents does, so speculation is measured together with prefix
caching. Pure: workloads in, workloads out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from specproxy.workloads.corpus import CountTokens
from specproxy.workloads.types import Workload, WorkloadError, WorkloadItem, check_name

MULTI_TURNS = 4
DEFAULT_THINK_TIME_S = 1.0

# The follow-ups a user of each kind sends after an answer, cycled from a different start per item.
JA_CHAT_FOLLOWUPS = (
    "へえ、そうなんですね。もう少し詳しく教えてもらえますか？",
    "ありがとうございます。ほかに気をつけることはありますか？",
    "なるほど。じゃあ、まず何から始めたらいいと思いますか？",
    "今のお話、三行くらいで短くまとめてもらえますか？",
    "ふふ、ありがとう。ちなみに、あなたならどうしますか？",
)
CODE_AGENT_FOLLOWUPS = (
    "Now add unit tests for that code. Show the complete test file.",
    "Handle the error cases as well, and show the full updated code.",
    "Refactor it so it is easier to read, keeping the behaviour. Show the whole file again.",
    "Add type annotations and docstrings to the final version, and show it in full.",
    "Review your last version for bugs and show the corrected code in full.",
)


@dataclass(frozen=True, slots=True)
class MultiTurnVariant:
    """A built-in made from another: `base`'s items as conversations of `turns` turns."""

    base: str
    followups: tuple[str, ...]
    description: str
    turns: int = MULTI_TURNS
    think_time_s: float = DEFAULT_THINK_TIME_S


MULTI_TURN_BUILTINS = {
    "ja_chat_multi": MultiTurnVariant(
        "ja_chat",
        JA_CHAT_FOLLOWUPS,
        f"ja_chat as conversations of {MULTI_TURNS} turns, each turn carrying the model's own earlier replies.",
    ),
    "code_agent_multi": MultiTurnVariant(
        "code_agent",
        CODE_AGENT_FOLLOWUPS,
        f"code_agent as conversations of {MULTI_TURNS} turns: tests, error handling and refactors of its own code.",
    ),
}


def as_conversations(base: Workload, name: str, variant: MultiTurnVariant) -> Workload:
    """`base`'s items as conversations (see the module's docstring)."""
    items: list[WorkloadItem] = []
    for i, item in enumerate(base.items):
        system = [dict(m) for m in item.messages if m["role"] == "system"]
        users = [str(m["content"]) for m in item.messages if m["role"] == "user"]
        if item.body is not None or item.prompt is not None or not users:
            raise WorkloadError(f"{base.source}: item {item.id!r} is not a chat conversation")
        own = users[1 : variant.turns]
        generic = [variant.followups[(i + j) % len(variant.followups)] for j in range(variant.turns - 1 - len(own))]
        opening: tuple[dict[str, Any], ...] = (*system, {"role": "user", "content": users[0]})
        items.append(replace(item, messages=opening, followups=(*own, *generic)))
    return Workload(
        name=name,
        description=variant.description,
        max_tokens=base.max_tokens,
        items=tuple(items),
        source=f"{base.source} ({name})",
        think_time_s=variant.think_time_s,
    )


def with_think_time(workload: Workload, think_time_s: float) -> Workload:
    return replace(workload, think_time_s=think_time_s)


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """`count` distinct prefixes of about `tokens` tokens each, put before `share` of the requests (0 to 1)."""

    count: int
    tokens: int
    share: float = 1.0

    def __post_init__(self) -> None:
        if self.count < 1 or self.tokens < 1 or not 0.0 <= self.share <= 1.0:
            raise ValueError("shared prefixes need count >= 1, tokens >= 1 and a share from 0 to 1")


def prefix_texts(spec: SharedPrefixes, texts: list[str], count_tokens: CountTokens) -> list[str]:
    """`spec.count` distinct texts of about `spec.tokens` tokens, each made of `texts` from its own starting point.

    Each begins with its own number, so no two share more than a few tokens (a shared prefix between them would
    make the engine's cache hits come from the wrong place).
    """
    if not texts:
        raise WorkloadError("no text to build shared prefixes from")
    out = []
    for p in range(spec.count):
        parts = [f"Reference document {p + 1} of {spec.count}. Read it before answering.\n"]
        used, j = count_tokens(parts[0]), p * 7
        while used < spec.tokens:
            t = texts[j % len(texts)]
            parts.append(t)
            used += count_tokens(t) + 1
            j += 1
            if j - p * 7 > 100_000:  # texts of no tokens at all
                raise WorkloadError("the texts for shared prefixes count no tokens")
        out.append("\n".join(parts))
    return out


def with_shared_prefixes(workload: Workload, spec: SharedPrefixes, prefixes: list[str], seed: int) -> Workload:
    """`workload` with one of `prefixes` as the system prompt (before any of its own) of a `spec.share` of its items,
    chosen and assigned reproducibly from `seed`. The item's id says which prefix it carries (`...@p2`)."""
    rng = random.Random(f"{seed}:{workload.name}")
    items: list[WorkloadItem] = []
    for item in workload.items:
        if item.body is not None or item.prompt is not None or rng.random() >= spec.share:
            items.append(item)
            continue
        p = rng.randrange(len(prefixes))
        own_system = [str(m["content"]) for m in item.messages if m["role"] == "system"]
        system = "\n\n".join([prefixes[p], *own_system])
        rest = tuple(dict(m) for m in item.messages if m["role"] != "system")
        items.append(replace(item, id=f"{item.id}@p{p + 1}", messages=({"role": "system", "content": system}, *rest)))
    name = check_name(workload.name, workload.source)
    return replace(workload, name=name, items=tuple(items))
