"""``specproxy compare``: per workload, configuration | tok/s | speedup vs baseline | acceptance, with paired
per-request speedups when the runs sent the same requests.

- ``model``: the rows, accumulated in one pass (:class:`ComparisonBuilder`), the baseline chosen, speedups paired and
  given intervals.
- ``render``: the comparison as tables, CSV and JSON.
"""
