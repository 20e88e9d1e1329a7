"""The simulator's /metrics: vLLM V1's Prometheus names, labels and buckets, in a private registry.

One `SimMetrics` per server (and a fresh one after POST /sim/reset-counters, so `_created` changes as after a
restart). Labels are declared in alphabetical order because vLLM's multiprocess collector prints them sorted.
With spec_method "none" no `vllm:spec_decode_*` family is registered at all, as on a real server.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specproxy.sim.records import FINISH_REASONS, StepReport

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket bounds copied from vLLM 0.32's /metrics (tests/data/metrics-ngram-after-code.txt).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

_L = ("engine", "model_name")


class SimMetrics:
    """Prometheus families for `engines` engines of one served model."""

    def __init__(self, model_name: str, engines: int, k: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.k = k
        reg = self.registry
        self._labels = [(str(e), model_name) for e in range(engines)]
        if k > 0:
            self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", _L, registry=reg)
            self.draft_tokens = Counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", _L, registry=reg
            )
            self.accepted = Counter(
                "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", _L, registry=reg
            )
            self.per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                (*_L, "position"),
                registry=reg,
            )
        self.read_bytes = Counter(
            "vllm:estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
            _L,
            registry=reg,
        )
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", _L, registry=reg
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", _L, registry=reg
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", _L, registry=reg)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", _L, registry=reg
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("engine", "finished_reason", "model_name"),
            registry=reg,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _L,
            registry=reg,
            buckets=TTFT_BUCKETS,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _L,
            registry=reg,
            buckets=ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _L,
            registry=reg,
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _L,
            registry=reg,
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        # Pre-create every series at 0 like vLLM does, so a scrape before any traffic shows them.
        for engine, model in self._labels:
            if k > 0:
                for c in (self.drafts, self.draft_tokens, self.accepted):
                    c.labels(engine, model)
                for pos in range(k):
                    self.per_pos.labels(engine, model, str(pos))
            for c in (self.read_bytes, self.prompt_tokens, self.generation_tokens):
                c.labels(engine, model)
            self.running.labels(engine, model).set(0)
            self.waiting.labels(engine, model).set(0)
            for reason in FINISH_REASONS:
                self.success.labels(engine, reason, model)
            for h in (self.ttft, self.itl, self.e2e, self.queue):
                h.labels(engine, model)

    def record_step(self, report: StepReport) -> None:
        """Apply one step's counts (latencies are in the driver's clock: wall seconds on a server)."""
        engine, model = self._labels[report.engine]
        if self.k > 0 and report.drafts:
            self.drafts.labels(engine, model).inc(report.drafts)
            self.draft_tokens.labels(engine, model).inc(report.draft_tokens)
            self.accepted.labels(engine, model).inc(report.accepted)
            for pos, n in enumerate(report.per_position):
                if n:
                    self.per_pos.labels(engine, model, str(pos)).inc(n)
        if report.read_bytes:
            self.read_bytes.labels(engine, model).inc(report.read_bytes)
        if report.prompt_tokens:
            self.prompt_tokens.labels(engine, model).inc(report.prompt_tokens)
        generated = 0
        ttft, itl, e2e, queue = (h.labels(engine, model) for h in (self.ttft, self.itl, self.e2e, self.queue))
        for out in report.outputs:
            generated += len(out.token_ids)
            if out.ttft_s is not None:
                ttft.observe(out.ttft_s)
            if out.queue_s is not None:
                queue.observe(out.queue_s)
            if out.itl_s is not None:
                itl.observe(out.itl_s)
            if out.finish_reason is not None:
                self.success.labels(engine, out.finish_reason, model).inc()
                if out.e2e_s is not None:
                    e2e.observe(out.e2e_s)
        if generated:
            self.generation_tokens.labels(engine, model).inc(generated)

    def record_finish(self, engine_index: int, reason: str) -> None:
        """A request ended outside a step (abort, error)."""
        engine, model = self._labels[engine_index]
        self.success.labels(engine, reason, model).inc()

    def set_queue_depths(self, engine_index: int, running: int, waiting: int) -> None:
        engine, model = self._labels[engine_index]
        self.running.labels(engine, model).set(running)
        self.waiting.labels(engine, model).set(waiting)

    def render(self) -> bytes:
        return generate_latest(self.registry)
