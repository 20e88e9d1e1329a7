"""Analysis of recorded runs: the figures behind ``report``, ``compare``, ``advise``, ``sweep``, ``roofline`` and
``export``, and their renderings.

A package per command, each holding its model (records in, figures out) and its rendering (tables, CSV, the JSON of
``docs/report-json.md``), over the figures they share and the record input:

- ``inputs``: runs read as a stream (rotations, ``.gz``, ``.zst``), records decoded lean, chunk timelines in numpy
  batches; synthetic runs for benchmarks.
- ``figures``: what every command counts with: record predicates, grouping, pooled acceptance, quantile sketches,
  samples, bootstrap intervals, SLOs and goodput, request pairing, requests in flight, the buffering verdict.
- ``report``: per group figures in one streaming pass, and their tables and JSON.
- ``compare``: configuration vs baseline per workload, paired speedups.
- ``advise``: which k pays off, predicted and measured.
- ``sweep``: figures per load level, the crossover, the k per batch size.
- ``html``: the self-contained HTML pages of ``report`` and ``sweep``, their charts in SVG.
- ``roofline``: the memory-bandwidth ceiling of decoding.
- ``export``: records as a flat table (Parquet, CSV), written as a stream.
- ``tables``: plain tables and their text, markdown and CSV renderings, shared by every command.

Each package's ``__init__`` maps its modules. Everything but ``inputs`` and ``export`` is pure; commands
(``specproxy.commands``) import this package, never the reverse.
"""

from specproxy.analysis.advise.gather import build_advice
from specproxy.analysis.advise.model import Advice
from specproxy.analysis.compare.model import Comparison, build_comparison
from specproxy.analysis.figures.acceptance import (
    Acceptance,
    conditional_rates,
    expected_tokens_per_step,
    pool_acceptance,
)
from specproxy.analysis.report.accum import build_report
from specproxy.analysis.report.model import Report
from specproxy.analysis.roofline.model import Roofline, roofline

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
