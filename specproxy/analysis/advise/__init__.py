"""``specproxy advise``: which k (draft tokens per step) pays off, predicted from measured acceptance per draft
position and the cost of a draft token, and held to what the runs measured.

- ``model``: the decisions: the cost model and its fit, predicted speedup per k, the recommended k, warnings.
- ``gather``: what the decisions need of the runs, gathered in one streaming pass (:class:`AdviseInput`;
  :func:`build_advice` for records already in memory).
- ``measured``: what the runs measured beside the prediction (speedup and acceptance with intervals, SLO), and the
  advice held to it.
- ``render``: the advice and the measurements as tables and JSON.

The draft cost per batch size (``k per batch size``) is the sweep's: :mod:`specproxy.analysis.sweep.batchcost`.
"""
