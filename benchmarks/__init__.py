"""The developers' measures: what a change to the per-event path, the attribution or the host does, run from the
checkout as ``python -m benchmarks.NAME`` (docs/bench.md lists each). Not installed: the wheel holds the product,
and ``specproxy bench`` is the user's measure of what the proxy costs.
"""
