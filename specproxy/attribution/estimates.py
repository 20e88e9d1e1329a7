"""A request's speculative acceptance from each per-request source, and the value type every source yields.

- **server**: the engine's own per-request figure (exact), in whichever shape it rides (vLLM's
  ``metrics.speculative_decoding``, SGLang's ``meta_info`` / ``sglext.spec_tokens_details``, TensorRT-LLM's
  ``choices[].speculative_decoding``, a gateway's ``usage.completion_tokens_details``, llama.cpp's ``timings``); the
  estimate keeps the shape's name (:mod:`specproxy.core.openai_stream`).
- **chunks**: one SSE chunk is one engine step carrying 1 + accepted tokens, so accepted = sum over the chunks after
  the first (the prefill token) of (tokens - 1), and decode steps = those chunks. Exact while chunks are steps and
  token counts are exact (measured on real vLLM: equal to the counter delta for every request that stopped by itself).
- **counters**: the engine's ``/metrics`` deltas shared among overlapping requests, in
  :mod:`specproxy.attribution.ledger`; it yields the same :class:`SpecEstimate`.

Pure: numbers and parsed JSON in, estimates out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specproxy.attribution.counts import SpecCounts
from specproxy.core.openai_stream import VLLM_METRICS
from specproxy.core.record import Estimate

LLAMACPP_TIMINGS = "llamacpp_timings"  # llama.cpp's timings.draft_n / draft_n_accepted, as spec.server_source


@dataclass(frozen=True, slots=True)
class SpecEstimate:
    counts: SpecCounts
    k: float | None = None
    exact: bool = True
    draft_tokens_known: bool = True  # chunks without a known k show drafts but not how many tokens each proposed
    shape: str | None = None  # where a server figure rode (core.openai_stream's names); None for other sources

    @property
    def draft_tokens(self) -> float | None:
        return self.counts.draft_tokens if self.draft_tokens_known else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.counts.acceptance_rate if self.draft_tokens_known else None

    def approximate(self) -> SpecEstimate:
        return self if not self.exact else replace(self, exact=False)

    def as_dict(self) -> Estimate:
        c = self.counts
        return Estimate(
            accepted=_num(c.accepted),
            drafts=_num(c.drafts),
            draft_tokens=_opt_num(self.draft_tokens),
            per_position=[_num(v) for v in c.per_position],
            k=_opt_num(self.k),
            exact=self.exact,
            acceptance_rate=self.acceptance_rate,
            mean_acceptance_length=c.mean_acceptance_length,
        )


def _num(v: float) -> float:
    """Whole numbers as JSON integers, shares rounded to 4 decimals."""
    r = round(v)
    return int(r) if abs(v - r) < 1e-9 else round(v, 4)


def _opt_num(v: float | None) -> float | None:
    return None if v is None else _num(v)


def per_position_from_steps(accepted_per_step: Iterable[int], k: int) -> tuple[float, ...]:
    """A step that accepted a tokens accepted positions 0..a-1 (a position counts only if the previous did)."""
    steps_by_accepted = Counter(accepted_per_step)
    return tuple(float(sum(c for a, c in steps_by_accepted.items() if a > i)) for i in range(k))


def from_server(spec: Mapping[str, Any]) -> SpecEstimate | None:
    """vLLM ``metrics.speculative_decoding`` (0.29+), summary or detailed, and every other engine's figure put in
    the same keys with its ``shape`` (:func:`specproxy.core.openai_stream.server_spec`,
    :func:`specproxy.core.dialects.native.sglang_spec`). Outside vLLM's own block the draft tokens may be unknown
    (older SGLang) and the steps too (TensorRT-LLM, gateways: drafts then read 0, as llama.cpp's); SGLang's accepted
    count may be ``derived`` from the token and step counts (then not exact)."""
    shape = spec.get("shape")
    own = shape in (None, VLLM_METRICS) and "engine" not in spec  # vLLM's block always has every count
    try:
        accepted = float(spec["num_accepted_draft_tokens"])
        raw_steps = spec["num_spec_steps"]
        drafts = float(raw_steps) if raw_steps is not None or own else 0.0
        raw_draft_tokens = spec["num_draft_tokens"]
        draft_tokens = float(raw_draft_tokens) if raw_draft_tokens is not None or own else 0.0
    except (KeyError, TypeError, ValueError):
        return None
    k_raw = spec.get("num_spec_tokens")
    k = int(k_raw) if isinstance(k_raw, int) else None
    # A server's figures are taken as exact, so impossible ones are not taken at all: not finite, negative, more
    # accepted than drafted, more drafted per step than k.
    if not all(math.isfinite(x) and x >= 0 for x in (accepted, drafts, draft_tokens)):
        return None
    if raw_draft_tokens is not None and accepted > draft_tokens:
        return None
    if k is not None and raw_steps is not None and (k < 0 or draft_tokens > k * drafts or accepted > k * drafts):
        return None
    per_pos: tuple[float, ...] = ()
    steps = spec.get("per_step_accepted")
    hist = spec.get("acceptance_histogram")
    if isinstance(steps, list) and k:
        per_pos = per_position_from_steps((int(a) for a in steps), k)
    elif isinstance(hist, list) and len(hist) > 1:
        # histogram[i] = steps that accepted exactly i drafts; position i was accepted by steps with more than i
        per_pos = tuple(float(sum(hist[i + 1 :])) for i in range(len(hist) - 1))
    return SpecEstimate(
        SpecCounts(accepted, drafts, draft_tokens, per_pos),
        float(k) if k else None,
        exact=not spec.get("derived"),
        draft_tokens_known=raw_draft_tokens is not None,
        shape=shape if isinstance(shape, str) else VLLM_METRICS,
    )


def from_llama_timings(timings: Mapping[str, Any]) -> SpecEstimate | None:
    """llama.cpp's ``timings.draft_n`` / ``draft_n_accepted`` (no step count: drafts unknown)."""
    n, acc = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not isinstance(n, int | float) or not isinstance(acc, int | float) or n <= 0:
        return None
    return SpecEstimate(SpecCounts(float(acc), 0.0, float(n)), shape=LLAMACPP_TIMINGS)


def from_chunks(tokens_per_chunk: Sequence[int], k: float | None) -> SpecEstimate | None:
    """Chunks are steps: ``tokens_per_chunk`` lists token-bearing chunks in order, the first being prefill."""
    if not tokens_per_chunk:
        return None
    decode = [n for n in tokens_per_chunk[1:] if n > 0]
    accepted_per_step = [n - 1 for n in decode]
    kk = round(k) if k else (max(accepted_per_step) if accepted_per_step else 0)
    counts = SpecCounts(
        accepted=float(sum(accepted_per_step)),
        drafts=float(len(decode)),
        draft_tokens=float(k * len(decode)) if k else 0.0,
        per_position=per_position_from_steps(accepted_per_step, kk) if kk else (),
    )
    return SpecEstimate(counts, k=k, draft_tokens_known=bool(k))


def tokens_per_step_histogram(tokens_per_chunk: Sequence[int]) -> dict[str, int]:
    """How many decode steps brought n tokens, keyed by n as a string (the record's JSON form)."""
    steps = Counter(n for n in tokens_per_chunk[1:] if n > 0)  # in the order each n first came
    return {str(n): c for n, c in steps.items()}
