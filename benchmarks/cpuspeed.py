"""Is this machine's speed per CPU steady enough to measure scaling over cores? A pinned loop on k CPUs at once.

    python -m benchmarks.cpuspeed --cpus 15,14,13,12,11,10,9,8 --counts 1,2,4,8 --seconds 5 --rounds 2

For each count k, the same pure-Python loop (no memory traffic to speak of, no system calls) runs back to back on the
first k CPUs of ``--cpus``, one process pinned to each, for ``--seconds``; each CPU's median time per loop is printed.
On a machine whose cores are its own the figures are flat: the same at k = 1 as at k = 8. Where they are not, a
ratio of chunks/s between ``specproxy bench --workers 1`` and ``--workers 4`` measures the machine as much as the
relays: on a virtual machine whose CPUs are threads of a host shared with other work, a CPU runs at full speed or at
half (a busy sibling thread), and the host's load moves from one minute to the next. ``--workers N`` can only scale
as far as N of these CPUs, busy together with the load's, run as fast as one did alone.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence

from specproxy.core.stats import median

LOOP = 700_000  # iterations: a pass of tens of milliseconds, long enough to time, short enough to repeat


def one_loop() -> float:
    """Milliseconds for one pass of the loop."""
    t = time.perf_counter()
    s = 0
    for i in range(LOOP):
        s += i * i % 7
    return (time.perf_counter() - t) * 1000.0


def _pinned(cpu: int, seconds: float, out: mp.SimpleQueue) -> None:  # type: ignore[type-arg]
    os.sched_setaffinity(0, {cpu})
    end = time.monotonic() + seconds
    times = [one_loop()]
    while time.monotonic() < end:
        times.append(one_loop())
    out.put((cpu, median(times)))


def medians(cpus: Sequence[int], seconds: float) -> dict[int, float]:
    """Each CPU's median time per loop (ms) with the loop running on all of ``cpus`` at once."""
    ctx = mp.get_context("fork")
    out: mp.SimpleQueue = ctx.SimpleQueue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_pinned, args=(c, seconds, out)) for c in cpus]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    got: dict[int, float] = {}
    while not out.empty():
        cpu, ms = out.get()
        got[cpu] = ms
    return {c: got[c] for c in cpus if c in got}


def _ints(text: str) -> list[int] | None:
    """Comma-separated integers of 0 or more; None for anything else."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return None
    return values if values and min(values) >= 0 else None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpuspeed", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpus", default=None, help="CPUs in the order they are taken (default: all this process may use)")
    p.add_argument("--counts", default="1,2,4,8", help="how many of them run the loop at once, comma-separated")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds per count")
    p.add_argument("--rounds", type=int, default=1, help="times over the counts")
    a = p.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    cpus = _ints(a.cpus) if a.cpus else allowed
    counts = _ints(a.counts)
    if cpus is None or counts is None:
        print("error: --cpus and --counts take comma-separated integers of 0 or more", file=sys.stderr)
        return 2
    if missing := sorted(set(cpus) - set(allowed)):
        print(
            f"error: --cpus: CPUs {missing} are not available to this process (it may use {allowed})", file=sys.stderr
        )
        return 2
    if max(counts) > len(cpus) or min(counts) < 1:
        print(f"error: --counts must lie within 1..{len(cpus)} (the CPUs given)", file=sys.stderr)
        return 2
    if a.seconds <= 0 or a.rounds < 1:
        print("error: --seconds must be above 0 and --rounds at least 1", file=sys.stderr)
        return 2
    print(f"median ms per loop of {LOOP:,} iterations, each CPU; the loop runs on k CPUs at once")
    for r in range(1, a.rounds + 1):
        for k in counts:
            got = medians(cpus[:k], a.seconds)
            each = " ".join(f"{c}:{m:.0f}" for c, m in got.items())
            values = sorted(got.values())
            spread = f"slowest/fastest {values[-1] / values[0]:.2f}" if values else ""
            print(f"round {r} k={k:<3d} {each}   {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
