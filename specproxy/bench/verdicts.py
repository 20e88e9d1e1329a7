"""What a bench run's figures conclude: the task's targets, each passed or failed, and the bookkeeper's ceiling (the
event rate at which the relays start shedding). Pure: the run's rows in, verdicts out."""

from __future__ import annotations

from typing import Any

from specproxy.bench.window import MIN_WINDOW_S

CEILING_MIN_SPAN_S = 1.0  # a shorter phase fits in the relays' buffers: it says nothing of a sustained rate

LAG_S = 2.5  # the bookkeeping still working this long after the last event: it did not keep up


def _over_phase(r: dict[str, Any]) -> float:
    """The rate the bookkeeper was given: events over the whole phase (at saturation ``chunks_per_s`` is over a
    window of it)."""
    rate = r.get("chunks_per_s_phase")
    return float(rate if rate is not None else r["chunks_per_s"])


def bookkeeper_ceiling(phases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the bookkeeper stops keeping up, from every phase of specproxy (paced levels, burst, saturation) of at
    least ``CEILING_MIN_SPAN_S``, by the event rate relayed: the highest rate it sustained (nothing shed, caught up
    within ``LAG_S`` of the last event) and the lowest it did not (the relays shed, or it was still behind), with
    its cores and CPU per event at each; and what one full core would take at its CPU per event at the highest
    sustained rate (an estimate, not a reading)."""
    rows = sorted(
        (
            r
            for r in phases
            if r.get("workers") is not None
            and r.get("shed_chunks") is not None
            and r["chunks_per_s"]
            and r.get("span_s", 0.0) >= CEILING_MIN_SPAN_S
        ),
        key=_over_phase,
    )
    if not rows:
        return None

    def behind(r: dict[str, Any]) -> str | None:
        if r["shed_chunks"] or r["shed_requests"]:
            return "shed"
        return "lagging" if (r.get("settle_s") or 0.0) > LAG_S else None

    first = next((r for r in rows if behind(r)), None)
    kept = [r for r in rows if not behind(r)]
    last = max(kept, key=_over_phase) if kept else None

    def at(r: dict[str, Any] | None) -> dict[str, Any] | None:
        if r is None:
            return None
        return {
            "relay": r["relay"],
            "workers": r["workers"],
            "streams": r["streams"],
            "chunks_per_s": _over_phase(r),
            "bookkeeping_cores": r["bookkeeping_cores"],
            "bookkeeping_cpu_ms_per_1000": r["bookkeeping_cpu_ms_per_1000"],
            "shed_chunks": r["shed_chunks"],
            "shed_requests": r["shed_requests"],
            "settle_s": r.get("settle_s"),
            "behind": behind(r),
        }

    est = None
    if last is not None and last["bookkeeping_cpu_ms_per_1000"]:
        est = 1e6 / last["bookkeeping_cpu_ms_per_1000"]  # events per CPU-second of the bookkeeper
    return {
        "shedding": any(behind(r) == "shed" for r in rows),
        "last_sustained": at(last),
        "first_behind": at(first),
        "events_per_bookkeeper_cpu_s": est,
    }


def compare_saturation(saturation: list[dict[str, Any]]) -> str | None:
    """Each saturation row against nginx's CPU per event (``cpu_vs_nginx``, ``relay_only_vs_nginx``) and against
    ``--workers 1``'s chunks/s (``vs_workers_1``: over the window in which every relay process has streams, where
    each row has one; ``vs_workers_1_phase``: over the whole phase); each splice floor's against the splice in one
    process (``vs_one_splice``, ``vs_one_splice_phase``): the scaling of the least a relay can do, on the same
    machine and load. Returns a note when a row has no window."""
    for row in saturation[1:]:
        row["cpu_vs_nginx"] = row["relay_only_vs_nginx"] = None
    ng = next((r for r in saturation if r["relay"].startswith("nginx")), None)
    if ng and ng["cpu_ms_per_1000"]:
        for row in saturation[1:]:
            if row["cpu_ms_per_1000"] is not None:
                row["cpu_vs_nginx"] = row["cpu_ms_per_1000"] / ng["cpu_ms_per_1000"]
            if row["relay_only_cpu_ms_per_1000"] is not None:
                row["relay_only_vs_nginx"] = row["relay_only_cpu_ms_per_1000"] / ng["cpu_ms_per_1000"]
    for by, key in (("workers", "vs_workers_1"), ("splices", "vs_one_splice")):
        one = next((r for r in saturation if r.get(by) == 1), None)
        for row in saturation:
            for over, field in (("", "chunks_per_s"), ("_phase", "chunks_per_s_phase")):
                a, b = row.get(field), one.get(field) if one else None
                row[key + over] = a / b if a is not None and b and row.get(by) is not None else None
    short = [r["relay"] for r in saturation if r.get("window") is None]
    if not short:
        return None
    return (
        f"saturation: no window of at least {MIN_WINDOW_S} s in which every relay process had streams for"
        f" {', '.join(short)} (one relay process ended all its streams before the last stream was sent;"
        " raise --saturation-tokens): their chunks/s is over the whole phase, which ends with the tail of the"
        " busiest relay's streams"
    )


IDLE_SPLICE_CORES = 0.5  # a splice process using less than this at saturation is held by the load, not its core


def splice_notes(saturation: list[dict[str, Any]]) -> list[str]:
    """A note for each splice floor at saturation whose processes used under :data:`IDLE_SPLICE_CORES` a core each:
    the load (most often the client, taking each upstream write as it came) set its rate, so its ratio against the
    splice in one process says nothing of how a relay scales."""
    out = []
    for r in saturation:
        n, cores = r.get("splices"), r.get("relay_cores")
        if n and cores is not None and cores < IDLE_SPLICE_CORES * n:
            out.append(
                f"{r['relay']}: its {n} process{'es' if n > 1 else ''} used {cores:.2f} cores at saturation, so the"
                " load, not the splice, set its chunks/s; its ratio is no floor for --workers scaling here"
                " (docs/bench.md, --floors)"
            )
    return out


def level_vs_nginx(level: list[dict[str, Any]]) -> None:
    """Each row of a paced level against nginx's CPU per event at that level (``cpu_vs_nginx``: the whole process
    tree; ``relay_only_vs_nginx``: specproxy's relay processes alone), where nginx has a row with CPU."""
    ng = next((r for r in level if r["relay"].startswith("nginx")), None)
    base = ng["cpu_ms_per_1000"] if ng else None
    for row in level:
        whole, relay = row.get("cpu_ms_per_1000"), row.get("relay_only_cpu_ms_per_1000")
        row["cpu_vs_nginx"] = whole / base if base and whole is not None else None
        row["relay_only_vs_nginx"] = relay / base if base and relay is not None else None


WHOLE_VS_NGINX = 1.5  # specproxy's whole process tree (relays and bookkeeping): CPU per chunk against nginx's
RELAY_VS_NGINX = 1.0  # its relay processes alone

SCALING_TARGETS = {2: 1.8, 4: 3.5}  # --workers N: at least this many times --workers 1's chunks/s at saturation


def targets(levels: list[dict[str, Any]], saturation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's targets, each with the measured value and pass or fail."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, limit: float, higher_is_better: bool = False) -> None:
        ok = value is not None and (value >= limit if higher_is_better else value <= limit)
        out.append({"target": name, "value": value, "limit": limit, "pass": ok})

    spec = [r for r in saturation if r["relay"].startswith("specproxy")]
    for level in levels:
        for row in level["rows"]:
            if not row["relay"].startswith("specproxy"):
                continue
            if level["streams"] == 256:
                add(f"{row['relay']}: added p50 at 256 streams (ms)", row["added_p50_ms"], 0.3)
                add(f"{row['relay']}: added p99 at 256 streams (ms)", row["added_p99_ms"], 2.0)
                if row.get("cpu_vs_nginx") is not None and row.get("workers") == 1:
                    add(f"{row['relay']}: CPU per chunk at 256 streams / nginx's", row["cpu_vs_nginx"], WHOLE_VS_NGINX)
                if row.get("relay_only_vs_nginx") is not None and row.get("workers") == 1:
                    add(
                        f"{row['relay']}: relay processes' CPU per chunk at 256 streams / nginx's",
                        row["relay_only_vs_nginx"],
                        RELAY_VS_NGINX,
                    )
            if level is levels[-1] and level["streams"] >= 64:
                add(
                    f"{row['relay']}: memory per stream at {level['streams']} streams (KiB)",
                    row["mem_per_stream_kib"],
                    64.0,
                )
    # the first specproxy row, and the pure-Python one beside a compiled install's (bench/run.py, --floors)
    for row in [r for i, r in enumerate(spec) if i == 0 or r["relay"].endswith("(pure-Python)")]:
        if row.get("cpu_vs_nginx") is not None:
            add(f"{row['relay']}: CPU per chunk / nginx's (all processes)", row["cpu_vs_nginx"], WHOLE_VS_NGINX)
        if row.get("relay_only_vs_nginx") is not None:
            add(f"{row['relay']}: CPU per chunk / nginx's (the relay process)", row["relay_only_vs_nginx"], 1.0)
    one = next((r for r in spec if r.get("workers") == 1), None)
    for row in spec:
        n = row.get("workers")
        if one is None or n is None or n == 1 or not one["chunks_per_s"] or row["chunks_per_s"] is None:
            continue
        limit = SCALING_TARGETS.get(n, 1.8 if len(spec) == 2 else None)  # one N beside 1: two workers' target
        if limit is not None:
            add(
                f"{row['relay']} / --workers 1: chunks/s at saturation",
                row["chunks_per_s"] / one["chunks_per_s"],
                limit,
                higher_is_better=True,
            )
    return out
