"""What the counter ledger costs the bookkeeper when many requests overlap: CPU of settling and of sharing out.

    python -m tests.ledger_cost --streams 256 --steps 150

``--streams`` requests decode side by side, one chunk per step each at 25 steps/s, with a scrape every 250 ms whose
delta is made up (every step drafted k = 3, half of the requests' steps bring one token, a quarter two, a quarter
four; a third of the requests without exact counts), then every request ends and is popped, as the recorder does.
Prints the CPU seconds of the chunks, the settles and the pops. Pure: no sockets, no clock but the CPU's.
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
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
    for step in range(a.steps):
        t_ns = step * STEP_NS
        if t_ns >= next_scrape:
            c0 = time.process_time()
            led.settle(t_ns, SpecCounters("vllm", acc[1], acc[2], acc[0], tuple(pos), decode_steps=acc[3]))
            cpu["settle"] += time.process_time() - c0
            acc, pos, next_scrape = [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0], next_scrape + SCRAPE_NS
        c0 = time.process_time()
        for i, rid in enumerate(ids):
            n = 1 if step == 0 else rng.choice((1, 1, 2, 4))
            led.record_chunk(rid, n, t_ns + i, exact=i % 3 != 0, decode=step > 0)
            if step > 0:
                acc[0] += n - 1
                acc[1] += 1
                acc[2] += 3
                acc[3] += 1
                for j in range(n - 1):
                    pos[j] += 1
        cpu["chunks"] += time.process_time() - c0
    end_ns = a.steps * STEP_NS
    c0 = time.process_time()
    led.settle(end_ns, SpecCounters("vllm", acc[1], acc[2], acc[0], tuple(pos), decode_steps=acc[3]))
    cpu["settle"] += time.process_time() - c0
    c0 = time.process_time()
    for rid in ids:
        led.end(rid)
        got = led.pop(rid)
        assert got is not None
    cpu["pop"] += time.process_time() - c0
    chunks = a.streams * a.steps
    print(f"{a.streams} streams x {a.steps} steps ({chunks:,} chunks, {led.aligned + led.time_cut} intervals)")
    for what, s in cpu.items():
        print(f"  {what:7s} {s * 1e3:9.1f} ms CPU  ({s * 1e6 / chunks:6.2f} us per chunk)")


if __name__ == "__main__":
    main()
