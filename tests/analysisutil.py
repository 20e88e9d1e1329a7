"""Record factories for the analysis tests: deterministic records whose figures are known exactly.

A record is built from the accepted count of each decode step: the first chunk (the prefill token) arrives at
``ttft_s``, then one chunk per step every ``step_s`` carrying ``1 + accepted`` tokens. Everything the recorder would
derive (decode tok/s, TPOT, per-position counts, tokens-per-step histogram) is derived here the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specproxy.core.record import SCHEMA_VERSION, Record, as_record, dumps

T0 = 1_700_000_000.0  # started_at of the first request of every factory run


def accepted_from_profile(conditional: Sequence[float], k: int, steps: int) -> list[int]:
    """Accepted counts for ``steps`` drafts of ``k`` tokens whose pooled per-position counts follow the conditional
    rates: round(steps * prod_{i<j} p_i) steps accept at least j tokens. Spread evenly, not sorted."""
    at_least = [steps]
    survive = 1.0
    for j in range(k):
        survive *= conditional[min(j, len(conditional) - 1)]
        at_least.append(round(steps * survive))
    counts = [at_least[a] - (at_least[a + 1] if a < k else 0) for a in range(k + 1)]
    out: list[int] = []
    for a, c in enumerate(counts):
        out.extend([a] * c)
    # A fixed stride permutation: every request gets a similar mix.
    stride = next(s for s in range(7, steps + 7) if math.gcd(s, steps) == 1) if steps > 1 else 1
    return [out[(i * stride) % steps] for i in range(steps)]


def make_record(
    request_id: str,
    *,
    accepted: Sequence[int] = (),
    k: int = 0,
    plain_steps: int = 0,
    workload: str = "chat",
    label: str | None = "MTP-n3",
    started_at: float = T0,
    ttft_s: float = 0.05,
    step_s: float = 0.01,
    tail_s: float = 0.001,
    source: str = "chunks",
    counters_accepted_extra: float | None = None,
    repeat: int | None = None,
    run_id: str = "run-1",
    replay_of: str | None = None,
    outcome: str = "ok",
    flags: Sequence[str] = (),
    chunks_are_steps: bool = True,
    request: dict[str, Any] | None = None,
    response_text: str | None = None,
) -> Record:
    """One finished streamed request. With ``k > 0`` each entry of ``accepted`` is one speculative step; without,
    ``plain_steps`` one-token steps follow the first token and ``spec`` is null."""
    tokens_per_step = [1 + a for a in accepted] if k > 0 else [1] * plain_steps
    chunks = [[ttft_s, 1]]
    for i, n in enumerate(tokens_per_step):
        chunks.append([ttft_s + (i + 1) * step_s, n])
    total = sum(n for _, n in chunks)
    span = chunks[-1][0] - chunks[0][0]
    spec: dict[str, Any] | None = None
    if k > 0:
        per_position = [sum(1 for a in accepted if a > i) for i in range(k)]
        hist: dict[str, int] = {}
        for n in tokens_per_step:
            hist[str(n)] = hist.get(str(n), 0) + 1
        est = {
            "accepted": sum(accepted),
            "drafts": len(accepted),
            "draft_tokens": k * len(accepted),
            "per_position": per_position,
        }
        counters = None
        if counters_accepted_extra is not None:
            counters = {**est, "accepted": est["accepted"] + counters_accepted_extra, "exact": True}
        spec = {
            "source": source,
            **{key: est[key] for key in ("accepted", "drafts", "draft_tokens", "per_position")},
            "k": k,
            "acceptance_rate": est["accepted"] / est["draft_tokens"] if est["draft_tokens"] else None,
            "mean_acceptance_length": 1 + est["accepted"] / est["drafts"] if est["drafts"] else None,
            "tokens_per_step": hist,
            "estimates": {
                "server": est if source == "server" else None,
                "chunks": est if source == "chunks" else None,
                "counters": counters,
            },
        }
    return as_record(
        {
            "schema_version": SCHEMA_VERSION,
            "request_id": request_id,
            "upstream_id": f"chatcmpl-{request_id}",
            "started_at": started_at,
            "workload": workload,
            "label": label,
            "run_id": run_id,
            "repeat": repeat,
            "method": "POST",
            "path": "/v1/chat/completions",
            "model": "sim-model",
            "status": 200 if outcome == "ok" else 500,
            "stream": True,
            "outcome": outcome,
            "error": None if outcome == "ok" else "upstream said no",
            "finish_reason": "stop" if outcome == "ok" else None,
            "truncated": False,
            "prompt_tokens": 20,
            "completion_tokens": total,
            "token_source": "usage",
            "chunk_token_source": "usage",
            "ttft_s": ttft_s,
            "e2e_s": chunks[-1][0] + tail_s,
            "decode_tok_s": (total - 1) / span if span > 0 else None,
            "tpot_s": span / (total - 1) if total > 1 else None,
            "upstream_headers_s": ttft_s / 2,
            "chunks": chunks,
            "events": len(chunks) + 1,
            "reads": len(chunks) + 1,
            "multi_event_reads": 0,
            "keepalives": 0,
            "chunks_are_steps": chunks_are_steps,
            "flags": list(flags),
            "proxy_overhead_s": {"mean": 0.0001, "max": 0.0002, "count": len(chunks)},
            "spec": spec,
            "request": request,
            "response_text": response_text,
            "replay_of": replay_of,
        }
    )


def profile_records(
    conditional: Sequence[float],
    k: int,
    *,
    requests: int = 25,
    steps_per_request: int = 40,
    workload: str = "chat",
    label: str = "MTP-n3",
    step_s: float | None = None,
    base_step_s: float = 0.01,
    draft_cost: float = 0.2,
    gap_s: float = 1.0,
    **kw: Any,
) -> list[Record]:
    """``requests`` sequential requests whose pooled per-position acceptance follows ``conditional``. The step time
    follows the cost model: base_step_s * (1 + draft_cost * k) unless ``step_s`` is given."""
    step = step_s if step_s is not None else base_step_s * (1 + draft_cost * k)
    all_accepted = accepted_from_profile(conditional, k, requests * steps_per_request)
    out = []
    for i in range(requests):
        mine = all_accepted[i::requests]
        out.append(
            make_record(
                f"{label}-{workload}-{i}",
                accepted=mine,
                k=k,
                workload=workload,
                label=label,
                step_s=step,
                started_at=T0 + i * gap_s,
                **kw,
            )
        )
    return out


def baseline_records(
    *,
    requests: int = 25,
    steps: int = 40,
    workload: str = "chat",
    label: str = "Base",
    step_s: float = 0.01,
    gap_s: float = 1.0,
    **kw: Any,
) -> list[Record]:
    return [
        make_record(
            f"{label}-{workload}-{i}",
            plain_steps=steps,
            workload=workload,
            label=label,
            step_s=step_s,
            started_at=T0 + i * gap_s,
            **kw,
        )
        for i in range(requests)
    ]


def write_run(path: Path, records: Sequence[Record]) -> Path:
    path.write_bytes(b"".join(dumps(r) for r in records))
    return path
