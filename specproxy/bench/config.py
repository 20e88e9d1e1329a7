"""What a bench run is: its configuration (levels, processes, CPUs per role), a relay under test, the load."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BenchConfig:
    streams: tuple[int, ...] = (1, 64, 256, 1024)
    tokens: int = 150
    steps_per_s: float = 25.0
    workers: int | None = None  # N for the `--workers N` row; None: one per core when the proxy has the option
    worker_rows: tuple[int, ...] | None = None  # every N with a row (1 first); None: 1 and `workers`
    clients: int = 1
    upstreams: int = 1  # upstream processes on one port
    upstream_batch: int = 1  # events per upstream write at saturation (1: one event, one write)
    cpus_upstream: frozenset[int] | None = None  # None: not pinned
    cpus_client: frozenset[int] | None = None  # the clients' and the bench's own
    cpus_relays: frozenset[int] | None = None  # every relay's whole process tree
    cpus_bookkeeper: frozenset[int] | None = None  # specproxy's bookkeeping process, once started; None: as relays
    relay_each: bool = False  # each of specproxy's relay processes on one CPU of cpus_relays, in turn
    burst: int = 0  # streams started at once (no stagger), paced, after the levels; 0: none
    burst_tokens: int = 20
    saturation_streams: int = 64
    saturation_tokens: int = 1000
    use_nginx: bool = True
    hostile_streams: int = 64
    floors: bool = False  # also the two reference relays of bench/floors.py (uvloop TCP splice, aiohttp pass-through)
    # and the splice in as many processes as each --workers row beyond 1 (how far the least a relay can do scales)
    aiohttp_door: bool = False  # also specproxy --workers 1 --no-fast-lane (every request read by aiohttp's server)


@dataclass(frozen=True, slots=True)
class Relay:
    name: str
    url: str
    pid: int | None  # None: direct, no relay process
    workers: int | None = None  # specproxy's --workers N; None: not specproxy with --workers
    splices: int | None = None  # the uvloop TCP splice floor in this many processes on one port; None: not it


@dataclass(frozen=True, slots=True)
class Load:
    """The processes that make the load: the upstream's (CPU read per phase) and where clients run."""

    upstream_pids: tuple[int, ...]
    cpus_client: frozenset[int] | None = None
