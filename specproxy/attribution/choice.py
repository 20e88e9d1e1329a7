"""Which estimate a record reports, and the flags that say how far to trust it.

Every request can have up to three estimates (:mod:`specproxy.attribution.estimates`, and the counters' share from
:mod:`specproxy.attribution.ledger`). They are all kept in the record; one is *chosen* as its figure:

1. the server's own per-request figure, when it reports drafts;
2. the chunks, when they are exact (chunks are steps, counts exact, every step drafts);
3. the counters' share, also when it is zero and the chunks are inexact: no draft while the request ran is evidence;
4. inexact chunks, then whatever the server said.

Chunks that merge several engine steps (a server-side ``stream_interval`` above 1: vLLM's flag, TensorRT-LLM's
option, Dynamo's frontend) are never chosen: a chunk of n merged steps would read as n - 1 accepted drafts.

The checks that decide "chunks are steps" and "every step drafts" compare the sources with each other, so they live
here too. Pure: evidence in, a choice out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specproxy.attribution.estimates import (
    SpecEstimate,
    from_chunks,
    from_llama_timings,
    from_server,
    tokens_per_step_histogram,
)
from specproxy.attribution.ledger import PARTIAL_DRAFTING_BELOW, CounterAttribution
from specproxy.core.record import Estimates, SpecBlock

UNSETTLED_FLAG = "counters_unsettled"  # the counters' share rested on a per-workload model not yet pinned down


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one request showed, and what the recorder knows of the engine, as the choice needs it."""

    stream: bool
    tokens: Sequence[int]  # tokens of each token-bearing chunk, in order (the first is the prefill step)
    exact_counts: bool  # the counts came from the server (usage or token ids), not from text
    several_choices: bool  # n > 1: chunks of several sequences interleave
    k: float | None  # num_speculative_tokens, configured or learned from the counters
    server_spec: Mapping[str, Any] | None = None  # the engine's per-request figure in vLLM's keys, with its shape
    llama_timings: Mapping[str, Any] | None = None
    counters: CounterAttribution | None = None
    metrics_failing: bool = False  # the engine's /metrics is configured but its scrapes fail
    engine_drafts_partially: bool = False  # the ledger saw fewer drafts than decode steps over all traffic
    per_token_events: bool = False  # the engine streams one event per token (llama.cpp, Ollama): chunks aren't steps


@dataclass(frozen=True, slots=True)
class Choice:
    source: str | None  # "server", "chunks", "counters", or None when nothing speaks of speculation
    chosen: SpecEstimate | None
    server: SpecEstimate | None
    chunks: SpecEstimate | None
    counters: SpecEstimate | None
    chunks_are_steps: bool
    flags: tuple[str, ...]
    tokens_per_step: dict[str, int]
    k: float | None
    merged_steps: bool = False  # chunks carry several engine steps each: never the chosen source

    def spec_block(self) -> SpecBlock | None:
        """The record's ``spec`` object (docs/records.md)."""
        if self.chosen is None and self.server is None and self.chunks is None and self.counters is None:
            return None
        base = self.chosen.as_dict() if self.chosen is not None else None
        return SpecBlock(
            source=self.source,
            accepted=base["accepted"] if base else None,
            drafts=base["drafts"] if base else None,
            draft_tokens=base["draft_tokens"] if base else None,
            k=base["k"] if base and base["k"] is not None else self.k,
            acceptance_rate=base["acceptance_rate"] if base else None,
            mean_acceptance_length=base["mean_acceptance_length"] if base else None,
            per_position=base["per_position"] if base else [],
            tokens_per_step=self.tokens_per_step,
            server_source=self.server.shape if self.server else None,
            estimates=Estimates(
                server=self.server.as_dict() if self.server else None,
                chunks=self.chunks.as_dict() if self.chunks else None,
                counters=self.counters.as_dict() if self.counters else None,
            ),
        )


def decide(ev: Evidence) -> Choice:
    flags: list[str] = []
    tokens = ev.tokens
    k = ev.k
    chunks_are_steps = ev.stream and bool(tokens) and ev.exact_counts and not ev.several_choices
    if ev.per_token_events and ev.stream and tokens:
        flags.append("chunks_not_steps_engine")  # no chunk estimate at all: it would read as zero acceptance
        chunks_are_steps = False
    server = from_server(ev.server_spec) if ev.server_spec else None
    if ev.server_spec and server is None:
        flags.append("server_spec_unusable")  # fields missing, or numbers no engine can produce: not used
    if server is None and ev.llama_timings:
        server = from_llama_timings(ev.llama_timings)
    merged = False
    unknown = k is None and server is None and ev.counters is None
    if chunks_are_steps and stream_interval_suspected(
        tokens, k, no_drafting=_no_drafting(server, ev.counters, k), speculation_unknown=unknown
    ):
        flags.append("stream_interval_suspected")
        chunks_are_steps, merged = False, True
    chunks = from_chunks(tokens, k) if ev.stream and tokens and not ev.per_token_events else None
    counters: SpecEstimate | None = None
    alone_drafts: float | None = None  # the counters' drafts, when the request had the engine to itself
    if ev.counters is not None:
        counters = ev.counters.estimate
        if ev.counters.reset:
            flags.append("counter_reset")
        if not ev.counters.overlapped and counters.exact:
            alone_drafts = counters.counts.drafts
    elif ev.metrics_failing and ev.stream:
        flags.append("metrics_unavailable")
    chunk_drafts = chunks.counts.drafts if chunks is not None else None
    # alone on the engine the counters are exact, and the server's steps are this request's: chunks merged steps
    # if they show fewer steps than drafts (steps that drafted nothing are not counted, so never more)
    steps_seen = [d for d in (alone_drafts, server.counts.drafts if server is not None else None) if d]
    if chunks_are_steps and chunk_drafts is not None and any(d > 1.05 * chunk_drafts + 1 for d in steps_seen):
        flags.append("chunks_fewer_than_steps")
        chunks_are_steps = False
        merged = True
    partial_drafting = (
        (k is not None and abs(k - round(k)) > 0.05)  # ngram proposes fewer than k tokens at times
        or ev.engine_drafts_partially  # and drafts on some steps only
        or (  # alone, the counters drafted on fewer steps than the chunks show
            alone_drafts is not None
            and chunk_drafts is not None
            and alone_drafts < PARTIAL_DRAFTING_BELOW * chunk_drafts - 1
        )
    )
    if chunks is not None and partial_drafting:
        chunks = chunks.approximate()
        flags.append("partial_drafting")
    # Where the ledger found steps merged into this request's chunks and put them back (intervals.unmerge), its
    # chunks are not steps, and its accepted tokens and steps are right, and so are its drafts where every step
    # drafts. Where only some do (ngram), the drafts hidden in one-token steps still rest on chunk sizes, which
    # merged steps distort: that share is flagged as one whose workload's figure may be several points off.
    unmerged = ev.counters is not None and ev.counters.unmerged
    if unmerged:
        flags.append("steps_unmerged")
        chunks_are_steps, merged = False, True
    if chunks is not None and not chunks_are_steps:
        chunks = chunks.approximate()
    if merged and counters is not None and not counters.exact and not unmerged:
        # the ledger split the deltas by chunks, each taken for one step: its share is as wrong as theirs
        flags.append("counters_split_by_merged_chunks")
        source, chosen = choose(server, None, None)
    else:
        source, chosen = choose(server, None if merged else chunks, counters)
    modelled_drafts = unmerged and partial_drafting and counters is not None and not counters.exact
    if source == "counters" and ev.counters is not None and (ev.counters.unsettled or modelled_drafts):
        flags.append(UNSETTLED_FLAG)
    if chosen is not None and chosen.draft_tokens and chosen.counts.accepted == 0:
        flags.append("spec_zero_acceptance")
    return Choice(
        source=source,
        chosen=chosen,
        server=server,
        chunks=chunks,
        counters=counters,
        chunks_are_steps=chunks_are_steps,
        flags=tuple(flags),
        tokens_per_step=tokens_per_step_histogram(tokens),
        k=k,
        merged_steps=merged,
    )


def _no_drafting(server: SpecEstimate | None, counters: CounterAttribution | None, k: float | None) -> bool:
    """The engine's own figures say nothing was drafted while the request ran: its per-request figure says no
    draft token, or the counters moved by none while it had the engine to itself, or moved by none with no k known
    (configured or learned: the engine was never seen to draft). An overlapped share of a speculating engine is
    modelled and may be zero while others drafted."""
    if server is not None and server.draft_tokens_known:
        return not server.counts.draft_tokens and not server.counts.accepted
    if counters is not None and not counters.reset and (k is None or not counters.overlapped):
        c = counters.estimate.counts
        return not c.drafts and not c.draft_tokens
    return False


def stream_interval_suspected(
    tokens: Sequence[int], k: float | None, *, no_drafting: bool, speculation_unknown: bool
) -> bool:
    """Chunks that carry several engine steps each. ``tokens`` lists token-bearing chunks, the first the prefill
    step's; the last may be short (a stream interval sends the last output at once).

    - more tokens in one chunk than one step can bring (k + 1, k known);
    - nothing drafted, yet most decode chunks bring more than one token: without speculation a step brings one
      (a lagging HTTP task merges a few; most chunks would not be merged);
    - nothing known of speculation (no k, no figure from the engine), and every decode chunk but the last brings
      the same number of tokens, above one: speculation's accepted counts vary from step to step, a fixed
      interval's do not. Three such chunks at least."""
    if not tokens:
        return False
    if k is not None and max(tokens) > round(k) + 1:
        return True
    decode = [n for n in tokens[1:] if n > 0]
    if no_drafting:
        return sum(n > 1 for n in decode) * 2 > len(decode)
    body = decode[:-1]
    return speculation_unknown and len(body) >= 3 and body[0] > 1 and all(n == body[0] for n in body)


def choose(
    server: SpecEstimate | None, chunks: SpecEstimate | None, counters: SpecEstimate | None
) -> tuple[str | None, SpecEstimate | None]:
    """The order of trust among the three estimates (see the module's docstring)."""
    if server is not None and server.counts.drafts:
        return "server", server
    if chunks is not None and chunks.draft_tokens_known and chunks.exact:
        return "chunks", chunks
    if counters is not None and counters.counts.drafts:
        return "counters", counters
    if counters is not None and chunks is not None and chunks.draft_tokens_known and not chunks.exact:
        # a speculating engine (k known) drafted nothing while this request ran (dynamic speculation at k = 0, an
        # ngram with no match): inexact chunks would guess k drafts per step, all rejected. Without k (an engine
        # that does not speculate) nothing speaks of speculation
        return "counters", counters
    if chunks is not None and chunks.draft_tokens_known:
        return "chunks", chunks
    if server is not None:
        return "server", server
    return None, None
