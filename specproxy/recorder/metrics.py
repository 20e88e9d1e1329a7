"""specproxy's own Prometheus metrics, in a private registry served at ``/specproxy/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.inter_token = Histogram(
            "specproxy_inter_token_latency_seconds",
            "Inter-token latency: each chunk gap spread over the tokens it brought.",
            ["workload"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_step = Histogram(
            "specproxy_inter_step_latency_seconds",
            "Gap between consecutive token-bearing chunks (engine steps).",
            ["workload"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
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
