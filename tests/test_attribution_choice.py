"""specproxy.attribution.choice: which estimate a record reports, and its flags."""

from __future__ import annotations

from typing import Any

from specproxy.attribution.choice import Evidence, choose, decide
from specproxy.attribution.counts import SpecCounts
from specproxy.attribution.estimates import SpecEstimate
from specproxy.attribution.ledger import CounterAttribution

SERVER = {"num_accepted_draft_tokens": 4, "num_spec_steps": 3, "num_draft_tokens": 9, "num_spec_tokens": 3}


def _counters(accepted: float, drafts: float, *, exact: bool = True, overlapped: bool = False,
              reset: bool = False, unsettled: bool = False, unmerged: bool = False) -> CounterAttribution:  # fmt: skip
    est = SpecEstimate(SpecCounts(accepted, drafts, drafts * 3), k=3.0, exact=exact)
    return CounterAttribution(est, intervals=1, overlapped=overlapped, reset=reset, unsettled=unsettled,
                              unmerged=unmerged)  # fmt: skip


def _ev(**kw: Any) -> Evidence:
    base: dict[str, Any] = {"stream": True, "tokens": [1, 3, 1, 4], "exact_counts": True, "several_choices": False,
                            "k": 3.0}  # fmt: skip
    return Evidence(**{**base, **kw})


def test_exact_chunks_win_over_counters() -> None:
    c = decide(_ev(counters=_counters(5, 3)))
    assert c.source == "chunks" and c.chunks_are_steps and c.flags == ()
    assert c.chosen is c.chunks and c.chosen is not None and c.chosen.counts.accepted == 5


def test_the_server_figure_wins_when_it_reports_drafts() -> None:
    c = decide(_ev(server_spec=SERVER, counters=_counters(5, 3)))
    assert c.source == "server" and c.chosen is not None and c.chosen.counts.accepted == 4


def test_an_impossible_server_figure_is_flagged_and_not_used() -> None:
    c = decide(_ev(server_spec={**SERVER, "num_accepted_draft_tokens": 10**6}, counters=_counters(5, 3)))
    assert c.server is None and c.source == "chunks" and "server_spec_unusable" in c.flags
    assert "server_spec_unusable" not in decide(_ev(server_spec=SERVER)).flags


def test_text_counts_are_not_steps_so_counters_win() -> None:
    c = decide(_ev(exact_counts=False, counters=_counters(6, 3, exact=False, overlapped=True)))
    assert not c.chunks_are_steps and c.chunks is not None and not c.chunks.exact
    assert c.source == "counters"
    assert decide(_ev(exact_counts=False)).source == "chunks"  # nothing better: inexact chunks


def test_more_tokens_in_a_chunk_than_a_step_can_bring() -> None:
    c = decide(_ev(tokens=[1, 6, 2]))
    assert "stream_interval_suspected" in c.flags and not c.chunks_are_steps


def test_several_choices_interleave_so_chunks_are_not_steps() -> None:
    assert not decide(_ev(several_choices=True)).chunks_are_steps


def test_counters_alone_show_more_steps_than_chunks() -> None:
    c = decide(_ev(tokens=[1] + [4] * 10, counters=_counters(30, 20)))  # 10 chunks, 20 drafts counted alone
    assert "chunks_fewer_than_steps" in c.flags and not c.chunks_are_steps and c.source == "counters"
    c = decide(_ev(tokens=[1] + [4] * 10, counters=_counters(30, 20, overlapped=True)))  # overlapped: no verdict
    assert "chunks_fewer_than_steps" not in c.flags


def test_partial_drafting_makes_chunk_drafts_approximate() -> None:
    c = decide(_ev(k=2.5))  # ngram proposes fewer than k tokens at times
    assert "partial_drafting" in c.flags and c.chunks is not None and not c.chunks.exact
    c = decide(_ev(tokens=[1] + [1] * 20, counters=_counters(0, 8)))  # drafted on 8 of 20 steps, alone
    assert "partial_drafting" in c.flags and c.source == "counters"
    assert "partial_drafting" in decide(_ev(engine_drafts_partially=True)).flags


def test_a_counters_figure_from_an_unsettled_model_is_flagged_only_where_it_is_the_figure() -> None:
    shared = _counters(5, 8, exact=False, overlapped=True, unsettled=True)
    c = decide(_ev(engine_drafts_partially=True, counters=shared))  # ngram: the counters' share is the figure
    assert c.source == "counters" and "counters_unsettled" in c.flags
    c = decide(_ev(engine_drafts_partially=True, server_spec=SERVER, counters=shared))  # the server's own figure
    assert c.source == "server" and "counters_unsettled" not in c.flags
    settled = _counters(5, 8, exact=False, overlapped=True)
    assert "counters_unsettled" not in decide(_ev(engine_drafts_partially=True, counters=settled)).flags


def test_zero_acceptance_and_counter_flags() -> None:
    c = decide(_ev(tokens=[1, 1, 1, 1]))
    assert c.flags == ("spec_zero_acceptance",)
    assert "counter_reset" in decide(_ev(counters=_counters(5, 3, exact=False, reset=True))).flags
    assert decide(_ev(metrics_failing=True)).flags == ("metrics_unavailable",)
    assert decide(_ev(metrics_failing=True, stream=False)).flags == ()


def test_spec_block_keeps_every_estimate_and_the_configured_k() -> None:
    block = decide(_ev(k=None, counters=_counters(5, 3, exact=False, overlapped=True))).spec_block()
    assert block is not None
    assert block["source"] == "counters"  # chunks without k know no draft tokens
    assert block["estimates"]["chunks"]["draft_tokens"] is None and block["estimates"]["server"] is None
    assert block["tokens_per_step"] == {"3": 1, "1": 1, "4": 1}
    nothing = decide(_ev(stream=False, tokens=[]))
    assert nothing.spec_block() is None and nothing.source is None


def test_choose_order() -> None:
    est = SpecEstimate(SpecCounts(1, 1, 3))
    no_drafts = SpecEstimate(SpecCounts(1, 0, 3))
    assert choose(est, est, est)[0] == "server"
    assert choose(no_drafts, None, est)[0] == "counters"
    assert choose(no_drafts, None, None)[0] == "server"  # llama.cpp: no step count, but a figure
    assert choose(None, SpecEstimate(SpecCounts(1, 1, 0), draft_tokens_known=False), None) == (None, None)


def test_counters_that_saw_no_draft_beat_inexact_chunks() -> None:
    # dynamic speculation at k = 0 (or an ngram without a match) while the request ran: its steps bring one token
    # each; the chunks, inexact (the engine drafts on some steps only), would guess k drafts per step, all rejected
    c = decide(
        _ev(tokens=[1] * 6, engine_drafts_partially=True, counters=_counters(0, 0, exact=False, overlapped=True))
    )
    assert c.source == "counters" and c.chosen is not None and c.chosen.counts.drafts == 0
    assert "spec_zero_acceptance" not in c.flags
    # an engine that does not speculate (no k): its zero counters say nothing of speculation either
    plain = decide(_ev(k=None, exact_counts=False, counters=_counters(0, 0, exact=False, overlapped=True)))
    assert plain.source is None and plain.spec_block() is not None and plain.spec_block()["source"] is None  # type: ignore[index]
    # exact chunks (every step drafts) still speak for themselves beside a share that overlapped others
    assert decide(_ev(counters=_counters(0, 0, exact=False, overlapped=True))).source == "chunks"


def test_a_counters_share_that_put_merged_steps_back_is_chosen_where_every_step_drafts() -> None:
    """Chunks of 5 tokens with k = 3: merged steps. The ledger's share was split by chunks taken for steps unless it
    found the merged steps and put them back (the engine's step count); then it is the figure, flagged."""
    merged = [1, 5, 5, 2]
    split_by_chunks = decide(_ev(tokens=merged, counters=_counters(8, 5, exact=False, overlapped=True)))
    assert split_by_chunks.chosen is None and "counters_split_by_merged_chunks" in split_by_chunks.flags
    unmerged = decide(_ev(tokens=merged, counters=_counters(6, 5, exact=False, overlapped=True, unmerged=True)))
    assert unmerged.source == "counters" and unmerged.chosen is not None and unmerged.chosen.counts.accepted == 6
    assert "steps_unmerged" in unmerged.flags and "counters_split_by_merged_chunks" not in unmerged.flags
    assert unmerged.chunks is not None and not unmerged.chunks.exact  # the chunks' own figure is not the steps'


def test_where_only_some_steps_draft_a_share_with_merged_steps_is_flagged_as_several_points_off() -> None:
    """ngram (k not whole: proposals shorter than k): the drafts hidden in one-token steps rest on chunk sizes,
    which merged steps distort, even where no chunk is longer than one step can bring."""
    c = decide(_ev(tokens=[1, 2, 3, 1], k=2.6, counters=_counters(4, 3, exact=False, overlapped=True, unmerged=True)))
    assert c.source == "counters" and c.chosen is not None
    assert {"steps_unmerged", "counters_unsettled", "partial_drafting"} <= set(c.flags)
    assert "counters_split_by_merged_chunks" not in c.flags
    every_step = decide(_ev(tokens=[1, 2, 3, 1], counters=_counters(4, 3, exact=False, overlapped=True, unmerged=True)))
    assert every_step.source == "counters" and "counters_unsettled" not in every_step.flags
    alone = decide(_ev(tokens=[1, 2, 3, 1], k=2.6, counters=_counters(4, 3, unmerged=True)))
    assert alone.source == "counters" and "counters_unsettled" not in alone.flags  # alone: the engine's own count
