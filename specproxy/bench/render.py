"""The bench's result as a plain table, or as JSON (the same figures, for scripts)."""

from __future__ import annotations

import json
from typing import Any


def _f(v: Any, fmt: str = "{:.2f}", signed: bool = False) -> str:
    if v is None:
        return "-"
    return (("+" if signed and v >= 0 else "") + fmt).format(v)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return [line(header), *(line(r) for r in rows)]


def _per_request(r: dict[str, Any], per_1000_key: str) -> float | None:
    """A figure per thousand events of a phase (a ``*_per_1000`` key) as milliseconds per request (stream)."""
    v = r.get(per_1000_key)
    return None if v is None or not r["streams"] else v * r["events"] / 1000 / r["streams"]


def _counts(row: dict[str, Any]) -> str:
    bad = sum(row["errors"].values()) + sum(v for k, v in row["statuses"].items() if k != "200")
    return f"{row['events']}/{row['expected']}" + (f" ({bad} failed)" if bad else "")


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "pass" if ok else "FAIL"


def _targets(result: dict[str, Any]) -> list[str]:
    if not result["targets"]:
        return []
    rows = [
        [
            t["target"],
            _f(t["value"], "{:.3g}"),
            ("≥ " if "chunks/s" in t["target"] else "≤ ") + f"{t['limit']:g}",
            "pass" if t["pass"] else "FAIL",
        ]
        for t in result["targets"]
    ]
    return ["", "targets", *_table(["", "measured", "target", ""], rows)]


def _relays_own(r: dict[str, Any]) -> tuple[float | None, float | None]:
    """specproxy's relay processes alone where it names them, else the relay's whole tree."""
    if r.get("relay_only_cores") is not None:
        return r["relay_only_cores"], r.get("relay_only_cpu_ms_per_1000")
    return r.get("relay_cores"), r.get("cpu_ms_per_1000")


def _role(cores: float | None, ms: float | None) -> str:
    return "-" if cores is None and ms is None else f"{_f(cores)} / {_f(ms, '{:.1f}')}"


def _vs_one(r: dict[str, Any], over: str = "") -> float | None:
    """A scaling row against its one-process self: specproxy's ``--workers 1``, or the splice in one process."""
    v = r.get("vs_workers_1" + over)
    return v if v is not None else r.get("vs_one_splice" + over)


def _window(sat: list[dict[str, Any]]) -> list[str]:
    """Saturation over the window in which every relay process has streams (chunks/s above, and the targets) beside the
    whole phase, with the cores each relay process used in the window."""
    if not any(r.get("window") for r in sat):
        return []
    rows = []
    for r in sat:
        w = r.get("window") or {}
        got = w.get("cores", {})
        each = [v for k, v in sorted(got.items()) if k.startswith("relay ")]
        rows.append(
            [
                r["relay"],
                _f(w.get("s"), "{:.2f}"),
                _f(r["chunks_per_s"] if w else None, "{:,.0f}"),
                _f(_vs_one(r) if w else None, "{:.2f}x"),
                _f(r.get("chunks_per_s_phase"), "{:,.0f}"),
                _f(_vs_one(r, "_phase"), "{:.2f}x"),
                _f(got.get("relay")) + (" (" + " ".join(_f(v) for v in each) + ")" if len(each) > 1 else ""),
                _f(got.get("upstream")),
            ]
        )
    return [
        "",
        "saturation over the window in which every relay process has streams (from the last stream's first event to"
        " the moment the first relay process has relayed all its streams; the targets' figure) and over the whole"
        " phase (first start to last event: its tail is the busiest relay's last streams); vs 1: against the same"
        " relay in one process (specproxy --workers 1, the splice in one); cores in use over the window",
        *_table(
            ["", "window s", "chunks/s", "vs 1", "phase chunks/s", "vs 1", "relays' cores (each)", "upstream"], rows
        ),
    ]


def _ceiling(bk: dict[str, Any] | None) -> list[str]:
    """The bookkeeper's ceiling, in words: between which relayed rates it stopped keeping up."""
    if not bk:
        return []
    kept, first = bk["last_sustained"], bk["first_behind"]

    def at(r: dict[str, Any]) -> str:
        return (
            f"{r['chunks_per_s']:,.0f} events/s ({r['relay']}, {r['streams']} streams, bookkeeper at"
            f" {_f(r['bookkeeping_cores'])} cores, {_f(r['bookkeeping_cpu_ms_per_1000'], '{:.1f}')} ms per 1,000"
            " events)"
        )

    lines = [""]
    if first is not None:
        why = (
            f"the relays shed {first['shed_chunks']} chunk events, {first['shed_requests']} of {first['streams']}"
            " records flagged"
            if first["behind"] == "shed"
            else f"nothing shed, but it was still working {_f(first['settle_s'], '{:.1f}')} s after the last event"
        )
        lines.append(f"bookkeeper ceiling: it falls behind at {at(first)}: {why}")
        lines.append(f"  highest rate it kept up with: {at(kept)}" if kept else "  it kept up with no phase measured")
    else:
        lines.append(f"bookkeeper ceiling: not reached; it kept up with {at(kept)}")
    if bk.get("events_per_bookkeeper_cpu_s"):
        lines.append(
            f"  at its CPU per event there, one full core takes {bk['events_per_bookkeeper_cpu_s']:,.0f} events/s"
            " (an estimate: its CPU per event falls as reads carry more events)"
        )
    return lines


def render_levels(result: dict[str, Any]) -> str:
    cfg = result["config"]
    out = [
        f"specproxy bench: {cfg['tokens']} events per stream at {cfg['steps_per_s']:g} steps/s, stamped at send by the"
        " upstream and subtracted on receipt; added = relay's percentile minus direct's, in the same run",
        result["sharing"],
        f"specproxy's per-event modules: {result.get('build', 'pure-Python')} (the rows not named pure-Python)",
        *(f"note: {n}" for n in result["notes"]),
    ]
    header = [
        "",
        "events",
        "p50 ms",
        "p99 ms",
        "added p50",
        "added p99",
        "TTFT p50",
        "TTFT added",
        "CPU ms/1k",
        "relay ms/1k",
        "vs nginx",
        "relay vs nginx",
        "KiB/stream",
    ]
    for level in result["levels"]:
        rows = [
            [
                r["relay"],
                _counts(r),
                _f(r["lat_p50_ms"], "{:.3f}"),
                _f(r["lat_p99_ms"], "{:.3f}"),
                _f(r.get("added_p50_ms"), "{:.3f}", True) if r["relay"] != "direct" else "",
                _f(r.get("added_p99_ms"), "{:.3f}", True) if r["relay"] != "direct" else "",
                _f(r["ttft_p50_ms"]),
                _f(r.get("ttft_added_ms"), signed=True) if r["relay"] != "direct" else "",
                _f(r["cpu_ms_per_1000"], "{:.1f}"),
                _f(r.get("relay_only_cpu_ms_per_1000"), "{:.1f}"),
                _f(r.get("cpu_vs_nginx"), "{:.2f}x"),
                _f(r.get("relay_only_vs_nginx"), "{:.2f}x"),
                _f(r["mem_per_stream_kib"], "{:.1f}"),
            ]
            for r in level["rows"]
        ]
        out += ["", f"{level['streams']} streams", *_table(header, rows)]
    burst = result.get("burst") or []
    if burst:
        rows = [
            [
                r["relay"],
                _counts(r),
                _f(r["ttft_p50_ms"]),
                _f(r.get("ttft_p99_ms")),
                _f(r.get("ttft_added_ms"), signed=True) if r["relay"] != "direct" else "",
                _f(r.get("ttft_added_p99_ms"), signed=True) if r["relay"] != "direct" else "",
                _f(r.get("added_p50_ms"), "{:.3f}", True) if r["relay"] != "direct" else "",
                _f(r.get("added_p99_ms"), "{:.3f}", True) if r["relay"] != "direct" else "",
                _f(_per_request(r, "cpu_ms_per_1000"), "{:.3f}"),
                _f(_per_request(r, "relay_only_cpu_ms_per_1000"), "{:.3f}"),
                _f(_per_request(r, "bookkeeping_cpu_ms_per_1000"), "{:.3f}"),
            ]
            for r in burst
        ]
        header = ["", "events", "TTFT p50", "TTFT p99", "TTFT added", "added p99", "event added p50", "p99"]
        out += [
            "",
            f"burst: {burst[0]['streams']} streams started at once, {result['config']['burst_tokens']} events each;"
            " CPU ms per request: the relay's whole process tree, its relay processes, its bookkeeping",
            *_table([*header, "CPU/req", "relay/req", "bookkeeping/req"], rows),
        ]
    sat = result["saturation"]
    if sat:
        s0 = sat[0]
        rows = [
            [
                r["relay"],
                _counts(r),
                _f(r["chunks_per_s"], "{:,.0f}"),
                _f(r["chunks_per_cpu_s"], "{:,.0f}"),
                _f(r["cpu_ms_per_1000"], "{:.1f}"),
                _f(r.get("cpu_vs_nginx"), "{:.2f}x"),
                _f(r.get("relay_only_cpu_ms_per_1000"), "{:.1f}"),
                _f(r.get("bookkeeping_cpu_ms_per_1000"), "{:.1f}"),
                _f(r.get("relay_only_vs_nginx"), "{:.2f}x"),
            ]
            for r in sat
        ]
        scaling = [r for r in sat if r.get("workers") is not None]
        if len(scaling) > 1 or any(r.get("upstream_cores") is not None for r in sat):
            out += [
                "",
                "saturation by role: cores in use (CPU-seconds per second of the phase) and CPU ms per 1,000 events;"
                " shed = chunk events the relays shed for the bookkeeping",
                *_table(
                    ["", "chunks/s", "vs 1", "upstream", "client", "relays", "bookkeeper", "shed", "shed reqs"],
                    [
                        [
                            r["relay"],
                            _f(r["chunks_per_s"], "{:,.0f}"),
                            _f(_vs_one(r), "{:.2f}x"),
                            _role(r.get("upstream_cores"), r.get("upstream_cpu_ms_per_1000")),
                            _role(r.get("client_cores"), r.get("client_cpu_ms_per_1000")),
                            _role(*_relays_own(r)),
                            _role(r.get("bookkeeping_cores"), r.get("bookkeeping_cpu_ms_per_1000")),
                            _f(r.get("shed_chunks"), "{:d}"),
                            _f(r.get("shed_requests"), "{:d}"),
                        ]
                        for r in sat
                    ],
                ),
            ]
        out += _window(sat)
        out += _ceiling(result.get("bookkeeper"))
        out += [
            "",
            f"saturation: {s0['streams']} streams, unpaced upstream (relay CPU: its whole process tree)",
            *_table(
                [
                    "",
                    "events",
                    "chunks/s",
                    "chunks/s per core",
                    "CPU ms/1k",
                    "CPU vs nginx",
                    "relay ms/1k",
                    "bookkeeping ms/1k",
                    "relay vs nginx",
                ],
                rows,
            ),
        ]
    cap = result["client_capacity"]
    out += [
        "",
        f"load generator: {_f(cap['chunks_per_s_per_process'], '{:,.0f}')} chunks/s per client process"
        f" against the static upstream (floor {cap['floor']:,}: {'pass' if cap['pass'] else 'FAIL'})",
    ]
    out += _targets(result)
    failures = {k: v for level in result["levels"] for r in level["rows"] for k, v in r["error_examples"].items()}
    out += [f"client error {k}: {v}" for k, v in failures.items()]
    return "\n".join(out)


def render_hostile(result: dict[str, Any]) -> str:
    out = [
        f"specproxy bench --hostile: {result['streams']} streams through the proxy and {result['streams']} direct at"
        f" {result['steps_per_s']:g} steps/s while one hostile input arrives; gap = largest inter-event gap of any"
        " relayed stream minus the largest of any direct stream",
        result["sharing"],
        *(f"note: {n}" for n in result["notes"]),
        "",
    ]
    rows = []
    for r in result["inputs"]:
        rows.append(
            [
                r["input"],
                _f(r["gap_added_ms"], "{:.1f}", True),
                _verdict(r["gap_pass"]),
                _f(r["rss_peak_mb"], "{:.0f}"),
                _verdict(r["rss_pass"]),
                r["status"],
                _verdict(r["answered"]),
                _counts(r),
            ]
        )
    out += _table(
        ["input", "gap added ms", "≤ 50", "peak RSS MB", "< 400", "hostile request got", "answered", "relayed events"],
        rows,
    )
    return "\n".join(out)


def as_json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=1)
