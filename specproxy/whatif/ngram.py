"""vLLM's ngram (prompt lookup) proposer, replayed on token ids at greedy decoding. Pure: ids in, counts out.

Mirrored from vLLM ``v1/spec_decode/ngram_proposer.py`` (the version installed in the real-engine venv):

- :func:`propose` is ``_find_longest_matched_ngram_and_propose_tokens`` line for line: nothing when the context is
  shorter than ``min_n``; ``k`` capped at ``max_model_len - len(context)``; the longest suffix n-gram of length in
  ``[min_n, max_n]`` found earlier in the context (KMP over the reversed context, ``prev_lps >= longest`` so that a
  tie takes the *earliest* occurrence, and the match may not be the suffix itself); then up to ``k`` tokens after
  it, fewer when the context ends first.
- ``NgramProposer.propose``: a request is skipped when its context has reached ``max_model_len``.
- The scheduler (``v1/core/sched/scheduler.py``, ``update_from_output``) counts a draft (``num_drafts``,
  ``num_draft_tokens``, ``num_accepted_tokens``, per position) only for a step that had draft tokens scheduled; a
  step whose proposal was empty counts nothing and brings one token.

Greedy: the target's output is the same with or without speculation, so the accepted length of a step is the
matching prefix of its drafts against the recorded next output tokens, and the step brings accepted + 1 tokens.
The first token comes from the prefill, whose sampled token triggers the first proposal. The last step is the one
thing a recording cannot say exactly: drafts that match every remaining output token may go on matching what the
model would have said after the stop token or past ``max_tokens`` (vLLM counts those too, docs/real-engine.md);
:class:`Replay` keeps the lower bound and how many such tail drafts were open (``tail_open``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def propose(context: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """The draft vLLM's ngram proposer makes from ``context`` (prompt + output so far)."""
    total = len(context)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    tokens = context[::-1]
    lps = [0] * max_n
    longest, position, prev_lps, i = 0, 0, 0, 1
    while i < total:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            if prev_lps >= longest:
                longest, position = prev_lps, i
            if i < max_n:
                lps[i] = prev_lps
            if prev_lps == max_n:
                prev_lps = lps[max_n - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    k = min(k, total - start)
    return list(context[start : start + k])


@dataclass(slots=True)
class Replay:
    """One request's replay at one k, counted as vLLM's counters count it."""

    k: int
    drafts: int = 0  # steps that had drafts scheduled (vllm:spec_decode_num_drafts)
    draft_tokens: int = 0
    accepted: int = 0  # lower bound where tail_open
    per_position: list[int] = field(default_factory=list)
    decode_steps: int = 0  # steps after the prefill
    tail_open: int = 0  # drafts of the last step past the recorded output: accepted by the engine or not

    def add(self, other: Replay) -> None:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        self.decode_steps += other.decode_steps
        self.tail_open += other.tail_open
        for i, n in enumerate(other.per_position):
            if i < len(self.per_position):
                self.per_position[i] += n
            else:
                self.per_position.append(n)


def replay(prompt: Sequence[int], output: Sequence[int], k: int, min_n: int, max_n: int, max_model_len: int) -> Replay:
    """Step a greedy request through vLLM's ngram speculation: ``output`` is every generated token id, the stop
    token included when the request stopped on one."""
    if k < 1 or min_n < 1 or max_n < min_n:
        raise ValueError(f"need k >= 1 and 1 <= min_n <= max_n, got k={k}, min_n={min_n}, max_n={max_n}")
    r = Replay(k, per_position=[0] * k)
    if not output:
        return r
    context = [*prompt, output[0]]
    pos = 1  # output tokens known after the prefill
    while pos < len(output):
        draft = [] if len(context) >= max_model_len else propose(context, min_n, max_n, k, max_model_len)
        acc = 0
        while acc < len(draft) and pos + acc < len(output) and draft[acc] == output[pos + acc]:
            acc += 1
        if draft:
            r.drafts += 1
            r.draft_tokens += len(draft)
            r.accepted += acc
            for i in range(acc):
                r.per_position[i] += 1
            if pos + acc >= len(output):
                r.tail_open = len(draft) - acc
        step = min(acc + 1, len(output) - pos)
        context.extend(output[pos : pos + step])
        pos += step
        r.decode_steps += 1
    return r
