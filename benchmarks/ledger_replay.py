"""Counter attribution replayed offline: capture what a run told its ledger, then share it out again, against the
server's own per-request figures.

    python -m benchmarks.ledger_replay capture run.log -- --target http://127.0.0.1:8000 --workload ja_chat,code_agent \
        --requests 16 --concurrency 4 --max-tokens 64 --model smollm2 --metrics-url http://127.0.0.1:8000/metrics \
        --k 3 --out run.jsonl --no-progress
    python -m benchmarks.ledger_replay replay run.log run.jsonl

``capture`` runs ``specproxy run`` (the arguments after ``--``) with every call the load generator's recorder makes
on its :class:`~specproxy.attribution.ledger.CounterLedger` written to a file. With ``--counters-pacing`` before the
``--`` it scrapes as it would if the engine gave no per-request figures (a scrape as each request ends), while the
records keep the engine's figures as the truth: the intervals of a counters-only deployment. ``replay`` feeds those
calls to a fresh ledger and prints, per workload, the counters-only acceptance against the server's (the records need
an engine that gives per-request figures: vLLM with ``--per-request-spec-decode-metrics``), three ways:

- ``at end``: each request shared out with the models as they stood when it ended (a record not held);
- ``held``: every request shared out with the final models (records held for a stable model);
- ``true rates``: each interval's hidden drafts shared by the server's own per-request drafting rates: what the
  chunk-to-interval cut allows at best, whatever the models.

What it read on the real CPU vLLM and on the simulator: docs/bench.md.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from typing import Any

from specproxy.attribution import ledger as ledger_module
from specproxy.attribution.intervals import Interval
from specproxy.core.prom import SpecCounters

CALLS = ("begin", "record_chunk", "end", "baseline", "settle", "pop")
DELTA_FIELDS = ("accepted", "drafts", "draft_tokens", "per_position", "decode_steps")


def capture(log_path: str, run_args: list[str], *, counters_pacing: bool = False) -> None:
    if counters_pacing:  # scrape as if no request carried the engine's own figures (they are kept as the truth)
        from specproxy.recorder.scraper import Scraper

        told = Scraper.request_figures
        Scraper.request_figures = lambda self, own: told(self, False)  # type: ignore[method-assign]
    out = open(log_path, "w")  # noqa: SIM115 - open for the whole run, closed by the interpreter's exit
    for name in CALLS:
        original = getattr(ledger_module.CounterLedger, name)

        def logged(self: Any, *a: Any, _name: str = name, _original: Any = original, **k: Any) -> Any:
            args = list(a)
            if _name == "settle":
                args[1] = {f: getattr(args[1], f) for f in DELTA_FIELDS}
            out.write(json.dumps([_name, args, k]) + "\n")
            return _original(self, *a, **k)

        setattr(ledger_module.CounterLedger, name, logged)
    from specproxy.cli import main

    sys.argv = ["specproxy", "run", *run_args]
    main()


def _truth(records_path: str) -> dict[str, tuple[str, dict[str, Any], dict[str, Any]]]:
    out = {}
    with open(records_path) as f:
        lines = f.readlines()
    for line in lines:
        rec = json.loads(line)
        server = ((rec.get("spec") or {}).get("estimates") or {}).get("server")
        if rec["path"].endswith("/completions") and server:
            out[rec["request_id"]] = (rec["workload"], server, rec)
    return out


def _replay(log_path: str, *, held: bool) -> tuple[Any, dict[str, Any]]:
    led = ledger_module.CounterLedger()
    popped: dict[str, Any] = {}
    waiting: list[str] = []
    with open(log_path) as f:
        lines = f.readlines()
    for line in lines:
        name, args, kw = json.loads(line)
        if name == "settle":
            delta: dict[str, Any] = {f: tuple(v) if f == "per_position" else v for f, v in args[1].items()}
            args[1] = SpecCounters("vllm", **delta)
        if name == "pop" and held:
            waiting.append(args[0])
            continue
        got = getattr(led, name)(*args, **kw)
        if name == "pop":
            popped[args[0]] = got
    for rid in waiting:
        popped[rid] = led.pop(rid)
    return led, popped


def _errors(truth: dict[str, tuple[str, dict[str, Any], dict[str, Any]]], drafts_of: Any) -> dict[str, float]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for rid, (workload, server, rec) in truth.items():
        got = drafts_of(rid, rec)
        if got is None:
            continue
        accepted, draft_tokens = got
        s = sums[workload]
        s[0] += server["accepted"]
        s[1] += server["draft_tokens"]
        s[2] += accepted
        s[3] += draft_tokens
    return {w: round(100 * (s[2] / s[3] - s[0] / s[1]), 1) for w, s in sorted(sums.items()) if s[1] and s[3]}


def replay(log_path: str, records_path: str) -> None:
    truth = _truth(records_path)

    def counted(popped: dict[str, Any]) -> Any:
        def of(rid: str, _rec: dict[str, Any]) -> tuple[float, float] | None:
            got = popped.get(rid)
            return None if got is None else (got.estimate.counts.accepted, got.estimate.counts.draft_tokens)

        return of

    _, at_end = _replay(log_path, held=False)
    led, held = _replay(log_path, held=True)
    print("at end    ", _errors(truth, counted(at_end)))
    print("held      ", _errors(truth, counted(held)), "final drafting fit", led.drafting.weights())
    # the true rates: every interval's hidden drafts shared by each member's own hidden drafts per one-token step
    intervals: list[Interval] = []

    class Kept(Interval):
        __slots__ = ()

        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            intervals.append(self)

    ledger_module.Interval = Kept  # type: ignore[attr-defined]
    try:
        _replay(log_path, held=True)
    finally:
        ledger_module.Interval = Interval  # type: ignore[attr-defined]
    hidden: dict[str, float] = {}
    unknown: dict[str, float] = defaultdict(float)
    for iv in intervals:
        for rid, act in iv.members.items():
            unknown[rid] += act.unknown
    for rid, (_, server, rec) in truth.items():
        multi = sum(1 for _, n in rec["chunks"][1:] if n > 1)
        hidden[rid] = max(0.0, server["drafts"] - multi)
    shared: dict[str, float] = defaultdict(float)
    for iv in intervals:
        rest = iv.delta.drafts - iv.known_drafted
        weights = {r: a.unknown * hidden.get(r, 0.0) / unknown[r] for r, a in iv.members.items() if unknown[r] > 0}
        total = sum(weights.values())
        for r, a in iv.members.items():
            shared[r] += a.known_drafted + (rest * weights.get(r, 0.0) / total if total > 0 else 0.0)

    def oracle(rid: str, rec: dict[str, Any]) -> tuple[float, float] | None:
        server = truth[rid][1]
        k = server["draft_tokens"] / server["drafts"] if server["drafts"] else 0
        return (server["accepted"], shared[rid] * k) if rid in shared else None

    print("true rates", _errors(truth, oracle))


def main() -> int:
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "capture" and args[2] == "--":
        capture(args[1], args[3:])
        return 0
    if len(args) >= 4 and args[0] == "capture" and args[2:4] == ["--counters-pacing", "--"]:
        capture(args[1], args[4:], counters_pacing=True)
        return 0
    if len(args) == 3 and args[0] == "replay" and all(os.path.exists(a) for a in args[1:]):
        replay(args[1], args[2])
        return 0
    sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
