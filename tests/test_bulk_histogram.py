"""The own metrics' bulk histogram exposes what prometheus_client's Histogram would, value for value."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from specproxy.recorder.metrics import _LATENCY_BUCKETS, BulkHistogram


def _exposed(registry: CollectorRegistry) -> list[str]:
    return [ln for ln in generate_latest(registry).decode().splitlines() if "_created" not in ln]


def test_bulk_observations_expose_as_one_by_one_ones() -> None:
    ref_registry, bulk_registry = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("gap_seconds", "Gaps.", ["workload"], buckets=_LATENCY_BUCKETS, registry=ref_registry)
    bulk = BulkHistogram("gap_seconds", "Gaps.", "workload", _LATENCY_BUCKETS, bulk_registry)
    # on a bound, between bounds, past the last, zero, and a sum whose last digit depends on the order of adding;
    # infinities and NaN; and values that repeat (a chunk's gap per token), weighed instead of repeated
    plain = [0.0, 0.001, 0.0011, 0.04, 0.2, 3.0] + [0.1] * 10
    odd = [float("inf"), float("-inf"), float("nan"), 1e308, 1e308]  # NaN in no bucket, infinities at the ends
    weighted = [(0.025, 3), (0.5, 1), (0.1, 10)]
    for label, values in (("code", plain), ("odd", odd)):
        for v in values:
            ref.labels(label).observe(v)
        bulk.observe_many(label, values)
    for v, n in weighted:
        for _ in range(n):
            ref.labels("chat").observe(v)
    bulk.observe_many("chat", [v for v, _ in weighted], [n for _, n in weighted])
    assert _exposed(bulk_registry) == _exposed(ref_registry)
