"""The proxy's per-event Python, measured in one process with no sockets: steadier than the side-by-side bench.

``python -m benchmarks.inprocess [--events N]`` prints CPU µs:

- **relay per read**: an upstream connection's ``data_received`` for one chunked SSE event (stamp, take the framing
  off, write to the client's transport, append the event; the events handed on once per 64 reads), with transports
  that drop what they are given; and the same per event when a read holds 100 events (at saturation, reads hold
  many);
- **bookkeeping per event**: the same events through the event channel into a bookkeeper on this loop (SSE, JSON,
  token counts, the ledger, and at the end the records: built, observed in the own metrics, written), with no
  scrapes.

What it leaves out is what any relay pays (the system calls, measured by ``specproxy bench``); what it keeps is what
specproxy's own code adds, which is where a change to the per-event path shows first. Compare trees side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any

from multidict import CIMultiDict

from specproxy.core.request_body import Body
from specproxy.proxy.bookkeeper import Bookkeeper
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.link import EventLink, Relayed
from specproxy.proxy.relay import client_sink
from specproxy.proxy.server import upstream_session
from specproxy.proxy.upstream import Connection, Exchange, Pool
from specproxy.recorder.recorder import RecorderConfig

EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":"tok tok "},"finish_reason":null}]}\n\n'
)
REQUEST = b'{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true}'


class _Discard:
    """A transport that takes every write and is never full."""

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 16384, 65536

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cpu_us(fn: Any, n: int) -> float:
    c0 = time.process_time()
    fn(n)
    return (time.process_time() - c0) / n * 1e6


async def relay_per_read(events: int, per_read: int) -> float:
    """CPU µs per event of the relay's per-read path, ``per_read`` events in each read."""
    pool = Pool("http", "127.0.0.1", 9, connect_timeout_s=1.0, idle_timeout_s=600.0)
    link = EventLink(soft_bytes=1 << 40, hard_bytes=1 << 41, capture_max_bytes=0, header_names=())
    link.attach_local(lambda b: None)
    conn = Connection(pool)
    conn.connection_made(_Discard())  # type: ignore[arg-type]
    ex = Exchange(conn, "POST", False, None)
    conn.send(ex, b"POST /v1/chat/completions HTTP/1.1\r\n\r\n", [], 600.0)  # as the relay sends a request
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")  # the reply's head: a chunked body
    to_client = client_sink(_Discard(), True, link, Relayed(1, 0))
    relaying = asyncio.get_running_loop().create_task(ex.relay(to_client, _idle))
    await asyncio.sleep(0)  # the relay takes the body from here, read by read, in data_received
    read = (b"%x\r\n%b\r\n" % (len(EVENT), EVENT)) * per_read

    def run(n: int) -> None:
        for i in range(n):
            conn.data_received(read)
            if i % 64 == 63:  # the events go out once per loop iteration, which serves many streams' reads
                link.flush()
        link.flush()

    reads = max(1, events // per_read)
    try:
        run(min(reads, 1000))  # warm-up: first calls, allocations
        return _cpu_us(run, reads) / per_read
    finally:
        ex.abort()
        relaying.cancel()
        await link.close()


async def _idle() -> None:
    """A client's buffer that is never full: nothing to drain."""


async def bookkeeping_per_event(events: int, streams: int = 64) -> float:
    """CPU µs per event of a bookkeeper on this loop, fed as a relay feeds it (no scrapes, records to a file)."""
    with tempfile.TemporaryDirectory(prefix="specproxy-inprocess-") as d:
        rcfg = RecorderConfig(record_path=os.path.join(d, "records.jsonl"), metrics_url=None)
        cfg = ProxyConfig(upstream="http://127.0.0.1:9", recorder=rcfg)
        session = upstream_session(cfg)
        keeper = Bookkeeper.create(cfg, session)
        await keeper.start()
        link = EventLink(soft_bytes=1 << 40, hard_bytes=1 << 41, capture_max_bytes=0, header_names=())
        link.attach_local(keeper.connect(link.received).received)
        headers = CIMultiDict({"Content-Type": "application/json"})
        per_stream = max(1, events // streams)

        c0 = time.process_time()
        try:
            relayed = [
                link.begin("POST", "/v1/chat/completions", headers, None, Body([REQUEST])) for _ in range(streams)
            ]
            for r in relayed:
                link.head(r, 200, "text/event-stream", None)
            t = time.perf_counter_ns()
            for _ in range(per_stream):
                for r in relayed:
                    t += 1000
                    link.chunk(r, t, EVENT)
                link.flush()
            for r in relayed:
                link.finish(r, "ok", None)
        finally:
            await link.close()
            await keeper.close()  # every record built, observed and written: part of the cost
            await session.close()
        return (time.process_time() - c0) / (per_stream * streams) * 1e6


async def measure(events: int) -> dict[str, float]:
    return {
        "relay_us_per_read_1_event": await relay_per_read(events, 1),
        "relay_us_per_event_100_per_read": await relay_per_read(events, 100),
        "bookkeeping_us_per_event": await bookkeeping_per_event(events),
    }


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.inprocess", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=40000, help="events per figure (default 40,000)")
    args = ap.parse_args()
    if args.events < 100:
        ap.error("--events must be at least 100")
    for name, value in asyncio.run(measure(args.events)).items():
        print(f"{name:34s} {value:7.2f}")


if __name__ == "__main__":
    main()
