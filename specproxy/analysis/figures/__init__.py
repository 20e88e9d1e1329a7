"""The figures every analysis command shares, each defined once: what a record is, how records group, and the
pooled, sampled, sketched and bootstrapped numbers the commands' models are built from.

- ``records``: the per-record predicates and values (finished ``ok``, a generation request, a group key's value, a
  request's decode tok/s and TPOT) and a run's span and output tok/s (:class:`RunSpan`).
- ``groups``: records in groups by the ``--by`` fields, in the order each value first appeared (:class:`Grouping`).
- ``acceptance``: speculative figures pooled over records as vLLM defines them (:class:`AcceptancePool`).
- ``sketch``: quantiles in bounded memory, exact up to a limit, a DDSketch within its relative error beyond
  (:class:`Quantiles`).
- ``sample``: bounded samples of per-request values (a reservoir; a sample by request key that keeps pairs).
- ``confidence``: bootstrap intervals (speedups, pooled acceptance) and the verdicts drawn from them.
- ``slo``: service-level objectives, goodput (:class:`GoodputCount`), and which latency percentiles a report
  computes.
- ``pairing``: which records are the same request in two configurations' runs.
- ``inflight``: requests in flight while a request decoded (the batch size its steps ran at).
- ``buffering``: whether a buffering hop sits between the engine and the recorder (also read live by the proxy).

A figure both streamed and taken over a list of records is computed once, by an accumulator fed one record at
a time; the list form feeds it (``pool_acceptance``, ``output_tok_s``, ``goodput``, ``group_records``).
Pure: records in, numbers out. The command packages (``report``, ``compare``,
``advise``, ``sweep``, ``html``, ``roofline``) import this package, never the reverse.
"""
