"""``specproxy report``: per group (workload and label by default), counts, latency and throughput figures, and
pooled acceptance, as tables, CSV and the JSON of ``docs/report-json.md``.

- ``model``: what a report is (:class:`Report`, :class:`GroupReport`, :class:`Figure`: medians over repeats with the
  min-max spread), the shape every rendering reads.
- ``accum``: the report's figures, computed once: per-group accumulators fed in one streaming pass, in bounded memory
  (:class:`ReportBuilder`, :func:`stream_report`; :func:`build_report` for records already in memory).
- ``render``: the report as tables and as JSON (:data:`render.JSON_VERSION` versions every JSON document).
- ``spans``: where drafts land (acceptance per span type and output position) and mean acceptance length pooled
  beside its per-request mean, as tables and JSON.
- ``benchmark``: time and memory of the report on N synthetic records (``python -m``, ``docs/analysis-at-scale.md``).
"""
