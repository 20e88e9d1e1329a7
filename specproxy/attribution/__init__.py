"""Speculative acceptance per request: every estimate, the sharing of counter deltas, and the choice among them.

One pure file per idea, in the order data flows through them:

- ``counts``: :class:`SpecCounts`, the four counts (accepted, drafts, draft tokens, per position) everything adds up.
- ``estimates``: a request's figure from the server's per-request stats or from its chunks (:class:`SpecEstimate`).
- ``intervals``: one scrape interval, cut from the stream of chunks by the engine's decode-step count, and how its
  counter delta is shared among its requests.
- ``wls`` and ``fit``: the weighted regression the two models of the counters (acceptance of inexact requests,
  first-draft acceptance of partial drafters) share, learned across intervals.
- ``ledger``: :class:`CounterLedger`, the bookkeeping that turns chunks and scrapes into intervals and intervals into
  each request's counter figure.
- ``choice``: which estimate a record reports, and its flags.

Nothing here does IO or reads a clock: the recorder (``specproxy.recorder``) feeds it numbers and times. The recorder
and the proxy import this package, never the reverse.
"""
