"""Prompt text for traces, and the token count that measures it.

A trace (Mooncake, Azure) records lengths and times, not text, so its prompts are made of real text (the built-in
workloads' paragraphs) cut to the recorded input length by a token counter. This module owns that text source
(`PromptCorpus`) and the item shape both trace formats produce. The default counter is
`specproxy.core.tokens.approx_token_count` (also what ShareGPT replies are measured with).

Pure: the caller supplies the texts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

from specproxy.workloads.types import WorkloadItem, check

CountTokens = Callable[[str], int]

# Mooncake traces hash the prompt in blocks of 512 tokens: equal hash ids mean equal prompt text (a shared prefix).
MOONCAKE_BLOCK_TOKENS = 512


class PromptCorpus:
    """Real text cut to a token length: paragraphs of the built-in workloads, taken in order from a start chosen by a
    key, so the same key always gives the same text and different keys (up to the paragraph count) start apart."""

    def __init__(self, texts: Iterable[str], count_tokens: CountTokens) -> None:
        paras: dict[str, None] = {}
        for text in texts:
            for p in re.split(r"\n\s*\n", text):
                if p.strip():
                    paras[p.strip()] = None
        self._paras = tuple(paras)
        check(bool(self._paras), "prompt corpus", "no text to build prompts from")
        self._count = count_tokens
        self._sep_tokens = count_tokens("\n\n")
        self._para_tokens = tuple(max(1, count_tokens(p)) for p in self._paras)
        n = len(self._paras)
        self._stride = next(s for s in range(max(1, int(n * 0.618)), 0, -1) if math.gcd(s, n) == 1)
        self._blocks: dict[int, str] = {}

    def text(self, key: int, n_tokens: int) -> str:
        """About `n_tokens` tokens (by the counter) of consecutive paragraphs, the last one cut to fit."""
        n_tokens = max(1, n_tokens)
        i = (key * self._stride) % len(self._paras)
        parts: list[str] = []
        left = n_tokens
        while left > 0:
            cost = self._para_tokens[i] + (self._sep_tokens if parts else 0)
            if cost <= left:
                parts.append(self._paras[i])
                left -= cost
            else:
                room = left - (self._sep_tokens if parts else 0)
                cut = self._cut(self._paras[i], room) if room > 0 else ""
                if cut:
                    parts.append(cut)
                break
            i = (i + 1) % len(self._paras)
        return "\n\n".join(parts)

    def block(self, hash_id: int) -> str:
        if hash_id not in self._blocks:
            self._blocks[hash_id] = self.text(hash_id, MOONCAKE_BLOCK_TOKENS)
        return self._blocks[hash_id]

    def _cut(self, para: str, n_tokens: int) -> str:
        lo, hi = 0, len(para)  # the longest prefix within n_tokens: counts grow with length
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(para[:mid]) <= n_tokens:
                lo = mid
            else:
                hi = mid - 1
        return para[:lo]


def trace_item(item_id: str, text: str, output_tokens: int, arrival_s: float) -> WorkloadItem:
    """One trace request: the rebuilt prompt, sent both as a chat turn and as a completions prompt."""
    return WorkloadItem(
        id=item_id,
        messages=({"role": "user", "content": text},),
        max_tokens=max(1, output_tokens),  # a request asks for at least one; traces do record 0
        prompt=text,
        arrival_s=arrival_s,
        expected_output_tokens=output_tokens,
    )
