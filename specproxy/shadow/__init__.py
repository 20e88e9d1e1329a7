"""Shadow configurations: a share of live requests also sent to candidate servers, each pair compared.

Pure, in the order data flows through them (the IO, sending shadows and reading their replies, is
:mod:`specproxy.proxy.shadow`, in the proxy's bookkeeper):

- ``sample``: :class:`Sampler`, which live requests get a shadow (a share, from a seed, per workload), and whether a
  request decodes greedily (its pair can then be checked for being lossless).
- ``pairs``: one pair's figures (:func:`pair_of`: decode speedup, TTFT, TPOT, end-to-end, acceptance, where the texts
  part), and :class:`PairBook`, the live book that matches each shadow to its live request as their records come.
- ``verdicts``: per candidate and workload, the paired figures with bootstrap intervals, the speedup's verdict, the
  lossless count, and the sentence a user reads (:func:`summarize`); :class:`Guard`, which stops shadowing when the
  live requests that ran beside shadows are slower than those that did not.
"""
