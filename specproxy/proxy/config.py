"""The proxy's configuration, parsed from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from specproxy.analysis.slo import SloSpec
from specproxy.core.workload_rules import Rule
from specproxy.recorder.recorder import RecorderConfig


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str  # base URL, e.g. http://127.0.0.1:8000
    host: str = "127.0.0.1"
    port: int = 8080
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    rules: tuple[Rule, ...] = ()
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0  # no byte from upstream for this long: give up (no total timeout)
    max_body_bytes: int = 64 * 1024 * 1024
    max_connections: int = 0  # 0 = unlimited (aiohttp's default of 100 would cap concurrency)
    # On stop, in-flight streams get this long to finish before they are cut: shorter than docker stop's 10 s and
    # Kubernetes' 30 s grace, so the cut streams' records are written before the SIGKILL.
    drain_timeout_s: float = 8.0
    fail_closed: bool = False
    client_header_timeout_s: float = 60.0  # a whole request head, from connect or from its first byte (nginx's 60 s)
    client_body_timeout_s: float = 60.0  # between two reads of a request body (nginx's client_body_timeout)
    slo: SloSpec | None = None  # --slo: live attainment and goodput per workload in /specproxy/status
    # Events a relay holds for its bookkeeper before it sheds chunk events and large bodies (twice this: new
    # requests go unrecorded, counted as lost). --bookkeeping-buffer.
    bookkeeping_buffer_bytes: int = 8 * 1024 * 1024
    workers: int = 0  # relay processes (0: one process, the bookkeeper on the relay's loop)
