"""What a recorder is told: where records go, what is captured, how the engine is scraped and named."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specproxy.core.record import Record
from specproxy.recorder.sink import DEFAULT_MAX_PENDING_BYTES


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """Where and how spans go (``--otlp-endpoint``, docs/otel.md): OTLP over HTTP, one span per inference record."""

    traces_url: str  # the full URL spans are posted to (ENDPOINT/v1/traces)
    protocol: str = "http/protobuf"  # or http/json
    # Fields sent with every export (an API key): never shown, never logged, never in a record. Not in repr.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_s: float = 10.0  # one export's whole POST
    batch_spans: int = 512  # spans per export at most
    interval_s: float = 1.0  # a batch goes out at least this often while spans wait
    max_queue: int = 2048  # spans waiting beyond this: the oldest are dropped, counted
    close_timeout_s: float = 1.0  # at the proxy's stop, the last spans get this long (inside the stop's grace)
    service_name: str = "specproxy"
    resource: tuple[tuple[str, str], ...] = ()  # OTEL_RESOURCE_ATTRIBUTES
    server_address: str | None = None  # the engine's host and port, as server.address / server.port
    server_port: int | None = None


@dataclass(frozen=True, slots=True)
class RecorderConfig:
    record_path: str | None = None
    metrics_url: str | None = None
    label: str | None = None
    capture: str = "request"  # none | request | full
    # A request body over this many bytes is relayed as it is but neither parsed nor captured (bounded work per
    # request: parsing costs per element, and a body of millions of tiny elements would freeze every stream).
    capture_max_bytes: int = 1024 * 1024
    k: int | None = None  # num_speculative_tokens, when known; else learned from the counters
    scrape_interval_s: float = 0.25
    scrape_timeout_s: float = 2.0
    scrape_min_gap_s: float = 0.1  # the floor between two scrapes, however many requests end
    # the engine gone idle at a request's end: its closing scrape waits this long for the next request of a closed
    # loop, so as to go out after that request's first token rather than meet its arrival (recorder/scraper.py)
    scrape_arrival_wait_s: float = 0.05
    finalize_wait_s: float = 5.0  # how long a finished request waits for its closing scrape
    scrape_failures_wait: int = 3  # ... past fewer failed scrapes in a row than this (one can time out on a busy host)
    # Without exact token counts, overlapping requests share counter deltas through a per-workload acceptance
    # model that improves with every scrape interval: their records wait for it to settle up to this long.
    calibration_hold_s: float = 60.0
    rotate_bytes: int = 256 * 1024 * 1024
    # Rotated files kept (0: all). Runs keep all, since they read their records back; the proxy's --rotate-keep sets it.
    rotate_keep: int = 0
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES  # records waiting for the disk; past it they are lost
    run_id: str | None = None
    tokenizer: str | None = None  # --tokenizer: a tokenizer.json to count text with, or "server" (tokenize_url)
    tokenize_url: str | None = None
    engine: str = "auto"  # --engine: auto, vllm, sglang, ollama, llamacpp (core.dialects.engine)
    probe_url: str | None = None  # with engine auto: the upstream's base URL, probed once at start
    # also given each record: live SLO figures (--slo), the path's buffering verdict (analysis.figures.buffering)
    observers: tuple[Callable[[Record], object], ...] = ()
