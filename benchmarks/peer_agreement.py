"""What a peer benchmark client measured, request by request, against the proxy's records of the same requests.

    python -m benchmarks.peer_agreement RECORDS --guidellm gl.json [--guidellm ...]
    python -m benchmarks.peer_agreement RECORDS --aiperf ARTIFACT_DIR [--aiperf ...]

Runs of guidellm 0.8 (``--output kind=json``) are paired with records by ``response_id`` = ``upstream_id``; runs of
aiperf 0.13 (``profile_export.jsonl``) by start order within the run's time span. Per run: requests the client saw
succeed, how many of their records are ``ok``, how many have the client's token count, and the client's TTFT and
inter-token latency ((last - first) / (tokens - 1), as both compute it) minus the record's ``ttft_s`` and
``tpot_s``. ../shared/docs/field.md (beside the checkout) says how to drive both clients through the proxy here.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from specproxy.core.record import read_records


def _line(name: str, n: int, ok: int, tokens: int, dttft: list[float], ditl: list[float]) -> str:
    return (
        f"{name}: {n} succeeded at the client, {ok} records ok, {tokens} with the client's token count; TTFT client"
        f" - record p50 {statistics.median(dttft):+.2f} ms ({min(dttft):+.2f} to {max(dttft):+.2f}); ITL - TPOT p50"
        f" {statistics.median(ditl):+.3f} ms (largest {max(map(abs, ditl)):.3f})"
    )


def guidellm(path: Path, recs: dict[str, Any]) -> str:
    bench = json.loads(path.read_text())["benchmarks"][0]["requests"]
    ok, tokens, dttft, ditl = 0, 0, [], []
    for x in bench["successful"]:
        r, t = recs[x["response_id"]], x["info"]["timings"]
        n = x["output_metrics"]["text_tokens"]
        ok += r["outcome"] == "ok"
        tokens += n == r["completion_tokens"]
        dttft.append((t["first_token_iteration"] - t["request_start"]) * 1e3 - r["ttft_s"] * 1e3)
        if n > 1 and r["tpot_s"] is not None:
            ditl.append((t["last_token_iteration"] - t["first_token_iteration"]) / (n - 1) * 1e3 - r["tpot_s"] * 1e3)
    return _line(f"guidellm {path}", len(bench["successful"]), ok, tokens, dttft, ditl) + (
        f"; errored {len(bench['errored'])}, incomplete {len(bench['incomplete'])}"
    )


def aiperf(art: Path, by_start: list[Any]) -> str:
    rows = [json.loads(line) for line in (art / "profile_export.jsonl").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda x: x["metadata"]["request_start_ns"])
    t0 = rows[0]["metadata"]["request_start_ns"] / 1e9 - 0.5
    t1 = rows[-1]["metadata"]["request_end_ns"] / 1e9 + 0.5
    recs = [r for r in by_start if t0 <= r["started_at"] <= t1]
    if len(recs) != len(rows):
        return f"aiperf {art}: {len(rows)} requests but {len(recs)} records in their time span: cannot pair"
    ok, tokens, dttft, ditl = 0, 0, [], []
    for x, r in zip(rows, recs, strict=True):
        m = x["metrics"]
        ok += r["outcome"] == "ok"
        tokens += m.get("usage_completion_tokens", {}).get("value") == r["completion_tokens"]
        dttft.append(m["time_to_first_token"]["value"] - r["ttft_s"] * 1e3)
        if "inter_token_latency" in m and r["tpot_s"] is not None:
            ditl.append(m["inter_token_latency"]["value"] - r["tpot_s"] * 1e3)
    return _line(f"aiperf {art}", len(rows), ok, tokens, dttft, ditl)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer_agreement", description=__doc__.splitlines()[0])
    p.add_argument("records", type=Path)
    p.add_argument("--guidellm", type=Path, action="append", default=[])
    p.add_argument("--aiperf", type=Path, action="append", default=[])
    a = p.parse_args()
    # a proxy's shadows (--shadow) are its own requests to its candidates, not the client's: left out
    recs = [r for r in read_records(a.records) if r["upstream_id"] and r["shadow_of"] is None]
    print(
        f"{len(recs)} records: outcomes {dict(Counter(r['outcome'] for r in recs))}, workloads"
        f" {dict(Counter(r['workload'] for r in recs))}, token sources"
        f" {dict(Counter((r['token_source'], r['chunk_token_source']) for r in recs))}"
    )
    for g in a.guidellm:
        print(guidellm(g, {rid: r for r in recs if (rid := r["upstream_id"])}))
    by_start = sorted(recs, key=lambda r: r["started_at"] or 0.0)
    for d in a.aiperf:
        print(aiperf(d, by_start))


if __name__ == "__main__":
    main()
