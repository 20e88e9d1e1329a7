"""The bench's upstream: an OpenAI-shaped streaming server that stamps each event with its send time.

Run as its own process (``python -m specproxy.bench.upstream --steps-per-s 25``); it prints its URL on stdout. A plain
asyncio HTTP/1.1 server with keep-alive, so that the upstream costs little beside the relays it feeds. One pacer
writes every stream's events on an absolute schedule (``start + i / rate``, each stream's own start, never bursts to
catch up); at rate 0 it writes as fast as each client reads (a static upstream, for saturation). Routes:

- ``POST /v1/chat/completions``: ``max_tokens`` events (``stream: true``) or one small JSON answer; any body size is
  read and discarded; ``bench_steps_per_s`` in the body overrides the rate;
- ``GET /metrics``: a small vLLM-like exposition; ``GET /metrics-big``: 12 MB of unrelated metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import sys

from specproxy.bench.wire import DONE, LAST_CHUNK, SSE_HEAD, chunk, event, now_ns

HIGH_WATER = 256 * 1024  # a reader this far behind gets no more events until it catches up (rate 0)
SMALL_METRICS = (
    b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="bench"} 0.0\n'
    b'# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name="bench"} 0.0\n'
)


def big_metrics(size: int = 12 * 1024 * 1024) -> bytes:
    line = b'unrelated_exporter_metric_total{shard="%07d",zone="loopback"} 12345.0\n'
    n = size // len(line % 0) + 1
    return b"# TYPE unrelated_exporter_metric_total counter\n" + b"".join(line % i for i in range(n))


class _Stream:
    __slots__ = ("done", "left", "period_ns", "sid", "transport")

    def __init__(self, sid: int, transport: asyncio.WriteTransport, left: int, period_ns: int) -> None:
        self.sid, self.transport, self.left, self.period_ns = sid, transport, left, period_ns
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class Pacer:
    """Writes every stream's next event when it is due; one task for all streams."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Stream]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()

    def add(self, s: _Stream) -> None:
        self._write(s, now_ns())  # the first event goes out at once: TTFT is the relay's, not the schedule's

    def _write(self, s: _Stream, due: int) -> None:
        if s.transport.is_closing():
            if not s.done.done():
                s.done.set_result(None)
            return
        if s.period_ns == 0 and s.transport.get_write_buffer_size() > HIGH_WATER:
            self._push(s, now_ns() + 1_000_000)
            return
        s.left -= 1
        t = now_ns()
        if s.left > 0:
            s.transport.write(chunk(event(s.sid, t)))
            self._push(s, max(due + s.period_ns, t) if s.period_ns else t)
        else:
            s.transport.write(chunk(event(s.sid, t, finish=True)) + chunk(DONE) + LAST_CHUNK)
            if not s.done.done():
                s.done.set_result(None)

    def _push(self, s: _Stream, due: int) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), s))
        self._wake.set()

    async def run(self) -> None:
        heap = self._heap
        while True:
            if not heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = now_ns()
            while heap and heap[0][0] <= now:
                due, _, s = heapq.heappop(heap)
                self._write(s, due)
            if heap:
                # sleep(0) lets readers and new requests in between passes when streams are unpaced
                await asyncio.sleep(max(0.0, (heap[0][0] - now_ns()) / 1e9))


async def _read_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes:
    """The body, kept only up to 64 KiB (enough for the JSON that matters); the rest is read and dropped."""
    kept = bytearray()
    if b"content-length" in headers:
        left = int(headers[b"content-length"])
        while left:
            piece = await reader.read(min(left, 1 << 16))
            if not piece:
                raise ConnectionError("body cut short")
            left -= len(piece)
            if len(kept) < 1 << 16:
                kept += piece
    elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            if len(kept) < 1 << 16:
                kept += data[:-2]
    return bytes(kept)


class Upstream:
    def __init__(self, steps_per_s: float) -> None:
        self.steps_per_s = steps_per_s
        self.pacer = Pacer()
        self._ids = itertools.count()
        self._big: bytes | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method, target, _ = lines[0].split(b" ", 2)
                headers = {}
                for ln in lines[1:]:
                    k, sep, v = ln.partition(b":")
                    if sep:
                        headers[k.strip().lower()] = v.strip()
                body = await _read_body(reader, headers)
                if method == b"GET" and target.startswith(b"/metrics"):
                    if target.startswith(b"/metrics-big"):
                        self._big = self._big or big_metrics()
                        text = self._big
                    else:
                        text = SMALL_METRICS
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n")
                    writer.write(b"content-length: %d\r\n\r\n" % len(text) + text)
                    await writer.drain()
                else:
                    await self._complete(body, transport, writer)
                if headers.get(b"connection", b"").lower() == b"close":
                    break
        writer.close()

    async def _complete(self, body: bytes, transport: asyncio.WriteTransport, writer: asyncio.StreamWriter) -> None:
        try:
            req = json.loads(body)
        except ValueError:
            req = {}  # a body over 64 KiB (the hostile 60 MB one): answered, not parsed
        if not isinstance(req, dict):
            req = {}
        if req.get("stream") is True:
            tokens = max(1, int(req.get("max_tokens") or 16))
            rate = float(req.get("bench_steps_per_s", self.steps_per_s))
            s = _Stream(next(self._ids), transport, tokens, int(1e9 / rate) if rate > 0 else 0)
            transport.write(SSE_HEAD)
            self.pacer.add(s)
            await s.done
            await writer.drain()
            return
        out = b'{"id":"bench","object":"chat.completion","choices":[{"index":0,"message":{"content":"ok"}}]}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(out))
        writer.write(out)
        await writer.drain()


async def serve(port: int, steps_per_s: float) -> None:
    up = Upstream(steps_per_s)
    server = await asyncio.start_server(up.handle, "127.0.0.1", port, backlog=4096, limit=1 << 16)
    pacer = asyncio.create_task(up.pacer.run())
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()
    pacer.cancel()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m specproxy.bench.upstream")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--steps-per-s", type=float, default=25.0, help="events per second per stream (0: unpaced)")
    a = p.parse_args(argv)
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(a.port, a.steps_per_s))
    sys.exit(0)


if __name__ == "__main__":
    main()
