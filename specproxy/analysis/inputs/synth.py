"""Synthetic record files of any size, written as the record sink writes them: for benchmarks and scale tests.

Each record is a finished (mostly) streamed request with a chunk timeline of about ``chunks`` token-bearing chunks
(offsets rounded to microseconds, as the recorder rounds them), a spec block whose figures follow the chunks, and the
usual mix of workloads, configurations, outcomes and repeats. Deterministic for a seed. Lines go through
:func:`specproxy.core.record.as_record` and :func:`specproxy.core.record.dumps`, so they are exactly what a reader
meets in a real file; rotation (``x.jsonl.1``, ``.2`` ...) and compression (``.gz``, ``.zst``) follow the sink's
names.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from specproxy.core.figures import acceptance_rate, decode_tok_s, mean_acceptance_length, tpot_s
from specproxy.core.record import SCHEMA_VERSION, as_record, dumps

T0 = 1_700_000_000.0
WORKLOADS = ("ja_chat", "code_agent", "ja_long")
LABELS = ("Base", "MTP-n1", "MTP-n3")
# per workload: probability that a drafted position is accepted given the one before was
_ACCEPT = {"ja_chat": 0.45, "code_agent": 0.8, "ja_long": 0.55}


def synth_record(i: int, rng: random.Random, chunks: int = 106) -> dict[str, Any]:
    workload = WORKLOADS[i % len(WORKLOADS)]
    label = LABELS[(i // len(WORKLOADS)) % len(LABELS)]
    k = 0 if label == "Base" else int(label[-1])
    roll = rng.random()
    outcome = "ok" if roll > 0.02 else ("upstream_error" if roll > 0.01 else "client_cancelled")
    ttft = 0.02 + rng.expovariate(1 / 0.08)
    step_s = 0.008 * (1 + 0.2 * k) * (0.8 + 0.4 * rng.random())
    n_steps = max(1, chunks - 1 + rng.randint(-20, 20))
    timeline: list[tuple[float, int]] = [(round(ttft, 6), 1)]
    accepted: list[int] = []
    t = ttft
    p = _ACCEPT[workload]
    for _ in range(n_steps):
        a = 0
        while a < k and rng.random() < p:
            a += 1
        accepted.append(a)
        t += step_s * (0.5 + rng.random())
        timeline.append((round(t, 6), 1 + a))
    total = sum(n for _, n in timeline)
    span = timeline[-1][0] - timeline[0][0]
    spec: dict[str, Any] | None = None
    if k:
        per_position = [sum(1 for a in accepted if a > j) for j in range(k)]
        hist: dict[str, int] = {}
        for a in accepted:
            hist[str(1 + a)] = hist.get(str(1 + a), 0) + 1
        est: dict[str, Any] = {
            "accepted": sum(accepted),
            "drafts": n_steps,
            "draft_tokens": k * n_steps,
            "per_position": per_position,
        }
        spec = {
            "source": "chunks",
            **est,
            "k": k,
            "acceptance_rate": acceptance_rate(est["accepted"], est["draft_tokens"]),
            "mean_acceptance_length": mean_acceptance_length(est["accepted"], n_steps),
            "tokens_per_step": hist,
            "estimates": {"server": None, "chunks": {**est, "exact": True}, "counters": {**est, "exact": False}},
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "request_id": f"r{i:09d}",
        "upstream_id": f"chatcmpl-{i:09d}",
        "started_at": T0 + i * 0.05 + rng.random() * 0.01,
        "workload": workload,
        "label": label,
        "run_id": f"run-{label}",
        "repeat": None,
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "sim-model",
        "status": 200 if outcome == "ok" else 500,
        "stream": True,
        "outcome": outcome,
        "error": None if outcome == "ok" else "upstream said no",
        "finish_reason": "stop" if outcome == "ok" else None,
        "truncated": False,
        "prompt_tokens": rng.randint(20, 2000),
        "completion_tokens": total,
        "cached_tokens": None,
        "token_source": "usage",
        "chunk_token_source": "usage",
        "ttft_s": round(ttft, 6),
        "e2e_s": round(t + 0.001, 6),
        "decode_tok_s": decode_tok_s(timeline),
        "tpot_s": tpot_s(span, total),
        "upstream_headers_s": round(ttft / 2, 6),
        "chunks": timeline,
        "events": len(timeline) + 2,
        "reads": len(timeline) + 2,
        "multi_event_reads": 0,
        "keepalives": 0,
        "chunks_are_steps": True,
        "flags": [],
        "proxy_overhead_s": {"mean": 4e-05, "max": 0.0003, "count": len(timeline) + 2},
        "spec": spec,
        "request": None,
        "response_text": None,
        "replay_of": None,
    }


def synth_lines(n: int, *, seed: int = 0, chunks: int = 106) -> Iterator[bytes]:
    rng = random.Random(seed)
    for i in range(n):
        yield dumps(as_record(synth_record(i, rng, chunks)))


def _open(path: Path) -> BinaryIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "wb", compresslevel=1)  # type: ignore[return-value]
    if path.name.endswith(".zst"):
        import zstandard

        return zstandard.open(path, "wb")  # type: ignore[no-any-return]
    return path.open("wb")


def write_synth(
    path: Path, n: int, *, seed: int = 0, chunks: int = 106, files: int = 1, compress: tuple[str, ...] = ()
) -> list[Path]:
    """``n`` records in ``files`` files: ``path`` holds the newest, ``path.1`` the next older and so on, as the sink
    rotates. ``compress`` gives, oldest first, a suffix per rotated file (``"gz"``, ``"zst"`` or ``""``)."""
    per = -(-n // files)
    written: list[Path] = []
    lines = synth_lines(n, seed=seed, chunks=chunks)
    for f in range(files):
        index = files - 1 - f  # oldest first: path.(files-1) ... path.1, path
        suffix = compress[f] if f < len(compress) else ""
        name = str(path) if index == 0 else f"{path}.{index}"
        out = Path(f"{name}.{suffix}" if suffix else name)
        with _open(out) as fh:
            for _ in range(min(per, n - f * per)):
                fh.write(next(lines))
        written.append(out)
    return written
