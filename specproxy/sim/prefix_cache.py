"""The simulator's prefix cache: prompt tokens an earlier request already computed are not computed again.

vLLM caches the KV of full blocks of a prompt, keyed by the hash of every token before them, and reports the hits as
``usage.prompt_tokens_details.cached_tokens`` (with ``--enable-prompt-tokens-details``, and only when non-zero). At
least one prompt token is always computed, so a hit covers at most the prompt's last full block before its last
token. The simulator has no real tokens, so it keys prefixes by whole messages: a prompt's prefix of messages 0..i is
cached when an earlier prompt began with the same messages, and counts the tokens those messages take, rounded down
to whole blocks; within a message, by pieces of `SEGMENT_CHARS` characters, so a long system prompt shared at the start
of different ones still hits. That gives the two effects workloads measure, shared system prompts and a conversation
re-sending its earlier turns; like vLLM's it forgets the least recently used prefixes first. Generated tokens are not
cached (vLLM caches them too): a conversation's hit covers the messages it sent before, not the replies. Pure.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

BLOCK_TOKENS = 16  # vLLM's default --block-size
SEGMENT_CHARS = 64

PrefixKeys = tuple[tuple[bytes, int], ...]


def prefix_keys(parts: Sequence[tuple[str, int]], count: Callable[[str], int]) -> PrefixKeys:
    """(hash of everything up to here, tokens up to here) after each piece of each part, given (text, extra tokens)
    per part: a part's text in pieces of `SEGMENT_CHARS` counted by `count`, then its extra (template) tokens."""
    h = hashlib.blake2b(digest_size=16)
    out: list[tuple[bytes, int]] = []
    total = 0
    for text, extra in parts:
        for i in range(0, len(text), SEGMENT_CHARS):
            piece = text[i : i + SEGMENT_CHARS]
            h.update(piece.encode("utf-8", "surrogatepass"))
            total += count(piece)
            out.append((h.copy().digest(), total))
        h.update(b"\0end of part\0")
        total += extra
        out.append((h.copy().digest(), total))
    return tuple(out)


class PrefixCache:
    """The prefixes seen, least recently used first, up to `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def lookup_and_insert(self, keys: PrefixKeys, prompt_tokens: int) -> int:
        """Cached tokens for a prompt with these prefix keys; the prompt's prefixes are cached from now on."""
        if self.capacity <= 0 or not keys:
            return 0
        best = 0
        for digest, tokens in keys:
            if digest in self._seen:
                self._seen.move_to_end(digest)
                best = tokens
            self._seen[digest] = None
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        cached = min(best, prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        return max(0, cached)
