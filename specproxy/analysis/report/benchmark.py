"""How fast, and in how much memory, ``specproxy report`` reads N records: the streaming pass over the file against
the records read whole into memory first and then given to the same pass (as ``run``'s summary and ``matrix`` give
them), side by side, on a synthetic file written as the sink writes it.

    python -m specproxy.analysis.report.benchmark 1000000     # writes /tmp/specproxy-bench/records-1000000.jsonl once
    python -m specproxy.analysis.report.benchmark 100000 --old-max 100000 --files 4 --compress gz,zst,,

Each side runs in a fresh process (so peak RSS is its own: ``ru_maxrss``) and writes the report as JSON; the table
gives wall time, CPU time and peak RSS per side and the largest relative difference between the two reports'
figures (0 when every group is small enough for exact quantiles; at most the sketch's relative error otherwise). The
in-memory side needs many times the memory per record, so it is skipped above ``--old-max`` records.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from specproxy.analysis.figures.sketch import RELATIVE_ERROR
from specproxy.analysis.inputs.synth import write_synth
from specproxy.analysis.report import render
from specproxy.analysis.report.accum import build_report


def _old(path: Path) -> dict[str, Any]:
    """Today's reference: every record in memory (read as before; compressed rotations need the new reader), then
    the report."""
    from specproxy.analysis.inputs.runs import read_runs
    from specproxy.core.record import read_records

    plain = not any(path.parent.glob(path.name + ".*"))
    records = list(read_records(path)) if plain else [item.full() for item in read_runs([path])]
    return render.report_json(build_report(records))


def _new(path: Path) -> dict[str, Any]:
    from specproxy.analysis.inputs.runs import read_runs, worth_a_second_process
    from specproxy.analysis.report.accum import stream_report

    report, _ = stream_report(read_runs([path]), parallel=worth_a_second_process([path]))
    return render.report_json(report)


def _child(side: str, path: Path, out: Path) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    doc = (_old if side == "old" else _new)(path)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker = resource.getrusage(resource.RUSAGE_CHILDREN)  # the chunk process, when the input was big enough
    out.write_text(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "rss_mb": rss_mb,
                "worker_cpu_s": worker.ru_utime + worker.ru_stime,
                "worker_rss_mb": worker.ru_maxrss / 1024,
                "report": doc,
            }
        )
    )


def _run(side: str, path: Path, work: Path) -> dict[str, Any]:
    out = work / f"{side}.json"
    subprocess.run(
        [sys.executable, "-m", "specproxy.analysis.report.benchmark", "--child", side, str(path), str(out)], check=True
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def max_rel_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest relative difference between two report JSONs' figure values (inf if their groups differ)."""
    worst = 0.0
    if [g["key"] for g in a["groups"]] != [g["key"] for g in b["groups"]]:
        return float("inf")
    for ga, gb in zip(a["groups"], b["groups"], strict=True):
        for name, fa in ga["figures"].items():
            x, y = fa["value"], gb["figures"][name]["value"]
            if x is None or y is None:
                worst = worst if x is y else float("inf")
            elif x != y:
                worst = max(worst, abs(x - y) / abs(x) if x else float("inf"))
    return worst


def _table(n: int, size: int, rows: list[tuple[str, dict[str, Any] | None]], diff: float | None) -> str:
    lines = [f"records: {n:,}   file: {size / 1e6:,.0f} MB   cores: {os.cpu_count()}   load: {os.getloadavg()[0]:.1f}"]
    lines.append(f"{'side':<10}{'wall s':>10}{'cpu s':>10}{'peak RSS MB':>14}{'worker cpu s':>14}{'worker RSS MB':>15}")
    for side, r in rows:
        if r is None:
            lines.append(f"{side:<10}{'skipped (--old-max)':>34}")
        else:
            worker = (
                f"{r['worker_cpu_s']:>14.1f}{r['worker_rss_mb']:>15.0f}"
                if r["worker_rss_mb"]
                else f"{'-':>14}{'-':>15}"
            )
            lines.append(f"{side:<10}{r['wall_s']:>10.1f}{r['cpu_s']:>10.1f}{r['rss_mb']:>14.0f}{worker}")
    if diff is not None:
        lines.append(f"largest relative difference of a figure: {diff:.2%} (sketch bound {RELATIVE_ERROR:.1%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m specproxy.analysis.report.benchmark", description=__doc__.split("\n")[0]
    )
    ap.add_argument("n", type=int, nargs="?", default=100_000, help="records (default 100000)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "specproxy-bench")
    ap.add_argument("--old-max", type=int, default=200_000, help="skip the in-memory side above this many records")
    ap.add_argument("--files", type=int, default=1, help="split into this many rotations")
    ap.add_argument("--compress", default="", help="per rotation, oldest first: gz, zst or empty, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", nargs=3, metavar=("SIDE", "PATH", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return 0
    if args.n < 1 or args.files < 1:
        print("benchmark: N and --files must be at least 1", file=sys.stderr)
        return 2
    compress = tuple(args.compress.split(",")) if args.compress else ()
    tag = f"{args.n}-s{args.seed}-f{args.files}" + (f"-{'_'.join(compress)}" if compress else "")
    work = args.dir / tag
    path = work / "records.jsonl"
    done = work / "complete"
    if not done.exists():
        work.mkdir(parents=True, exist_ok=True)
        print(f"writing {args.n:,} records to {work} ...", file=sys.stderr)
        write_synth(path, args.n, seed=args.seed, files=args.files, compress=compress)
        done.write_text("")
    size = sum(p.stat().st_size for p in work.glob("records.jsonl*"))
    new = _run("new", path, work)
    old = _run("old", path, work) if args.n <= args.old_max else None
    diff = max_rel_diff(old["report"], new["report"]) if old is not None else None
    print(_table(args.n, size, [("old", old), ("new", new)], diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
