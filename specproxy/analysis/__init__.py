"""Analysis of recorded runs: the figures behind ``report``, ``compare``, ``advise``, ``roofline`` and ``export``.

Pure modules (records in, results out): :mod:`.acceptance` (pooled speculative figures), :mod:`.aggregate` (report
groups and figures from lists of records: the exact reference), :mod:`.accum` (the same figures accumulated in one
streaming pass, what the commands use), :mod:`.sketch` (quantiles: exact, or a DDSketch within 0.5%),
:mod:`.sample` (bounded samples), :mod:`.scan` (records decoded lean, chunk timelines in numpy batches),
:mod:`.compare`, :mod:`.advise` and :mod:`.advise_input`, :mod:`.roofline`. Renderings, also pure: :mod:`.tables`
(text, markdown, CSV), :mod:`.render`, :mod:`.render_compare` and :mod:`.render_advise` (tables and the JSON of
``docs/report-json.md``), :mod:`.svg`, :mod:`.html` and :mod:`.html_input`. The IO: :mod:`.inputs` and
:mod:`.sources` read record files (rotations, ``.gz``, ``.zst``) as a stream, :mod:`.export` writes tables;
:mod:`.synth` and :mod:`.benchmark` write synthetic runs and measure (``docs/analysis-at-scale.md``).
"""

from specproxy.analysis.acceptance import Acceptance, conditional_rates, expected_tokens_per_step, pool_acceptance
from specproxy.analysis.advise import Advice, build_advice
from specproxy.analysis.aggregate import Report, build_report
from specproxy.analysis.compare import Comparison, build_comparison
from specproxy.analysis.roofline import Roofline, roofline

__all__ = [
    "Acceptance",
    "Advice",
    "Comparison",
    "Report",
    "Roofline",
    "build_advice",
    "build_comparison",
    "build_report",
    "conditional_rates",
    "expected_tokens_per_step",
    "pool_acceptance",
    "roofline",
]
