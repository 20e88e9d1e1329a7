"""specproxy in front of running engines, measured as its users would measure it; one results file.

    python -m benchmarks.real_engine --base URL [--ngram URL] [--draft URL] --out results.json \
        [--phases overhead,acceptance,matrix,whatif,shadow,burst] [--tokenizer MODEL_DIR]

The engines are started beforehand (docs/real-engine.md says how, on a GPU and on this machine's CPU). Each phase
drives them with specproxy's own commands in subprocesses (``run``, ``proxy``, ``matrix``, ``whatif``) and a plain
client for the method by hand, and adds its section to the results file as soon as it ends, so a phase that fails or
runs out of time leaves the others' figures in place:

- ``overhead``: what the proxy adds to what a client sees. ABBA rounds (A straight to the engine, B through
  ``specproxy proxy``) of the same requests at each concurrency; TTFT and TPOT p50/p99 per arm and the paired
  differences, request against the same request; the proxy's CPU per 1,000 relayed events beside the engine's API
  server's CPU per 1,000 events in the same arms.
- ``acceptance``: per workload, one mixed run through the proxy at each mixed concurrency (chunks, counters: the
  records' sources) against each workload alone at concurrency 1 (the counters' delta, exact there), and how often
  chunks were not steps; per request at concurrency 1, the chunks' figure against the counters'.
- ``matrix``: ``specproxy matrix`` over the running engines against the method by hand (``/metrics`` before and
  after, each request alone and timed here, medians of the requests).
- ``whatif``: ``specproxy whatif`` on a full capture of the base engine against the ngram engine's measured
  acceptance on the same requests.
- ``shadow``: base live, the ngram engine as a shadow candidate; what ``/specproxy/status`` says of it.
- ``burst``: many streams at once through the proxy: client errors, records written, events shed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from specproxy.bench.procs import named_stat, tree_cpu_s
from specproxy.core.figures import acceptance_rate, mean_acceptance_length
from specproxy.core.prom import SpecCounters, parse_snapshot, spec_counters
from specproxy.core.record import read_records
from specproxy.core.sse import SSEDecoder
from specproxy.core.stats import percentile

WORKLOADS = ("code_agent", "ja_chat")
BUILTIN = Path(__file__).resolve().parent.parent / "workloads"
CLK_TCK = os.sysconf("SC_CLK_TCK")  # the unit of /proc/PID/stat's CPU times


class HarnessError(Exception):
    """A step could not run: the message says which and why."""


# --- processes ----------------------------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process alone, not its children (0 when it is gone)."""
    named = named_stat(pid)
    return (int(named[1][11]) + int(named[1][12])) / CLK_TCK if named else 0.0


def api_server_pid(url: str) -> int | None:
    """The vLLM API server's own process serving ``url`` (its port on its command line), not its EngineCore."""
    port = url.rstrip("/").rsplit(":", 1)[-1]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if b"vllm.entrypoints.openai.api_server" in argv and port.encode() in argv:
                return int(d.name)
    return None


class Proxy:
    """``specproxy proxy`` as a user starts it, on a free port, in its own process."""

    def __init__(self, upstream: str, record: Path, *args: str) -> None:
        self.record = record
        cmd = [sys.executable, "-m", "specproxy", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(
            [*cmd, "--record", str(record), *args], stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline().decode()
        if not line.startswith("specproxy proxy: http://"):
            self.proc.kill()
            raise HarnessError(f"specproxy proxy did not start: {line.strip()}")
        self.url = line.split()[2]
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.log.append(raw.decode(errors="replace").rstrip())

    def cpu_s(self) -> float:
        return tree_cpu_s(self.proc.pid)

    def status(self) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            async with aiohttp.ClientSession() as s, s.get(self.url + "/specproxy/status") as r:
                return dict(await r.json())

        return asyncio.run(get())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def proxy(upstream: str, record: Path, *args: str) -> Iterator[Proxy]:
    p = Proxy(upstream, record, *args)
    try:
        yield p
    finally:
        p.stop()


def specproxy(*args: str, timeout: float = 600) -> str:
    """Run a specproxy command to its end; its stdout, or a HarnessError with the end of its stderr."""
    p = subprocess.run(
        [sys.executable, "-m", "specproxy", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if p.returncode != 0:
        raise HarnessError(f"specproxy {args[0]} exited {p.returncode}: {p.stderr.strip()[-1500:]}")
    return p.stdout


def load(
    target: str,
    out: Path,
    *,
    workloads: Sequence[str],
    concurrency: int,
    requests: int,
    max_tokens: int,
    seed: int,
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``specproxy run`` closed loop; its records, in the order the requests were sent."""
    specproxy(
        "run",
        "--target",
        target,
        "--workload",
        ",".join(workloads),
        "--concurrency",
        str(concurrency),
        "--requests",
        str(requests),
        "--max-tokens",
        str(max_tokens),
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    )
    return inference(out)


def inference(path: Path) -> list[dict[str, Any]]:
    recs = [dict(r) for r in read_records(path) if str(r["path"]).endswith("/completions")]
    return sorted(recs, key=lambda r: r["started_at"] or 0.0)


async def _counters(url: str) -> SpecCounters:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        return spec_counters("vllm", parse_snapshot(await r.text()).values)


async def settled_counters(url: str) -> SpecCounters:
    """The counters once two reads a short while apart agree (the engine publishes them after the step)."""
    last = await _counters(url)
    for _ in range(50):
        await asyncio.sleep(0.1)
        now = await _counters(url)
        if now == last:
            return now
        last = now
    return last


def delta(after: SpecCounters, before: SpecCounters) -> dict[str, float]:
    def d(a: float | None, b: float | None) -> float:
        return (a or 0.0) - (b or 0.0)

    return {
        "accepted": d(after.accepted, before.accepted),
        "draft_tokens": d(after.draft_tokens, before.draft_tokens),
        "drafts": d(after.drafts, before.drafts),
    }


def rates(x: dict[str, float]) -> dict[str, float | None]:
    return {
        "acceptance": acceptance_rate(x["accepted"], x["draft_tokens"]),
        "mean_acceptance_length": mean_acceptance_length(x["accepted"], x["drafts"]),
        **x,
    }


# --- statistics -----------------------------------------------------------------------------------------------------


def median_ci(xs: Sequence[float], *, seed: int = 0, rounds: int = 2000) -> tuple[float | None, float | None]:
    """A 95 % bootstrap interval of the median."""
    if len(xs) < 3:
        return None, None
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds)]


def summary(xs: Sequence[float]) -> dict[str, Any]:
    lo, hi = median_ci(xs)
    return {"n": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99), "p50_ci95": [lo, hi]}


def request_key(r: dict[str, Any]) -> str:
    return json.dumps((r["workload"], (r.get("request") or {}).get("messages")), sort_keys=True)


def pairs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each request of ``a`` with the same request of ``b`` (same workload and messages, nth with nth)."""
    pool: dict[str, list[dict[str, Any]]] = {}
    for r in b:
        pool.setdefault(request_key(r), []).append(r)
    out = []
    for r in a:
        if pool.get(request_key(r)):
            out.append((r, pool[request_key(r)].pop(0)))
    return out


def ok(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in recs if r["outcome"] == "ok"]


# --- phases ---------------------------------------------------------------------------------------------------------


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        if args.work:
            Path(args.work).mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="real-engine-", dir=args.work))
        self.results: dict[str, Any] = {
            "machine": machine(),
            "engines": {"base": args.base, "ngram": args.ngram, "draft": args.draft},
            "args": {k: v for k, v in vars(args).items() if k not in ("out",)},
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "phases": {},
        }
        self.subsets = subsets(self.dir, args.accept_requests)

    def proxy_args(self) -> list[str]:
        return ["--workers", str(self.a.workers)] if self.a.workers else []

    def save(self) -> None:
        tmp = Path(str(self.a.out) + ".part")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.a.out)

    def archive(self) -> Path | None:
        """The records of the phases that judge attribution (every file but the overhead's and the burst's, which
        are many and judged by counts), beside the results file: what explains a figure once the engines are gone."""
        keep = [
            f
            for f in sorted(self.dir.rglob("*.jsonl"))
            if not f.name.startswith(("overhead-", "warm-", "oh-", "burst"))
        ]
        if not keep:
            return None
        out = records_archive(Path(self.a.out))
        with tarfile.open(out, "w:gz") as tar:
            for f in keep:
                tar.add(f, arcname=str(f.relative_to(self.dir)))
        return out

    def log(self, msg: str) -> None:
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
        sys.stderr.flush()

    def phase(self, name: str, fn: Any) -> None:
        self.log(f"phase {name}")
        t0 = time.monotonic()
        try:
            section = fn()
        except Exception as e:  # one phase failing leaves the others' figures
            section = {"error": f"{type(e).__name__}: {e}"}
            self.log(f"phase {name} failed: {e}")
        section["wall_s"] = round(time.monotonic() - t0, 1)
        self.results["phases"][name] = section
        self.save()

    # overhead ---------------------------------------------------------------------------------------------------------

    def overhead(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        api = api_server_pid(self.a.base)
        if api:
            out["metrics_render"] = render_cost(self.a.base, api)
        for c in self.a.concurrency:
            for extra in self.a.proxy_variants:
                key = f"c{c}" + (f" {' '.join(extra)}" if extra else "")
                out[key] = self._overhead_at(c, api, extra)
                self.results["phases"]["overhead"] = out
                self.save()
        return out

    def _overhead_at(self, c: int, api: int | None, extra: list[str]) -> dict[str, Any]:
        n = max(self.a.min_requests, self.a.requests_per_stream * c)
        arms: dict[str, list[list[dict[str, Any]]]] = {"direct": [], "proxy": []}
        cpu = {
            "proxy_s": 0.0,
            "proxy_events": 0,
            "api_direct_s": 0.0,
            "api_direct_events": 0,
            "api_proxy_s": 0.0,
            "api_proxy_events": 0,
        }
        tag = f"c{c}" + "".join(x.strip("-").replace(" ", "") for x in extra)
        with proxy(self.a.base, self.dir / f"overhead-{tag}.jsonl", *self.proxy_args(), *extra) as p:
            # a warm-up each way, not measured: the engine's caches, the proxy's and the client's pools
            for j, target in enumerate((self.a.base, p.url)):
                load(
                    target,
                    self.dir / f"warm-{tag}-{j}.jsonl",
                    workloads=WORKLOADS,
                    concurrency=c,
                    requests=min(n, 2 * c),
                    max_tokens=self.a.max_tokens,
                    seed=99,
                )
            for i, arm in enumerate(["direct", "proxy", "proxy", "direct"] * self.a.rounds):
                target = self.a.base if arm == "direct" else p.url
                api0, p0 = cpu_s(api) if api else 0.0, p.cpu_s()
                recs = load(
                    target,
                    self.dir / f"oh-{tag}-{i}-{arm}.jsonl",
                    workloads=WORKLOADS,
                    concurrency=c,
                    requests=n,
                    max_tokens=self.a.max_tokens,
                    seed=c,
                )
                events = sum(r["events"] or 0 for r in recs)
                if api:
                    cpu[f"api_{arm}_s"] += cpu_s(api) - api0
                    cpu[f"api_{arm}_events"] += events
                if arm == "proxy":
                    cpu["proxy_s"] += p.cpu_s() - p0
                    cpu["proxy_events"] += events
                arms[arm].append(recs)
                self.log(f"overhead c={c} {' '.join(extra)} {arm}: {len(ok(recs))}/{len(recs)} ok, {events} events")
            status = p.status()
        return self._overhead_figures(arms, cpu, status)

    def _overhead_figures(self, arms: dict[str, Any], cpu: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        fig: dict[str, Any] = {}
        for arm, runs in arms.items():
            recs = [r for run in runs for r in ok(run)]
            fig[arm] = {
                "requests": sum(len(run) for run in runs),
                "errors": sum(len(run) - len(ok(run)) for run in runs),
                "ttft_ms": summary([r["ttft_s"] * 1e3 for r in recs if r["ttft_s"] is not None]),
                "tpot_ms": summary([r["tpot_s"] * 1e3 for r in recs if r["tpot_s"] is not None]),
                "decode_tok_s": summary([r["decode_tok_s"] for r in recs if r["decode_tok_s"]]),
            }
        # ABBA: run 0 (A) with run 1 (B), run 3 (A) with run 2 (B), and so on per round
        d_ttft, r_tpot = [], []
        direct, prox = arms["direct"], arms["proxy"]
        for a_run, b_run in zip(direct, prox, strict=True):
            for a, b in pairs(ok(a_run), ok(b_run)):
                if a["ttft_s"] is not None and b["ttft_s"] is not None:
                    d_ttft.append((b["ttft_s"] - a["ttft_s"]) * 1e3)
                if a["tpot_s"] and b["tpot_s"]:
                    r_tpot.append((b["tpot_s"] / a["tpot_s"] - 1) * 100)
        p50 = {k: (fig["proxy"][k]["p50"], fig["direct"][k]["p50"]) for k in ("ttft_ms", "tpot_ms")}
        fig["added"] = {
            "ttft_ms_p50_of_arms": p50["ttft_ms"][0] - p50["ttft_ms"][1] if None not in p50["ttft_ms"] else None,
            "tpot_pct_p50_of_arms": (p50["tpot_ms"][0] / p50["tpot_ms"][1] - 1) * 100
            if None not in p50["tpot_ms"]
            else None,
            "ttft_ms_paired": summary(d_ttft),
            "tpot_pct_paired": summary(r_tpot),
        }

        def per_k(s: float, e: int) -> float | None:
            return s / e * 1e6 if e else None  # ms of CPU per 1,000 events

        fig["cpu_ms_per_1000_events"] = {
            "proxy_all_processes": per_k(cpu["proxy_s"], cpu["proxy_events"]),
            "vllm_api_server_direct": per_k(cpu["api_direct_s"], cpu["api_direct_events"]),
            "vllm_api_server_through_proxy": per_k(cpu["api_proxy_s"], cpu["api_proxy_events"]),
            "raw": cpu,
        }
        # "engine": its scrapes (how many, their flight and the gap kept between them), a cost to vLLM's API server
        keep = ("records", "bookkeeping", "relays", "shed", "engine")
        fig["proxy_status"] = {k: status.get(k) for k in keep if k in status}
        return fig

    # acceptance -------------------------------------------------------------------------------------------------------

    def acceptance(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("ngram", "draft"):
            url = getattr(self.a, name)
            if url:
                out[name] = self._acceptance_of(name, url)
                self.results["phases"]["acceptance"] = out
                self.save()
        return out

    def _acceptance_of(self, name: str, url: str) -> dict[str, Any]:
        # each prompt sent accept_repeat times alone, and mixed_repeat times (default the same) in each mixed run: a
        # mixed run long enough for many scrapes, at 64 streams more than the alone runs need
        n = self.a.accept_requests * self.a.accept_repeat
        n_mixed = self.a.accept_requests * (self.a.mixed_repeat or self.a.accept_repeat)
        alone: dict[str, Any] = {}
        agree: dict[str, Any] = {}
        for w in WORKLOADS:
            before = asyncio.run(settled_counters(url))
            recs = load(
                url,
                self.dir / f"alone-{name}-{w}.jsonl",
                workloads=[self.subsets[w]],
                concurrency=1,
                requests=n,
                max_tokens=self.a.max_tokens,
                seed=7,
            )
            alone[w] = rates(delta(asyncio.run(settled_counters(url)), before))
            alone[w]["requests"] = len(recs)
            agree[w] = chunk_counter_agreement(recs)
            alone[w]["chunks_not_steps"] = not_steps(recs)
        mixed: dict[str, Any] = {}
        for c in self.a.mixed_concurrency:
            before = asyncio.run(settled_counters(url))
            with proxy(url, self.dir / f"mixed-{name}-c{c}.jsonl", *self.proxy_args()) as p:
                load(
                    p.url,
                    self.dir / f"mixed-{name}-c{c}-client.jsonl",
                    workloads=list(self.subsets.values()),
                    concurrency=c,
                    requests=n_mixed * len(WORKLOADS),
                    max_tokens=self.a.max_tokens,
                    seed=7,
                )
                engine = p.status().get("engine")  # its scrapes, intervals and whether its models settled
            total = delta(asyncio.run(settled_counters(url)), before)
            recs = ok(inference(self.dir / f"mixed-{name}-c{c}.jsonl"))
            by_w: dict[str, Any] = {}
            for w in WORKLOADS:
                mine = [r for r in recs if r["workload"] == w]
                by_w[w] = {src: source_rates(mine, src) for src in ("chosen", "chunks", "counters")}
                by_w[w]["requests"] = len(mine)
                by_w[w]["chunks_not_steps"] = not_steps(mine)
                # records whose counters' share the ledger had not settled by the end (no correction came)
                by_w[w]["unsettled"] = sum(1 for r in mine if "counters_unsettled" in r["flags"])
                chosen = by_w[w]["chosen"]["acceptance"]
                ref = alone[w]["acceptance"]
                by_w[w]["chosen_minus_alone_points"] = (chosen - ref) * 100 if chosen is not None and ref else None
            shares = {k: sum(source_rates([r], "counters")[k] or 0 for r in recs) for k in ("accepted", "draft_tokens")}
            mixed[f"c{c}"] = {
                "workloads": by_w,
                "engine_delta": rates(total),
                "counters_shares_sum": shares,
                "proxy_engine_status": engine,
            }
        return {"alone_c1": alone, "mixed": mixed, "chunks_vs_counters_c1": agree}

    # matrix -----------------------------------------------------------------------------------------------------------

    def matrix(self) -> dict[str, Any]:
        engines = {k: getattr(self.a, k) for k in ("base", "ngram", "draft") if getattr(self.a, k)}
        results = self.dir / "matrix"
        doc = {
            "workloads": list(WORKLOADS),
            "requests": self.a.matrix_requests,
            "warmup": 2,
            "repeats": 1,
            "concurrency": 1,
            "max_tokens": self.a.max_tokens,
            "seed": 3,
            "results": str(results),
            "configurations": [{"label": k, "url": u} for k, u in engines.items()],
        }
        path = self.dir / "matrix.yaml"
        path.write_text(json.dumps(doc))
        printed = specproxy("matrix", str(path), "--no-progress", timeout=900)
        out: dict[str, Any] = {"printed": printed}
        for label, url in engines.items():
            recs = ok(inference(results / f"{label}.jsonl"))
            for w in WORKLOADS:
                mine = [r for r in recs if r["workload"] == w]
                bodies = [dict(r["request"]) for r in mine]
                hand = asyncio.run(by_hand(url, bodies))
                m_rates = [r["decode_tok_s"] for r in mine if r["decode_tok_s"]]
                chosen = source_rates(mine, "chosen")
                m_acc = chosen["acceptance"]
                h_med = statistics.median(hand["tok_s"]) if hand["tok_s"] else None
                m_med = statistics.median(m_rates) if m_rates else None
                out[f"{label}/{w}"] = {
                    "matrix": {
                        "acceptance": m_acc,
                        "decode_tok_s_median": m_med,
                        "requests": len(mine),
                        # records with a speculative figure: the acceptance is theirs, by hand is every request's
                        "with_figure": chosen["records"],
                        "sources": sorted({str((r.get("spec") or {}).get("source")) for r in mine}),
                    },
                    "by_hand": {"acceptance": hand["acceptance"], "decode_tok_s_median": h_med},
                    "acceptance_diff": m_acc - hand["acceptance"]
                    if m_acc is not None and hand["acceptance"] is not None
                    else None,
                    "tok_s_ratio": m_med / h_med if m_med and h_med else None,
                }
        return out

    # whatif -----------------------------------------------------------------------------------------------------------

    def whatif(self) -> dict[str, Any]:
        if not (self.a.ngram and self.a.tokenizer):
            return {"skipped": "needs --ngram and --tokenizer"}
        n = self.a.accept_requests
        base = self.dir / "whatif-base.jsonl"
        with proxy(self.a.base, base, "--capture", "full") as p:
            load(
                p.url,
                self.dir / "whatif-base-client.jsonl",
                workloads=list(self.subsets.values()),
                concurrency=1,
                requests=n * len(WORKLOADS),
                max_tokens=self.a.max_tokens,
                seed=11,
            )
        k = str(self.a.ngram_k)
        predicted = json.loads(
            specproxy(
                "whatif",
                str(base),
                "--tokenizer",
                self.a.tokenizer,
                "--k",
                k,
                "--prompt-lookup-min",
                str(self.a.lookup_min),
                "--prompt-lookup-max",
                str(self.a.lookup_max),
                "--format",
                "json",
            )
        )
        measured: dict[str, Any] = {}
        for w in WORKLOADS:
            before = asyncio.run(settled_counters(self.a.ngram))
            load(
                self.a.ngram,
                self.dir / f"whatif-ngram-{w}.jsonl",
                workloads=[self.subsets[w]],
                concurrency=1,
                requests=n,
                max_tokens=self.a.max_tokens,
                seed=11,
            )
            measured[w] = rates(delta(asyncio.run(settled_counters(self.a.ngram)), before))
        return {"predicted": predicted, "measured_ngram_c1": measured}

    # shadow -----------------------------------------------------------------------------------------------------------

    def shadow(self) -> dict[str, Any]:
        if not self.a.ngram:
            return {"skipped": "needs --ngram"}
        rec = self.dir / "shadow.jsonl"
        args = ["--shadow", f"ngram={self.a.ngram}", "--shadow-share", "1", "--shadow-max-inflight", "16"]
        with proxy(self.a.base, rec, *args) as p:
            client = load(
                p.url,
                self.dir / "shadow-client.jsonl",
                workloads=WORKLOADS,
                concurrency=4,
                requests=self.a.accept_requests * 2,
                max_tokens=self.a.max_tokens,
                seed=5,
            )
            status = wait_for(lambda: shadows_done(p.status()), 60)
        recs = inference(rec)
        live = [r for r in recs if not r.get("shadow_of")]
        shadows = [r for r in recs if r.get("shadow_of")]
        return {
            "client_requests": len(client),
            "client_errors": len(client) - len(ok(client)),
            "live_records": len(live),
            "shadow_records": len(shadows),
            "shadows_ok": len(ok(shadows)),
            "status_shadow": status.get("shadow"),
            "shadow_acceptance": source_rates(ok(shadows), "chosen"),
        }

    # burst ------------------------------------------------------------------------------------------------------------

    def burst(self) -> dict[str, Any]:
        target = self.a.ngram or self.a.base
        rec = self.dir / "burst.jsonl"
        c, n = self.a.burst_streams, self.a.burst_requests
        with proxy(target, rec, *self.proxy_args()) as p:
            t0 = time.monotonic()
            client = load(
                p.url,
                self.dir / "burst-client.jsonl",
                workloads=WORKLOADS,
                concurrency=c,
                requests=n,
                max_tokens=self.a.burst_max_tokens,
                seed=13,
            )
            wall = time.monotonic() - t0
            status = wait_for(lambda: records_idle(p.status(), n), 60)
        recs = inference(rec)
        shed = [r for r in recs if "bookkeeping_shed" in (r.get("flags") or [])]
        return {
            "streams": c,
            "requests": n,
            "wall_s": round(wall, 1),
            "client_ok": len(ok(client)),
            "client_errors": len(client) - len(ok(client)),
            "client_error_kinds": sorted({str(r["error"]) for r in client if r["outcome"] != "ok"})[:10],
            "records_written": len(recs),
            "records_ok": len(ok(recs)),
            "records_flagged_shed": len(shed),
            "events": sum(r["events"] or 0 for r in recs),
            "tokens": sum(r["completion_tokens"] or 0 for r in recs),
            "status": {k: status.get(k) for k in ("records", "bookkeeping", "relays") if k in status},
        }


def subsets(folder: Path, n: int) -> dict[str, str]:
    """Each workload's first ``n`` prompts as a file of its own, so that a run of ``n`` requests per workload sends
    each prompt once, alone or mixed: the same requests either way."""
    out = {}
    for w in WORKLOADS:
        doc = json.loads((BUILTIN / f"{w}.json").read_text())
        if len(doc["items"]) < n:
            raise HarnessError(f"workload {w} has {len(doc['items'])} prompts, fewer than {n}")
        doc["items"] = doc["items"][:n]
        path = folder / f"{w}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False))
        out[w] = str(path)
    return out


def machine() -> dict[str, Any]:
    gpu = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "gpu": gpu or None}


def wait_for(fn: Any, within_s: float) -> dict[str, Any]:
    """Poll ``fn`` (a status getter that returns (done, status)) until done or the time is up; the last status."""
    deadline = time.monotonic() + within_s
    while True:
        done, status = fn()
        if done or time.monotonic() > deadline:
            return dict(status)
        time.sleep(0.2)


def shadows_done(status: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    cands = (status.get("shadow") or {}).get("candidates") or {}
    return all(not c.get("in_flight") for c in cands.values()), status


def records_idle(status: dict[str, Any], expected: int) -> tuple[bool, dict[str, Any]]:
    """Every request ended and its record written (a record of the proxy's own GETs may come on top)."""
    recs, book = status.get("records") or {}, status.get("bookkeeping") or {}
    done = not book.get("relay_in_flight") and not recs.get("queued") and not recs.get("held")
    return done and (recs.get("written") or 0) >= expected, status


def source_rates(recs: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """Summed accepted / draft tokens / drafts of ``recs`` from one source (``chosen``: each record's own choice)."""
    tot = {"accepted": 0.0, "draft_tokens": 0.0, "drafts": 0.0}
    used = 0
    for r in recs:
        spec = r.get("spec") or {}
        est = spec if source == "chosen" else (spec.get("estimates") or {}).get(source)
        if not est or est.get("draft_tokens") is None:
            continue
        used += 1
        for k in tot:
            tot[k] += est.get(k) or 0
    return {**rates(tot), "records": used}


def chunk_counter_agreement(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per request alone: the chunks' accepted count against the counters' (exact at concurrency 1)."""
    diffs = []
    for r in recs:
        est = (r.get("spec") or {}).get("estimates") or {}
        ch, co = est.get("chunks"), est.get("counters")
        if ch and co and co.get("accepted") is not None and ch.get("accepted") is not None:
            diffs.append(ch["accepted"] - co["accepted"])
    return {
        "requests": len(diffs),
        "equal": sum(1 for d in diffs if d == 0),
        "mean_abs_diff": statistics.fmean(abs(d) for d in diffs) if diffs else None,
        "max_abs_diff": max((abs(d) for d in diffs), default=None),
    }


def not_steps(recs: list[dict[str, Any]]) -> dict[str, Any]:
    flags = ("multi_event_reads", "stream_interval_suspected", "chunks_fewer_than_steps", "partial_drafting")
    return {
        "requests": len(recs),
        "chunks_not_steps": sum(1 for r in recs if not r.get("chunks_are_steps")),
        **{f: sum(1 for r in recs if f in (r.get("flags") or [])) for f in flags},
    }


async def by_hand(url: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The method by hand: /metrics before, each request alone and timed here (by the running usage count), after."""
    before = await settled_counters(url)
    tok_s: list[float] = []
    async with aiohttp.ClientSession() as s:
        for body in bodies:
            body = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            first = last = None
            tokens = 0
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                sse = SSEDecoder()
                async for data in r.content.iter_any():
                    now = time.perf_counter()
                    for event in sse.feed(data):
                        if event.data in ("", "[DONE]"):
                            continue
                        count = (json.loads(event.data).get("usage") or {}).get("completion_tokens") or 0
                        if count > tokens:  # this chunk brought tokens, text or not
                            first = now if first is None else first
                            last, tokens = now, count
            if first is not None and last is not None and last > first and tokens > 1:
                tok_s.append((tokens - 1) / (last - first))
    d = delta(await settled_counters(url), before)
    return {"acceptance": acceptance_rate(d["accepted"], d["draft_tokens"]), "tok_s": tok_s}


PHASES = ("overhead", "acceptance", "matrix", "whatif", "shadow", "burst")


def variants(text: str) -> list[list[str]]:
    """``--proxy-variants``: proxy argument lists separated by ``;``, ``default`` (or nothing) for none."""
    out = [[] if v.strip() in ("", "default") else shlex.split(v) for v in text.split(";")]
    return out or [[]]


def render_cost(url: str, api: int, n: int = 20) -> dict[str, Any]:
    """What one ``/metrics`` render costs the engine's API server while it is idle: its CPU per scrape (over ``n``
    scrapes in a row), the text's size and a scrape's flight."""

    async def go() -> tuple[list[float], int]:
        flights, size = [], 0
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                t0 = time.perf_counter()
                async with s.get(url.rstrip("/") + "/metrics", headers={"Accept-Encoding": "identity"}) as r:
                    size = len(await r.read())
                flights.append((time.perf_counter() - t0) * 1e3)
        return flights, size

    c0 = cpu_s(api)
    flights, size = asyncio.run(go())
    return {
        "scrapes": n,
        "bytes": size,
        "cpu_ms_per_scrape": (cpu_s(api) - c0) / n * 1e3,
        "flight_ms": summary(flights),
    }


def ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.real_engine", description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="URL of the engine without speculation")
    ap.add_argument("--ngram", help="URL of the same model with ngram speculation")
    ap.add_argument("--draft", help="URL of the same model with a draft model")
    ap.add_argument("--out", type=Path, required=True, help="results file (JSON), rewritten after each phase")
    ap.add_argument("--work", default=None, help="folder for the records (default: a temporary folder)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    ap.add_argument("--concurrency", type=ints, default=[1, 16, 64, 256], help="the overhead's concurrencies")
    ap.add_argument("--mixed-concurrency", type=ints, default=[16, 64])
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds per concurrency")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--min-requests", type=int, default=32)
    ap.add_argument("--accept-requests", type=int, default=24, help="prompts per workload in the acceptance runs")
    ap.add_argument(
        "--accept-repeat", type=int, default=1, help="times each of those prompts is sent alone (and mixed, by default)"
    )
    ap.add_argument(
        "--mixed-repeat", type=int, default=0, help="times each prompt is sent in each mixed run (0: --accept-repeat)"
    )
    ap.add_argument("--matrix-requests", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--burst-streams", type=int, default=256)
    ap.add_argument("--burst-requests", type=int, default=1024)
    ap.add_argument("--burst-max-tokens", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="the proxy's relay processes (0: its default)")
    ap.add_argument(
        "--proxy-variants",
        type=variants,
        default=[[]],
        help="the overhead measured once per proxy argument list, ';'-separated ('default': none), e.g. "
        '"default;--metrics-url none;--workers 2"',
    )
    ap.add_argument("--tokenizer", help="the model folder (tokenizer.json, chat template) for whatif")
    ap.add_argument("--ngram-k", type=int, default=3)
    ap.add_argument("--lookup-min", type=int, default=2)
    ap.add_argument("--lookup-max", type=int, default=4)
    a = ap.parse_args(argv)
    bad = set(a.phases.split(",")) - set(PHASES)
    if bad:
        ap.error(f"unknown phase(s): {', '.join(sorted(bad))}")
    if a.accept_requests < 1 or a.accept_repeat < 1 or a.mixed_repeat < 0:
        ap.error("--accept-requests and --accept-repeat take 1 or more, --mixed-repeat 0 or more")
    return a


def records_archive(out: Path) -> Path:
    """Where the records of a results file go: ``results.json`` -> ``results-records.tar.gz``."""
    return out.with_name(f"{out.stem}-records.tar.gz")


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    try:
        h = Harness(a)
    except (HarnessError, OSError) as e:
        sys.stderr.write(f"python -m benchmarks.real_engine: error: {e}\n")
        return 2
    for name in a.phases.split(","):
        h.phase(name, getattr(h, name))
    h.results["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    h.save()
    kept = h.archive()
    failed = [n for n, s in h.results["phases"].items() if "error" in s]
    h.log(f"wrote {a.out}" + (f" and {kept}" if kept else "") + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
