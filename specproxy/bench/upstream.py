"""The bench's upstream: an OpenAI-shaped streaming server that stamps each event with its send time.

Run as its own process (``python -m specproxy.bench.upstream --steps-per-s 25``); it prints its URL on stdout. A plain
asyncio HTTP/1.1 server with keep-alive, so that the upstream costs little beside the relays it feeds. One pacer
writes every stream's events on an absolute schedule (``start + i / rate``, each stream's own start, never bursts to
catch up); at rate 0 it writes as fast as each client reads (a static upstream, for saturation). Routes:

- ``POST /v1/chat/completions``: ``max_tokens`` events (``stream: true``) or one small JSON answer; any body size is
  read and discarded; ``bench_steps_per_s`` in the body overrides the rate; ``bench_reset_after: N`` resets the
  connection (TCP RST) after N events;
- ``GET /metrics``: vLLM's speculative-decoding counters, moving with the events sent (so the proxy's bookkeeping
  attributes them as it would in front of vLLM); ``GET /metrics-big``: 12 MiB of unrelated metrics;
- ``POST /interim-flood``: 1 MiB of ``HTTP/1.1 100 Continue`` heads, then the answer (a hostile upstream).

Several such processes can serve one port (``--reuse-port``, SO_REUSEPORT: the kernel spreads connections over them),
so that the upstream is not what caps a relay of several processes. Their counters are then one engine's: each
process publishes its own into its slot of a shared file (``--shared PATH --slot I --slots N``) every few
milliseconds, and ``/metrics`` sums the slots.

Each stream's first event is its prefill; every later one is a decode step that drafted :data:`K` tokens and brought
1, 2, 1 or 3 tokens in turn (``"tok "`` repeated), so a quarter of the draft tokens are accepted.

One module: the server, its pacer and the counters it publishes are one process's loop, and what each writes is what
the others count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import mmap
import os
import socket
import struct
import sys

from specproxy.bench.wire import DONE, LAST_CHUNK, SSE_HEAD, chunk, event, now_ns

HIGH_WATER = 256 * 1024  # a reader this far behind gets no more events until it catches up (rate 0)
K = 3  # draft tokens per decode step
_STEP_TOKENS = (1, 2, 1, 3)  # tokens a decode step brings, in turn
INTERIM_FLOOD = b"HTTP/1.1 100 Continue\r\n\r\n" * (1024 * 1024 // 25)  # 1 MiB of interim replies


class Counters:
    """What vLLM would count for the events sent so far."""

    __slots__ = ("accepted", "drafts", "generation", "per_position", "prefills", "running", "steps")

    def __init__(self) -> None:
        self.prefills = self.steps = self.drafts = self.accepted = self.generation = self.running = 0
        self.per_position = [0] * K

    def sent(self, first: bool, tokens: int) -> None:
        if first:
            self.generation += tokens
            self.prefills += 1
            return
        self.steps_sent(tokens, 1)

    def steps_sent(self, tokens: int, times: int) -> None:
        """``times`` decode steps of ``tokens`` tokens each: as many ``sent(False, tokens)``."""
        self.generation += tokens * times
        self.steps += times
        self.drafts += times
        self.accepted += (tokens - 1) * times
        for i in range(tokens - 1):
            self.per_position[i] += times

    def values(self) -> list[int]:
        return [
            self.prefills,
            self.steps,
            self.drafts,
            self.accepted,
            self.generation,
            self.running,
            *self.per_position,
        ]

    def load(self, values: list[int]) -> None:
        self.prefills, self.steps, self.drafts, self.accepted, self.generation, self.running = values[:6]
        self.per_position = list(values[6 : 6 + K])

    def exposition(self) -> bytes:
        lab = 'engine="0",model_name="bench"'
        lines = [
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{lab}}} {self.running}.0",
            f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{lab}}} {self.generation}.0",
            f"# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{{{lab}}} "
            f"{self.drafts}.0",
            f"# TYPE vllm:spec_decode_num_draft_tokens_total counter\nvllm:spec_decode_num_draft_tokens_total{{{lab}}} "
            f"{self.drafts * K}.0",
            f"# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {self.accepted}.0",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {n}.0'
                for i, n in enumerate(self.per_position)
            ),
            f"# TYPE vllm:time_to_first_token_seconds histogram\n"
            f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {self.prefills}.0\n'
            f"vllm:time_to_first_token_seconds_count{{{lab}}} {self.prefills}.0",
            f"# TYPE vllm:inter_token_latency_seconds histogram\n"
            f'vllm:inter_token_latency_seconds_bucket{{{lab},le="+Inf"}} {self.steps}.0\n'
            f"vllm:inter_token_latency_seconds_count{{{lab}}} {self.steps}.0",
        ]
        return ("\n".join(lines) + "\n").encode()


_FIELDS = 6 + K
_SLOT = struct.Struct(f"<{_FIELDS}q")


class SharedCounters:
    """The counters of several upstream processes on one port: each writes its own into its slot of ``path``; the
    exposition is of their sum. A slot is one process's, so no write races another."""

    def __init__(self, own: Counters, path: str, slot: int, slots: int) -> None:
        if not 0 <= slot < slots:
            raise ValueError(f"slot {slot} not in 0..{slots - 1}")
        self.own, self.slot, self.slots = own, slot, slots
        size = _SLOT.size * slots
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def publish(self) -> None:
        _SLOT.pack_into(self._mm, self.slot * _SLOT.size, *self.own.values())

    def total(self) -> Counters:
        self.publish()
        sums = [0] * _FIELDS
        for i in range(self.slots):
            for j, v in enumerate(_SLOT.unpack_from(self._mm, i * _SLOT.size)):
                sums[j] += v
        out = Counters()
        out.load(sums)
        return out

    async def run(self, every_s: float = 0.005) -> None:
        while True:
            self.publish()
            await asyncio.sleep(every_s)


def big_metrics(size: int = 12 * 1024 * 1024) -> bytes:
    line = b'unrelated_exporter_metric_total{shard="%07d",zone="loopback"} 12345.0\n'
    n = size // len(line % 0) + 1
    return b"# TYPE unrelated_exporter_metric_total counter\n" + b"".join(line % i for i in range(n))


class _Stream:
    __slots__ = ("done", "left", "period_ns", "reset_left", "sent", "sid", "transport")

    def __init__(
        self, sid: int, transport: asyncio.WriteTransport, left: int, period_ns: int, reset_left: int = -1
    ) -> None:
        self.sid, self.transport, self.left, self.period_ns = sid, transport, left, period_ns
        self.sent = 0
        self.reset_left = reset_left  # events left when the connection is reset (TCP RST) instead; -1: never
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


def _reset(transport: asyncio.WriteTransport) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed or killed server's connection ends."""
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class Pacer:
    """Writes every stream's next event when it is due; one task for all streams. Unpaced streams get up to
    ``batch`` events a write."""

    def __init__(self, counters: Counters, batch: int = 1) -> None:
        self.counters = counters
        self.batch = batch
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
        if s.period_ns == 0 and self.batch > 1:
            self._write_batch(s)
            return
        s.left -= 1
        t = now_ns()
        if s.left == s.reset_left:
            _reset(s.transport)
            if not s.done.done():
                s.done.set_result(None)
        else:
            n = 1 if s.sent == 0 else _STEP_TOKENS[(s.sid + s.sent) % len(_STEP_TOKENS)]
            self.counters.sent(s.sent == 0, n)
            s.sent += 1
            if s.left > 0:
                s.transport.write(chunk(event(s.sid, t, tokens=n)))
                self._push(s, max(due + s.period_ns, t) if s.period_ns else t)
                return
            s.transport.write(chunk(event(s.sid, t, finish=True, tokens=n)) + chunk(DONE) + LAST_CHUNK)
            if not s.done.done():
                s.done.set_result(None)

    def _write_batch(self, s: _Stream) -> None:
        """Unpaced, up to ``batch`` events of one stream in one write: the same bytes, fewer system calls (a reader
        that is behind reads them together anyway). The events of one write share its stamp, so each size of step
        is formatted once a write: the upstream's cost per event falls below a relay's, which it must for the
        relays, not the load, to be what saturates. A write of whole cycles of step sizes, none of them the first,
        the last or the reset, is one cycle's bytes repeated."""
        cycle = len(_STEP_TOKENS)
        whole = self.batch - self.batch % cycle
        if whole and s.sent > 0 and s.left > whole and not (s.left - whole <= s.reset_left < s.left):
            t = now_ns()
            sizes = [_STEP_TOKENS[(s.sid + s.sent + k) % cycle] for k in range(cycle)]
            times = whole // cycle
            s.transport.write(b"".join(chunk(event(s.sid, t, tokens=n)) for n in sizes) * times)
            for n in sizes:
                self.counters.steps_sent(n, times)
            s.left -= whole
            s.sent += whole
            self._push(s, now_ns())
            return
        parts: list[bytes] = []
        t = now_ns()
        made: dict[int, bytes] = {}
        counts = [0] * (max(_STEP_TOKENS) + 1)  # decode steps sent, by tokens
        for _ in range(self.batch):
            s.left -= 1
            if s.left == s.reset_left:
                self._count(counts)
                if parts:
                    s.transport.write(b"".join(parts))
                _reset(s.transport)
                if not s.done.done():
                    s.done.set_result(None)
                return
            first = s.sent == 0
            n = 1 if first else _STEP_TOKENS[(s.sid + s.sent) % cycle]
            s.sent += 1
            if first:
                self.counters.sent(True, n)
            else:
                counts[n] += 1
            if s.left == 0:
                self._count(counts)
                parts += (chunk(event(s.sid, t, finish=True, tokens=n)), chunk(DONE), LAST_CHUNK)
                s.transport.write(b"".join(parts))
                if not s.done.done():
                    s.done.set_result(None)
                return
            piece = made.get(n)
            if piece is None:
                piece = made[n] = chunk(event(s.sid, t, tokens=n))
            parts.append(piece)
        self._count(counts)
        s.transport.write(b"".join(parts))
        self._push(s, now_ns())

    def _count(self, counts: list[int]) -> None:
        for n, times in enumerate(counts):
            if times:
                self.counters.steps_sent(n, times)

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
    def __init__(self, steps_per_s: float, batch: int = 1) -> None:
        self.steps_per_s = steps_per_s
        self.counters = Counters()
        self.shared: SharedCounters | None = None
        self.pacer = Pacer(self.counters, batch)
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
                        seen = self.shared.total() if self.shared is not None else self.counters
                        text = seen.exposition()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n")
                    writer.write(b"content-length: %d\r\n\r\n" % len(text) + text)
                    await writer.drain()
                else:
                    if target.startswith(b"/interim-flood"):
                        writer.write(INTERIM_FLOOD)
                    await self._complete(body, transport, writer)
                if headers.get(b"connection", b"").lower() == b"close":
                    break
        writer.close()

    async def _complete(self, body: bytes, transport: asyncio.WriteTransport, writer: asyncio.StreamWriter) -> None:
        try:
            req = json.loads(body)
        except ValueError:
            req = {}  # a body over 64 KiB (the hostile one of tiny elements): answered, not parsed
        if not isinstance(req, dict):
            req = {}
        if req.get("stream") is True:
            tokens = max(1, int(req.get("max_tokens") or 16))
            rate = float(req.get("bench_steps_per_s", self.steps_per_s))
            reset_after = req.get("bench_reset_after")  # events sent before a TCP reset (the soak's resets)
            reset_left = tokens - reset_after - 1 if isinstance(reset_after, int) and 0 < reset_after < tokens else -1
            s = _Stream(next(self._ids), transport, tokens, int(1e9 / rate) if rate > 0 else 0, reset_left)
            transport.write(SSE_HEAD)
            self.counters.running += 1
            try:
                self.pacer.add(s)
                await s.done
            finally:
                self.counters.running -= 1
            await writer.drain()
            return
        out = b'{"id":"bench","object":"chat.completion","choices":[{"index":0,"message":{"content":"ok"}}]}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(out))
        writer.write(out)
        await writer.drain()


async def serve(
    port: int,
    steps_per_s: float,
    reuse_port: bool = False,
    shared: tuple[str, int, int] | None = None,
    batch: int = 1,
) -> None:
    up = Upstream(steps_per_s, batch)
    tasks = [asyncio.create_task(up.pacer.run())]
    if shared is not None:
        up.shared = SharedCounters(up.counters, *shared)
        tasks.append(asyncio.create_task(up.shared.run()))
    server = await asyncio.start_server(
        up.handle, "127.0.0.1", port, backlog=4096, limit=1 << 16, reuse_port=reuse_port or None
    )
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()
    for t in tasks:
        t.cancel()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m specproxy.bench.upstream")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--steps-per-s", type=float, default=25.0, help="events per second per stream (0: unpaced)")
    p.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT: other upstream processes share the port")
    p.add_argument("--shared", metavar="PATH", help="a file the processes on one port sum their counters in")
    p.add_argument("--slot", type=int, default=0, help="this process's slot in --shared")
    p.add_argument("--slots", type=int, default=1, help="processes sharing --shared")
    p.add_argument("--batch", type=int, default=1, help="events per write to an unpaced stream (at least 1)")
    a = p.parse_args(argv)
    if a.batch < 1:
        p.error(f"--batch must be at least 1, got {a.batch}")
    if a.shared is not None and not 0 <= a.slot < a.slots:
        p.error(f"--slot {a.slot} is not in 0..{a.slots - 1}")
    import uvloop

    shared = (a.shared, a.slot, a.slots) if a.shared is not None else None
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(a.port, a.steps_per_s, a.reuse_port, shared, a.batch))
    sys.exit(0)


if __name__ == "__main__":
    main()
