"""specproxy's own Prometheus metrics, in a private registry served at ``/specproxy/metrics``."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_TOKS_BUCKETS = (1, 5, 10, 20, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000)
_OVERHEAD_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)


class OwnMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "specproxy_requests", "Requests finished, by workload and outcome.", ["workload", "outcome"], registry=r
        )
        self.generated_tokens = Counter(
            "specproxy_generated_tokens", "Completion tokens seen, by workload.", ["workload"], registry=r
        )
        self.spec_accepted = Counter(
            "specproxy_spec_accepted_tokens", "Accepted draft tokens attributed, by workload.", ["workload"], registry=r
        )
        self.spec_draft_tokens = Counter(
            "specproxy_spec_draft_tokens", "Draft tokens attributed, by workload.", ["workload"], registry=r
        )
        self.spec_drafts = Counter(
            "specproxy_spec_drafts", "Speculative steps (drafts) attributed, by workload.", ["workload"], registry=r
        )
        self.spec_zero_acceptance = Gauge(
            "specproxy_spec_zero_acceptance",
            "1 when drafts keep coming while none is accepted (a broken speculative head, e.g. by quantization).",
            ["workload"],
            registry=r,
        )
        self.ttft = Histogram(
            "specproxy_ttft_seconds", "Time to first token.", ["workload"], buckets=_TTFT_BUCKETS, registry=r
        )
        self.inter_token = BulkHistogram(
            "specproxy_inter_token_latency_seconds",
            "Inter-token latency: each chunk gap spread over the tokens it brought.",
            "workload",
            _LATENCY_BUCKETS,
            r,
        )
        self.inter_step = BulkHistogram(
            "specproxy_inter_step_latency_seconds",
            "Gap between consecutive token-bearing chunks (engine steps).",
            "workload",
            _LATENCY_BUCKETS,
            r,
        )
        self.decode_tok_s = Histogram(
            "specproxy_decode_tokens_per_second",
            "Per-request decode rate: (tokens - 1) / (last token - first token).",
            ["workload"],
            buckets=_TOKS_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("specproxy_in_flight_requests", "Requests in flight.", registry=r)
        self.refused = Counter(
            "specproxy_requests_refused",
            "Requests answered by the proxy itself before any upstream request (413 body too large, 408 body too "
            "slow): they get no record.",
            ["status"],
            registry=r,
        )
        self.passthrough = Counter(
            "specproxy_passthrough_requests",
            "Requests relayed that are not inference (health checks, /metrics polls, /v1/models, probes, tokenizer "
            "and embedding calls): counted by kind and outcome, never recorded nor part of a workload.",
            ["kind", "outcome"],
            registry=r,
        )
        self.scrape_errors = Counter(
            "specproxy_upstream_scrape_errors", "Failed scrapes of the engine's /metrics.", registry=r
        )
        self.records_written = Counter("specproxy_records_written", "Records written (all their bytes).", registry=r)
        self.records_dropped = Counter(
            "specproxy_records_dropped",
            "Records lost: never written (over the queue's byte bound while writes fail, unwritable at shutdown).",
            registry=r,
        )
        self.records_queued_bytes = Gauge(
            "specproxy_records_queued_bytes", "Bytes of records waiting to be written.", registry=r
        )
        self.sink_errors = Counter("specproxy_record_sink_errors", "Failed record writes.", registry=r)
        self.record_files_deleted = Counter(
            "specproxy_record_files_deleted", "Rotated record files deleted (--rotate-keep).", registry=r
        )
        self.overhead = Histogram(
            "specproxy_proxy_overhead_seconds",
            "Time recording adds per relayed read (SSE scan, JSON parse, timeline), per request mean.",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )


class BulkHistogram(Collector):
    """A histogram with one label, fed a whole record's gaps at once: one bisect per value, and a weight for a value
    that repeats (a chunk's gap per token, once per token it brought). prometheus_client's Histogram takes one value
    per call, under a lock: about a microsecond each, and a record brings one gap per chunk and one per token.
    Exposed as a Histogram is (``_bucket``, ``_count``, ``_sum``; no ``_created``)."""

    def __init__(
        self, name: str, documentation: str, label: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = [float(b) for b in buckets]
        self.les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self.series: dict[str, tuple[list[float], list[float]]] = {}  # label value -> (counts per bucket, [sum])
        registry.register(self)

    def observe_many(self, value: str, amounts: Sequence[float], weights: Sequence[int] | None = None) -> None:
        series = self.series.get(value)
        if series is None:
            series = self.series[value] = ([0.0] * (len(self.bounds) + 1), [0.0])
        counts, total = series
        bounds = self.bounds
        where = bisect.bisect_left
        # as prometheus_client's Histogram, value by value: the sum takes every one (in order, so it adds up to the
        # same float), NaN goes in no bucket, past the last bound is +Inf
        s = total[0]
        if weights is None:
            for a in amounts:
                s += a
                if a == a:
                    counts[where(bounds, a)] += 1
        else:
            for a, w in zip(amounts, weights, strict=True):
                for _ in range(w):
                    s += a
                if a == a:
                    counts[where(bounds, a)] += w
        total[0] = s

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=[self.label])]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, (counts, total) in self.series.items():
            running, buckets = 0.0, []
            for le, c in zip(self.les, counts, strict=True):
                running += c
                buckets.append((le, running))
            family.add_metric([value], buckets, total[0])
        yield family
