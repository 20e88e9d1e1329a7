"""Each figure defined once (``specproxy/core/figures.py``): its functions at their edges, the recorder's figures
equal to those the analysis computes again for records that lack them, and the docs saying the module's meanings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specproxy.analysis.figures.records import RunSpan, request_rates
from specproxy.analysis.report.accum import build_report
from specproxy.attribution.counts import SpecCounts
from specproxy.core import figures
from specproxy.core.figures import (
    FIGURES,
    acceptance_rate,
    decode_tok_s,
    itl_s,
    mean_acceptance_length,
    output_tok_s,
    step_and_token_gaps,
    step_s,
    token_span,
    tpot_of_rate,
    tpot_s,
    ttft_s,
)
from specproxy.core.record import Record, as_record
from specproxy.core.sse import SSEDecoder
from specproxy.core.stats import percentile
from specproxy.core.timeline import ResponseTimeline
from tests.analysisutil import T0, make_record

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"


# -- the functions at their edges ----------------------------------------------------------------------------------
def test_no_tokens_give_no_figures() -> None:
    assert ttft_s(5, None) is None
    assert decode_tok_s([]) is None
    assert decode_tok_s([(0.1, 0), (0.2, 0)]) is None  # chunks without tokens (a role announcement, keep-alives)
    assert token_span([]) == 0.0
    assert step_s([]) == [] and itl_s([]) == []
    assert tpot_s(None, None) is None
    assert tpot_s(0.5, 0) is None
    assert tpot_of_rate(None) is None and tpot_of_rate(0.0) is None


def test_one_token_has_a_ttft_and_no_decode_figure() -> None:
    assert ttft_s(1_000_000_000, 1_250_000_000) == 0.25
    assert ttft_s(7, 7) == 0.0
    one = [(0.25, 1)]
    assert token_span(one) == 0.0
    assert decode_tok_s(one) is None
    assert step_s(one) == [] and itl_s(one) == []
    assert tpot_s(0.0, 1) is None
    assert tpot_s(0.5, 1) is None  # one token: nothing decoded after the prefill's


def test_one_chunk_of_many_tokens_has_no_span() -> None:
    assert decode_tok_s([(0.25, 5)]) is None
    assert tpot_s(0.0, 5) is None  # every token in one read


def test_decode_rate_tpot_and_gaps_of_a_speculative_stream() -> None:
    # prefill token at 0.25 s, then steps of 3, 1 and 2 tokens 0.25 s apart; a token-less chunk between them
    chunks = [(0.25, 1), (0.5, 3), (0.6, 0), (0.75, 1), (1.0, 2)]
    assert token_span(chunks) == 0.75
    assert decode_tok_s(chunks) == (7 - 1) / 0.75
    assert tpot_s(0.75, 7) == 0.75 / 6
    assert tpot_of_rate(decode_tok_s(chunks)) == pytest.approx(0.75 / 6)
    assert step_s(chunks) == [0.25, 0.25, 0.25]
    assert itl_s(chunks) == [0.25 / 3] * 3 + [0.25] + [0.125] * 2
    assert step_and_token_gaps(chunks) == (step_s(chunks), itl_s(chunks))
    # a chunk that arrived before the one it follows (clock noise) gives a gap of zero, never a negative one
    assert step_s([(0.5, 1), (0.4, 2)]) == [0.0]


def test_output_rate_needs_a_span() -> None:
    assert output_tok_s(100.0, 4.0) == 25.0
    assert output_tok_s(100.0, 0.0) is None
    assert output_tok_s(0.0, 2.0) == 0.0
    assert RunSpan().output_tok_s() is None  # no request


def test_acceptance_without_drafts_is_undefined() -> None:
    assert acceptance_rate(0.0, 0.0) is None
    assert mean_acceptance_length(0.0, 0.0) is None
    assert acceptance_rate(3.0, -1.0) is None and mean_acceptance_length(3.0, -1.0) is None
    assert acceptance_rate(0.0, 6.0) == 0.0  # drafted, nothing accepted
    assert mean_acceptance_length(0.0, 2.0) == 1.0
    assert acceptance_rate(4.5, 9.0) == 0.5  # counter attribution shares deltas: counts are floats
    assert mean_acceptance_length(6.0, 4.0) == 2.5
    counts = SpecCounts(accepted=6.0, drafts=4.0, draft_tokens=12.0)
    assert (counts.acceptance_rate, counts.mean_acceptance_length) == (0.5, 2.5)
    assert (SpecCounts().acceptance_rate, SpecCounts().mean_acceptance_length) == (None, None)


def test_every_figure_names_its_function() -> None:
    names = [f.name for f in FIGURES]
    assert len(set(names)) == len(names)
    for f in FIGURES:
        assert f.compute is getattr(figures, f.name), f.name
        assert f.unit and f.title and f.meaning


# -- the recorder's figures and the analysis' own, for the same response --------------------------------------------
def _recorded() -> Record:
    """A real vLLM stream (exact per-chunk counts) read by the recorder's timeline, one event a millisecond, written
    as the recorder writes a record (offsets to the microsecond)."""
    start_ns = 1_000_000_000
    tl = ResponseTimeline(start_ns, stream=True)
    events = list(SSEDecoder().feed((DATA / "chat-stream-ngram-k3-per-request-metrics.sse").read_bytes()))
    for i, ev in enumerate(events):
        tl.feed(start_ns + (i + 1) * 1_000_000, f"data: {ev.data}\n\n".encode())
    res = tl.result(start_ns + (len(events) + 1) * 1_000_000)
    assert res.token_source == "usage" and res.completion_tokens == sum(n for _, n in res.chunks)
    base = make_record("r", accepted=[1, 0, 2], k=3, started_at=T0)
    return as_record(
        {
            **base,
            "chunks": [[round(t, 6), n] for t, n in res.chunks],
            "completion_tokens": res.completion_tokens,
            "ttft_s": res.ttft_s,
            "decode_tok_s": res.decode_tok_s,
            "tpot_s": res.tpot_s,
            "e2e_s": (len(events) + 1) / 1000,
        }
    )


def test_the_recorder_and_the_old_records_path_give_the_same_figures() -> None:
    rec = _recorded()
    assert rec["decode_tok_s"] is not None and rec["tpot_s"] is not None
    old = as_record({**rec, "decode_tok_s": None, "tpot_s": None})  # a record written before these fields
    tok_s, tpot = request_rates(old, lambda: old["chunks"])
    assert tok_s == rec["decode_tok_s"]
    assert tpot == pytest.approx(rec["tpot_s"], rel=1e-12)
    assert request_rates(rec, lambda: pytest.fail("a record with its figures reads no chunks")) == (
        rec["decode_tok_s"],
        rec["tpot_s"],
    )


def test_the_report_gives_the_same_figures_for_either_record() -> None:
    rec = _recorded()
    old = as_record({**rec, "decode_tok_s": None, "tpot_s": None})
    new_f, old_f = build_report([rec]).groups[0].figures, build_report([old]).groups[0].figures
    assert set(new_f) == set(old_f)
    for name, fig in new_f.items():
        if fig.value is None:
            assert old_f[name].value is None, name
        else:
            assert old_f[name].value == pytest.approx(fig.value, rel=1e-12), name
    # the report's vectorised gaps are the figures' own
    step, itl = step_s(rec["chunks"]), itl_s(rec["chunks"])
    assert new_f["step_s_p50"].value == pytest.approx(percentile(step, 50), rel=1e-12)
    assert new_f["itl_s_p50"].value == pytest.approx(percentile(itl, 50), rel=1e-12)
    assert new_f["itl_s_p99"].value == pytest.approx(percentile(itl, 99), rel=1e-12)
    assert new_f["ttft_s_p50"].value == rec["ttft_s"]
    spec = rec["spec"]
    assert spec is not None
    assert new_f["acceptance_rate"].value == acceptance_rate(spec["accepted"] or 0, spec["draft_tokens"] or 0)
    assert new_f["mean_acceptance_length"].value == mean_acceptance_length(spec["accepted"] or 0, spec["drafts"] or 0)
    span = (rec["started_at"] + (rec["e2e_s"] or 0)) - rec["started_at"]  # the run's wall clock, one request
    assert new_f["output_tok_s"].value == output_tok_s(rec["completion_tokens"] or 0, span)


# -- the docs say the module's meanings ------------------------------------------------------------------------------
def _plain(text: str) -> str:
    """Docs name a count in words or by its field: ``draft_tokens`` reads as "draft tokens"."""
    return re.sub(r"\s+", " ", text.replace("`", "").replace("_", " ")).lower()


def _rows(path: Path, start: str, end: str) -> dict[str, str]:
    """The rows of the tables between two headings of a doc: each field the first cell names, to its whole row."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(start) : text.index(end, text.index(start))]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
                rows[name] = line
    return rows


def _check(rows: dict[str, str], name: str) -> None:
    fig = next(f for f in FIGURES if f.name == name)
    named = [row for field, row in rows.items() if field == name or re.fullmatch(rf"{name}_p[0-9.]+", field)]
    assert named, f"no row names {name}"
    for row in named:
        assert _plain(fig.meaning) in _plain(row), f"{name}: the docs should say {fig.meaning!r}, row: {row}"


@pytest.mark.parametrize("name", ["ttft_s", "decode_tok_s", "tpot_s", "acceptance_rate", "mean_acceptance_length"])
def test_records_doc_says_each_figures_meaning(name: str) -> None:
    _check(_rows(ROOT / "docs" / "records.md", "| field | type | meaning |", "\nFlags:"), name)


@pytest.mark.parametrize("name", [f.name for f in FIGURES])
def test_report_json_doc_says_each_figures_meaning(name: str) -> None:
    _check(_rows(ROOT / "docs" / "report-json.md", "### `figures`", "\n### "), name)
