"""The figures of ``specproxy sweep``: per configuration, load level and workload, throughput, goodput, acceptance
and speedup with intervals; where speculation stops paying; and the k that pays off at each batch size.

- ``model``: levels read from ``run_id``, the rows per level with their intervals, and the crossover.
- ``batchcost``: the cost of a draft token at each batch size and the k schedule it implies (also shown by
  ``advise``).
- ``render``: the sweep and the batch schedule as tables and JSON, the answer first.

Running a sweep (servers, levels, load) is :mod:`specproxy.sweep`; this package only reads its records.
"""
