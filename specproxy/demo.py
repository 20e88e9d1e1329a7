"""``specproxy demo``: what the product is for, in well under a minute, with nothing but the package.

It starts the simulator in four configurations (no speculation, MTP with k = 1, 3, 5), puts a recording proxy in
front of each, sends the built-in ``ja_chat`` and ``code_agent`` workloads through every proxy at concurrency 1 (the
published method), and prints the comparison table per workload and the advice on k, from the proxy's records.
Everything runs in this process on loopback ports chosen by the system.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from specproxy.analysis.advise import render as render_advise
from specproxy.analysis.advise.gather import build_advice
from specproxy.analysis.advise.measured import measured_rows, with_measurements
from specproxy.analysis.advise.model import Advice
from specproxy.analysis.compare import render as render_compare
from specproxy.analysis.compare.model import Comparison, build_comparison
from specproxy.analysis.tables import render_text
from specproxy.core.record import Record, read_records
from specproxy.loadgen.plan import BodyOptions
from specproxy.loadgen.runner import LoadSpec
from specproxy.loadgen.session import run_load
from specproxy.loadgen.target import Target
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.server import start_proxy
from specproxy.recorder.recorder import RecorderConfig
from specproxy.sim.config import SimConfig
from specproxy.sim.server import start_sim
from specproxy.workloads import load_workload

CONFIGS: tuple[tuple[str, str, int], ...] = (
    ("Base", "none", 0),
    ("MTP-n1", "mtp", 1),
    ("MTP-n3", "mtp", 3),
    ("MTP-n5", "mtp", 5),
)
WORKLOADS = ("ja_chat", "code_agent")


# Sized so that the advice rests on enough data (specproxy advise wants 20 requests and 1,000 draft tokens per
# workload; the three MTP configurations pool 3 x 7 = 21) while the slowest configuration, the baseline at the
# simulator's default speed, sends its 2 x 7 requests of up to 128 tokens in under 20 s.
@dataclass(frozen=True, slots=True)
class DemoConfig:
    requests: int = 7  # per workload and configuration
    max_tokens: int = 128
    seed: int = 0
    out_dir: Path | None = None  # keep the records here (default: a temporary folder)


async def _one(label: str, method: str, k: int, cfg: DemoConfig, out_dir: Path, scratch: Path) -> Path:
    sim = await start_sim(SimConfig(port=0, spec_method=method, num_speculative_tokens=max(k, 1), seed=cfg.seed))
    record = out_dir / f"{label}.jsonl"
    try:
        proxy = await start_proxy(
            ProxyConfig(
                upstream=sim.url,
                port=0,
                recorder=RecorderConfig(record_path=str(record), metrics_url=sim.url + "/metrics", label=label),
            )
        )
        try:
            spec = LoadSpec(
                target=Target(proxy.url),
                workloads=tuple(load_workload(w) for w in WORKLOADS),
                body=BodyOptions(model="", max_tokens=cfg.max_tokens),
                recorder=RecorderConfig(label=label, run_id=uuid.uuid4().hex[:12]),
                seed=cfg.seed,
                requests=cfg.requests * len(WORKLOADS),
                concurrency=1,
            )
            await run_load(spec, out=scratch / f"client-{label}.jsonl", progress=False, handle_signals=False)
        finally:
            await proxy.close()  # every record written
    finally:
        await sim.close()
    return record


@dataclass(frozen=True, slots=True)
class DemoResult:
    text: str
    comparison: Comparison
    advice: Advice
    records: list[Record]


async def run_demo(cfg: DemoConfig) -> DemoResult:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specproxy-demo-") as tmp:
        out_dir = cfg.out_dir or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = await asyncio.gather(*(_one(label, m, k, cfg, out_dir, Path(tmp)) for label, m, k in CONFIGS))
        records: list[Record] = [r for p in paths for r in read_records(p)]
    base = [r for r in records if r["label"] == "Base"]
    spec = [r for r in records if r["label"] != "Base"]
    comparison = build_comparison(records, "Base")
    advice = with_measurements(build_advice(spec, base), measured_rows(spec, base))
    elapsed = time.monotonic() - t0
    parts = [
        "specproxy demo: a simulated 2B model (roofline step cost, MTP acceptance by workload) served four ways,",
        f"{cfg.requests} requests per workload each at concurrency 1, recorded by the proxy in front of each server.",
        "A demonstration on the built-in simulator: the figures show what specproxy measures, not how any real server",
        "performs.",
        "",
        render_text(render_compare.compare_tables(comparison)),
        "",
        render_advise.cost_text(advice),
        "",
        render_text(render_advise.advise_tables(advice)),
        "",
        f"({len(records)} requests in {elapsed:.0f} s."
        + (f" Records: {cfg.out_dir}/*.jsonl" if cfg.out_dir else " Keep the records with --out DIR.")
        + " Next: `specproxy matrix` (docs/matrix.md) to measure your own server's configurations, or put"
        + " `specproxy proxy --upstream http://your-vllm:8000` in front of it.)",
    ]
    return DemoResult("\n".join(parts), comparison, advice, records)
