"""What the counter ledger costs the bookkeeper when many requests overlap: CPU of settling and of sharing out.

    python -m benchmarks.ledger_cost --streams 256 --steps 150

``--streams`` requests decode side by side, one chunk per step each at 25 steps/s, with a scrape every 250 ms whose
delta is made up (every step drafted k = 3, half of the requests' steps bring one token, a quarter two, a quarter
four; a third of the requests without exact counts), then every request ends and is popped, as the recorder does.
Prints the CPU seconds of the chunks, the settles and the pops. Pure: no sockets, no clock but the CPU's.

``--churn N``: each request ends after N steps (the first ones staggered) and a new one takes its place, so that
requests end in every interval, as in a steady load.

``--ngram``: a step drafts only sometimes (every multi-token step, a third of the one-token ones), so the drafts
hidden in one-token steps are shared by the drafting model; its refit (once per settled interval while requests end)
is timed on its own too.
"""

from __future__ import annotations

import argparse
import random
import time

from specproxy.attribution.ledger import CounterLedger
from specproxy.core.prom import SpecCounters

STEP_NS = 40_000_000  # 25 steps/s
SCRAPE_NS = 250_000_000


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ledger_cost", description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--ngram", action="store_true", help="draft on some steps only")
    p.add_argument("--churn", type=int, default=0, help="steps of a request before a new one takes its place")
    a = p.parse_args()
    rng = random.Random(0)
    led = CounterLedger()
    ids = [f"r{i}" for i in range(a.streams)]
    for i, rid in enumerate(ids):
        led.begin(rid, "code" if i % 2 else "ja")
    cpu = {"chunks": 0.0, "settle": 0.0, "pop": 0.0}
    acc = [0.0, 0.0, 0.0, 0.0]  # accepted, drafts, draft tokens, decode steps since the last scrape
    pos = [0.0, 0.0, 0.0]
    next_scrape = SCRAPE_NS
    # the step each stream's request started at: staggered, so that with --churn requests end in every interval
    began = [-(i * a.churn // max(1, a.streams)) for i in range(a.streams)]
    ended = 0
    for step in range(a.steps):
        t_ns = step * STEP_NS
        if t_ns >= next_scrape:
            c0 = time.process_time()
            led.settle(t_ns, SpecCounters("vllm", acc[1], acc[2], acc[0], tuple(pos), decode_steps=acc[3]))
            cpu["settle"] += time.process_time() - c0
            acc, pos, next_scrape = [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0], next_scrape + SCRAPE_NS
        c0 = time.process_time()
        for i, rid in enumerate(ids):
            decode = step > max(0, began[i])
            n = rng.choice((1, 1, 2, 4)) if decode else 1
            led.record_chunk(rid, n, t_ns + i, exact=i % 3 != 0, decode=decode)
            if decode:
                drafted = not a.ngram or n > 1 or rng.random() < 1 / 3
                acc[0] += n - 1
                acc[1] += drafted
                acc[2] += 3 * drafted
                acc[3] += 1
                for j in range(n - 1):
                    pos[j] += 1
        cpu["chunks"] += time.process_time() - c0
        if a.churn:
            c0 = time.process_time()
            for i, rid in enumerate(ids):
                if step - began[i] >= a.churn:
                    led.end(rid)
                    led.pop(rid)
                    ended += 1
                    ids[i] = f"r{i}.{step}"
                    led.begin(ids[i], "code" if i % 2 else "ja")
                    began[i] = step + 1
            cpu["pop"] += time.process_time() - c0
    end_ns = a.steps * STEP_NS
    c0 = time.process_time()
    led.settle(end_ns, SpecCounters("vllm", acc[1], acc[2], acc[0], tuple(pos), decode_steps=acc[3]))
    cpu["settle"] += time.process_time() - c0
    c0 = time.process_time()
    for rid in ids:
        led.end(rid)
        got = led.pop(rid)
        assert got is not None or a.churn  # (a request that began in the last interval has no share)
        ended += 1
    cpu["pop"] += time.process_time() - c0
    chunks = a.streams * a.steps
    intervals = led.aligned + led.time_cut
    print(f"{a.streams} streams x {a.steps} steps ({chunks:,} chunks, {intervals} intervals, {ended:,} requests)")
    for what, s in cpu.items():
        print(f"  {what:7s} {s * 1e3:9.1f} ms CPU  ({s * 1e6 / chunks:6.2f} us per chunk)")
    if a.ngram:
        c0 = time.process_time()
        led.drafting.refit()
        rows = led.drafting.intervals
        print(f"  one refit of the drafting model: {(time.process_time() - c0) * 1e3:.1f} ms CPU ({rows} intervals)")


if __name__ == "__main__":
    main()
