"""Where a request's drafts landed: its decode steps, tokens and accepted drafts per span type (what the text was,
:mod:`specproxy.core.spans`) and per output position (the token index where each step began).

Two bases, said in the block:

- ``steps``: the chunks are engine steps, so each step that brought n tokens accepted n - 1 drafts right there in
  the text: measured.
- ``shared``: they are not (a buffering hop, a stream interval, counts from a tokenizer), so the request's chosen
  figure (server, else counters) is spread over its spans in proportion to their tokens, the rule the counters'
  attribution uses between requests: every span of the request gets its mean, nothing is measured per span.

Draft tokens follow drafting steps: a step that brought more than one token drafted; the request's other drafting
steps are spread over its one-token steps. A span's draft tokens are then k per step where every step drafts, and
add up to the request's own where only some do (ngram, dynamic k). Pure: chunks, span codes and the record's
``spec`` in, the record's ``spans`` block out.
"""

from __future__ import annotations

from collections.abc import Sequence

from specproxy.core.record import SpanBlock, SpanCell, SpecBlock
from specproxy.core.spans import SPAN_TYPES

# Buckets of output position: a step counts in the bucket of the index of its first token (the prefill token is 0)
POSITION_EDGES: tuple[int, ...] = (0, 32, 128, 512, 2048)


def position_bucket(index: int) -> int:
    """The lower edge of the bucket holding output token ``index``."""
    edge = 0
    for e in POSITION_EDGES:
        if index < e:
            break
        edge = e
    return edge


def span_block(
    chunks: Sequence[tuple[float, int]], codes: bytes, *, chunks_are_steps: bool, spec: SpecBlock | None
) -> SpanBlock | None:
    """The record's ``spans`` (docs/records.md); None with no decode step, or neither steps nor a figure to share."""
    # per span type and per position bucket: steps, tokens, steps that brought more than one token (they drafted,
    # surely); one pass, the position bucket moving up as the tokens do
    edges = POSITION_EDGES
    type_steps, type_tokens, type_multi = [0] * len(SPAN_TYPES), [0] * len(SPAN_TYPES), [0] * len(SPAN_TYPES)
    pos_steps, pos_tokens, pos_multi = [0] * len(edges), [0] * len(edges), [0] * len(edges)
    seen: list[int] = []  # span types in the order their first step came
    n_codes = len(codes)
    index = -1  # output index of the step's first token; -1 until the prefill step
    bucket = 0
    for i, (_, n) in enumerate(chunks):
        if n <= 0:
            continue
        if index < 0:  # the prefill step: a token, no draft
            index = n
            continue
        while bucket + 1 < len(edges) and index >= edges[bucket + 1]:
            bucket += 1
        code = codes[i] if i < n_codes else 0
        if not type_steps[code]:
            seen.append(code)
        type_steps[code] += 1
        type_tokens[code] += n
        pos_steps[bucket] += 1
        pos_tokens[bucket] += n
        if n > 1:
            type_multi[code] += 1
            pos_multi[bucket] += 1
        index += n
    # per key: [steps, tokens, accepted, steps that brought more than one token]
    types: dict[str, list[float]] = {
        SPAN_TYPES[c]: [type_steps[c], type_tokens[c], type_tokens[c] - type_steps[c], type_multi[c]] for c in seen
    }
    positions: dict[str, list[float]] = {
        str(edges[b]): [pos_steps[b], pos_tokens[b], pos_tokens[b] - pos_steps[b], pos_multi[b]]
        for b in range(len(edges))
        if pos_steps[b]
    }
    if not types:
        return None
    tokens = sum(c[1] for c in types.values())
    drafts = spec["drafts"] if spec is not None else None
    draft_tokens = spec["draft_tokens"] if spec is not None else None
    per_step = draft_tokens / drafts if draft_tokens is not None and drafts else None
    if chunks_are_steps:
        basis = "steps"
        # Which steps drafted: every step that brought more than one token did; the request's other drafting steps
        # (an engine that drafts on some steps only: ngram, dynamic k) are spread over its one-token steps. So the
        # span's draft tokens add up to the request's, and equal k per step where every step drafts
        sure = sum(c[3] for c in types.values())
        single = sum(c[0] - c[3] for c in types.values())
        rest = max(0.0, (drafts or 0.0) - sure)
        single_share = min(1.0, rest / single) if single else 0.0

        def cell_of(c: list[float]) -> SpanCell:
            drafting = c[3] + (c[0] - c[3]) * single_share
            return _cell(c[0], c[1], c[2], per_step * drafting if per_step is not None else None)

    else:
        accepted = spec["accepted"] if spec is not None else None
        if accepted is None or not drafts:
            return None
        basis = "shared"

        def cell_of(c: list[float]) -> SpanCell:
            share = c[1] / tokens
            assert accepted is not None and drafts is not None
            return _cell(
                drafts * share, c[1], accepted * share, draft_tokens * share if draft_tokens is not None else None
            )

    return SpanBlock(
        basis=basis,
        types={k: cell_of(c) for k, c in types.items()},
        positions={k: cell_of(c) for k, c in positions.items()},  # ascending: built in bucket order
    )


def _cell(steps: float, tokens: float, accepted: float, draft_tokens: float | None) -> SpanCell:
    return SpanCell(
        steps=_num(steps),
        tokens=_num(tokens),
        accepted=_num(accepted),
        draft_tokens=None if draft_tokens is None else _num(draft_tokens),
    )


def _num(v: float) -> float:
    """Whole numbers as JSON integers, shares rounded to 4 decimals."""
    r = round(v)
    return int(r) if abs(v - r) < 1e-9 else round(v, 4)
