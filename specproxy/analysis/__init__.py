"""Analysis of recorded runs: the figures behind ``report``, ``compare``, ``advise`` and ``roofline``.

Pure modules (records in, results out): :mod:`.acceptance` (pooled speculative figures), :mod:`.aggregate` (report
groups and figures), :mod:`.compare`, :mod:`.advise`, :mod:`.roofline`. Renderings, also pure: :mod:`.tables`
(text, markdown, CSV), :mod:`.render`, :mod:`.render_compare` and :mod:`.render_advise` (tables and the JSON of
``docs/report-json.md``), :mod:`.svg` and :mod:`.html`. The only IO is :mod:`.inputs`, which reads record files.
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
