"""The relay's own HTTP/1.1 client to the engine: a pool of kept-alive connections, one exchange at a time on each.

A connection's ``data_received`` does the whole per-read work of a streamed reply itself: it stamps the read, takes
the framing off (:mod:`specproxy.proxy.http1`) and hands the bytes to the exchange's sink, which writes them to the
client and appends the event for the bookkeeping (:mod:`specproxy.proxy.server`). No task wakes per read, as one
would through aiohttp's client; the handler waits for the end of the reply, or for a slow client's buffer to drain.
Each exchange has one timer, moved on lazily to the last read plus the idle timeout, and idle connections are closed
after :data:`CLIENT_KEEPALIVE_S`, before the engine closes them.

A request whose pooled connection fails before any byte of an answer, within :data:`RESEND_WITHIN_S` of sending, is
sent once more on a new connection only when it cannot have been applied (RFC 9110 9.2.2): an idempotent method, or
a connection closed when the request was written or reset under it. A ``POST`` on a connection that closed cleanly
after the request went out gets a 502, never a second generation.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohappyeyeballs

from specproxy.core.headers import CLIENT_KEEPALIVE_S
from specproxy.proxy import http1
from specproxy.proxy.http1 import CHUNKED, CLOSE, LENGTH, NONE, BodyReader, Framed, Head, InvalidResponse
from specproxy.proxy.resolve import Address, Resolver

_LLBody: Callable[[bytes], BodyReader] | None
try:  # llhttp reads the bodies (specproxy.proxy.llbody); without httptools, the same rules in Python (http1.Framed)
    from specproxy.proxy.llbody import Body as _LLBody
except ImportError:  # pragma: no cover - httptools is a dependency: this is a broken install's fallback
    _LLBody = None

# A pooled connection closed under a request fails at once (the upstream's close crossed our send). A failure later
# than this after sending is an upstream that read the request and died on it: that one is not sent again.
RESEND_WITHIN_S = 1.0
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})  # RFC 9110 9.2.2
# Request bodies at least this large are written in the pieces they came in, with flow control, by a task of their
# own while the reply is read (an engine may answer before it has read the body).
LARGE_BODY = 1024 * 1024
# A reply's body read before the relay began (it begins as soon as the head is in) past this: reading pauses.
EARLY_MAX = 1024 * 1024
_NO_LENGTH_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE"})

# What a sink returns: whether its client's buffer is full (the connection then stops reading until resumed).
Sink = Callable[[int, bytes], bool]


class UpstreamError(Exception):
    """No answer from the upstream: ``kind`` is "connect", "connect_timeout", "head_timeout", "disconnected" or
    "invalid"; the message is fit for a client."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Exchange:
    """One request and its reply on one connection. The head is awaited with :meth:`head`; the body is relayed with
    :meth:`relay`; :attr:`outcome` and :attr:`error` say how it ended."""

    __slots__ = (
        "_early",
        "_early_bytes",
        "_free",
        "_head",
        "_signal",
        "_sink",
        "conn",
        "ended",
        "error",
        "got_bytes",
        "method",
        "outcome",
        "paused",
        "reused",
        "sent_at",
        "unread",
    )

    def __init__(self, conn: Connection, method: str, reused: bool, free: Callable[[], None] | None) -> None:
        self.conn = conn
        self._free = free  # gives back its place under the pool's cap, once
        self.method = method
        self.reused = reused
        self.sent_at = time.monotonic()
        self.got_bytes = False
        self.unread = False  # the upstream cannot have read it: closed when it was written, or reset under it
        self._head: asyncio.Future[Head] = conn.loop.create_future()
        self._sink: Sink | None = None
        self._early: list[tuple[int, bytes]] = []  # body read before the relay began
        self._early_bytes = 0
        self._signal: asyncio.Future[None] | None = None
        self.paused = False
        self.ended = False
        self.outcome = "ok"
        self.error: str | None = None

    async def head(self) -> Head:
        return await self._head

    def _got_head(self, head: Head) -> None:
        if not self._head.done():
            self._head.set_result(head)

    def _fail_head(self, e: UpstreamError) -> None:
        if not self._head.done():
            self._head.set_exception(e)
            self.ended = True
            self._settle()

    @property
    def _early_paused(self) -> bool:
        """Reading was paused because too much came before the relay began (:data:`EARLY_MAX`)."""
        return self._early_bytes > EARLY_MAX

    def _settle(self) -> None:
        free, self._free = self._free, None
        if free is not None:
            free()

    def _deliver(self, t: int, data: bytes) -> None:
        sink = self._sink
        if sink is None:
            self._early.append((t, data))
            self._early_bytes += len(data)
            if self._early_paused:
                self.conn.transport.pause_reading()  # resumed when the relay begins
        elif sink(t, data):
            self.paused = True
            self.conn.transport.pause_reading()
            self._wake()

    def _end(self, outcome: str = "ok", error: str | None = None) -> None:
        if self.ended:
            return
        self.ended, self.outcome, self.error = True, outcome, error
        self._settle()
        self._wake()

    def _wake(self) -> None:
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)

    async def relay(self, sink: Sink, drain: Callable[[], Any]) -> None:
        """Hand every read of the body to ``sink``, in this callback or in the connection's; ``drain``: waits for
        the client's buffer to empty. Returns when the body has ended (see :attr:`outcome`)."""
        self._sink = sink
        early, self._early = self._early, []
        for t, data in early:
            if sink(t, data):
                self.paused = True
        if self._early_paused and not self.paused and not self.ended:
            self.conn.transport.resume_reading()
        while True:
            if self.paused:
                if not self.ended:
                    self.conn.transport.pause_reading()
                await drain()
                self.paused = False
                if not self.ended:
                    self.conn.transport.resume_reading()
                continue
            if self.ended:
                return
            self._signal = self.conn.loop.create_future()
            await self._signal

    def abort(self) -> None:
        """Cut it (the client left, or the relay failed): the engine sees the connection close and stops."""
        if self.ended:
            return  # its connection is closed already, or back in the pool
        self.ended, self.outcome, self.error = True, "aborted", "aborted"
        self._settle()
        self.conn.close(abort=True)


class Connection(asyncio.Protocol):
    """One connection to the upstream: the reply to the current exchange read from it, then back to the pool."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.exchange: Exchange | None = None
        self.closed = False
        self._buf = bytearray()  # an incomplete head
        self._interim = 0  # 1xx heads seen before this exchange's answer
        self._framing = NONE
        self._left = 0  # body bytes still to come (LENGTH)
        self._reader: BodyReader | None = None  # takes the framing off a LENGTH or CHUNKED body
        self._keep = False
        self._last_read = 0  # perf_counter_ns of the last read (the stamp each read takes anyway)
        self._timer: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._write_paused: asyncio.Future[None] | None = None
        self._sending: asyncio.Task[None] | None = None  # a large request body still being written
        self.lost: asyncio.Future[None] = self.loop.create_future()  # done when the connection is gone

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: this connection cannot be trusted with another request
            self.close(abort=True)
            return
        ex.got_bytes = True
        self._last_read = t
        try:
            if ex._head.done():
                self._body(ex, t, data)
            else:
                self._buf += data
                self._read_head(ex, t)
        except InvalidResponse as e:
            self._fail(ex, e)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        self._cancel_timers()
        self.pool._lost(self)
        if self._write_paused is not None and not self._write_paused.done():
            self._write_paused.set_result(None)
        ex = self.exchange
        if ex is None or ex.ended:
            return
        why = f": {exc}" if exc is not None else ""
        if not ex._head.done():
            # a reset before any answer: the peer closed with our bytes unread (a clean close may follow a full read)
            ex.unread = ex.unread or isinstance(exc, ConnectionResetError)
            if ex.got_bytes:
                ex._fail_head(UpstreamError("invalid", f"upstream closed the connection inside the response head{why}"))
            else:
                ex._fail_head(UpstreamError("disconnected", f"upstream connection failed: server disconnected{why}"))
        elif self._framing == CLOSE and exc is None:
            self._done(ex, keep=False)
        else:
            left = {LENGTH: f"{self._left} bytes short", CHUNKED: "inside the chunked body"}.get(
                self._framing, "by a reset"
            )
            ex._end("upstream_reset", f"upstream connection broke mid-response: closed {left}{why}")

    def pause_writing(self) -> None:
        self._write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._write_paused is not None and not self._write_paused.done():
            self._write_paused.set_result(None)
        self._write_paused = None

    # -- the exchange
    def send(self, ex: Exchange, head: bytes, pieces: list[bytes], idle_s: float) -> None:
        self.exchange = ex
        self._buf.clear()
        self._interim = 0
        if self.closed or self.transport.is_closing():
            ex.unread = True
            ex._fail_head(UpstreamError("disconnected", "upstream connection failed: server disconnected"))
            return
        self._last_read = time.perf_counter_ns()
        self._timer = self.loop.call_later(idle_s, self._check_idle, idle_s)
        if sum(map(len, pieces)) < LARGE_BODY:
            self.transport.write(b"".join([head, *pieces]))
            return
        self.transport.write(head)
        self._sending = self.loop.create_task(self._write_body(ex, pieces))

    async def _write_body(self, ex: Exchange, pieces: list[bytes]) -> None:
        try:
            for p in pieces:
                if self.closed or ex.ended:  # answered (a 413, say) before the body was all sent: stop sending it
                    return
                self.transport.write(p)
                if self._write_paused is not None:
                    await self._write_paused
        finally:
            self._sending = None

    def _read_head(self, ex: Exchange, t: int) -> None:
        buf = self._buf
        at = 0  # heads before ``at`` were 1xx, dropped once at the end rather than copied out one by one
        while True:
            end = http1.head_end(buf, at)
            if (end - at if end >= 0 else len(buf) - at) > http1.MAX_HEAD_BYTES:
                raise InvalidResponse(f"a response head over {http1.MAX_HEAD_BYTES // 1024} KiB")
            if end < 0:
                del buf[:at]
                return
            head = http1.parse_head(bytes(buf[at:end]))
            head_at, at = at, end
            if head.status == 101:
                raise InvalidResponse("101 Switching Protocols: upgrades are not relayed")
            if head.status < 200:  # 1xx: informational, not relayed (as aiohttp's client skips them)
                self._interim += 1
                if self._interim > http1.MAX_INTERIM:
                    raise InvalidResponse(f"more than {http1.MAX_INTERIM} interim (1xx) replies before the answer")
                continue
            block, rest = bytes(buf[head_at:end]), bytes(buf[end:])
            self._framing, self._left = http1.framing(head, ex.method)
            self._keep = http1.keeps_alive(head) and self._framing != CLOSE
            self._reader = _reader(block, self._framing, self._left)
            self._buf.clear()
            ex._got_head(head)
            if self._framing == NONE or (self._reader is not None and self._reader.done):  # or Content-Length: 0
                self._done(ex, keep=self._keep and not rest)
            elif rest:
                self._body(ex, t, rest)
            return

    def _body(self, ex: Exchange, t: int, data: bytes) -> None:
        reader = self._reader
        if reader is not None:
            piece, after = reader.feed(data)
            if piece:
                self._left -= len(piece)  # counts down for LENGTH (what a cut body lacked); unread for CHUNKED
                ex._deliver(t, piece)
            if after is not None:
                self._done(ex, keep=self._keep and not after)
        elif self._framing == CLOSE:
            ex._deliver(t, data)
        else:  # bytes after a reply without a body: not to be trusted with another request
            self._keep = False
            self.close(abort=True)

    def _done(self, ex: Exchange, *, keep: bool) -> None:
        sending = self._sending is not None
        ex._end()
        self.exchange = None
        self._cancel_timers()
        if (ex.paused or ex._early_paused) and not self.closed:
            self.transport.resume_reading()  # paused for this exchange: the next one reads from the start
        if sending:  # answered before the request was all sent: drop the rest, and the connection with it
            self.close(abort=True)
        elif keep and not self.closed:
            self.pool._release(self)
        else:
            self.close()

    def _fail(self, ex: Exchange, e: InvalidResponse) -> None:
        if ex._head.done():
            ex._end("upstream_reset", f"upstream connection broke mid-response: {e}")
        else:
            ex._fail_head(UpstreamError("invalid", f"upstream sent an invalid response: {e}"))
        self.exchange = None
        self.close(abort=True)

    def _check_idle(self, idle_s: float) -> None:
        ex = self.exchange
        if ex is None or ex.ended:
            return
        left = idle_s - (time.perf_counter_ns() - self._last_read) / 1e9
        if ex.paused or left > 0:  # a paused read waits for the client, not for the upstream
            self._timer = self.loop.call_later(left if left > 0 else 1.0, self._check_idle, idle_s)
            return
        if ex._head.done():
            ex._end("timeout", f"upstream idle-read timeout: no byte within {idle_s:g} s mid-response")
        else:
            why = f"upstream idle-read timeout: no response headers within {idle_s:g} s"
            ex._fail_head(UpstreamError("head_timeout", why))
        self.exchange = None
        self.close(abort=True)

    def _cancel_timers(self) -> None:
        for h in (self._timer, self._idle):
            if h is not None:
                h.cancel()
        self._timer = self._idle = None

    def _idle_for(self, seconds: float) -> None:
        self._idle = self.loop.call_later(seconds, self.close)

    def close(self, *, abort: bool = False) -> None:
        self.closed = True
        self._cancel_timers()
        if self._sending is not None:
            self._sending.cancel()
            self._sending = None
        self.pool._lost(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort() if abort else self.transport.close()


class Pool:
    """Kept-alive connections to one upstream (``http`` or ``https``), newest first; at most ``limit`` in use
    (0: no cap)."""

    def __init__(
        self, scheme: str, host: str, port: int, *, connect_timeout_s: float, idle_timeout_s: float, limit: int = 0
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port = host, port
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if scheme == "https" else None
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._idle: list[Connection] = []
        self._cap = asyncio.Semaphore(limit) if limit > 0 else None
        self.opened = 0  # connections made (for tests and status)
        self.resolver = Resolver(host, port)

    async def request(
        self, method: str, head: bytes, pieces: list[bytes], resending: Callable[[str], None]
    ) -> Exchange:
        """Send a request (its head, with Host, and its body) and wait for the reply's head. A pooled connection that
        fails before any answer within :data:`RESEND_WITHIN_S` is left for a new one, once, after telling
        ``resending`` why, when the request cannot have been applied (the module's docstring). Raises
        :class:`UpstreamError`."""
        ex = await self._send(method, head, pieces, fresh=False)
        try:
            try:
                await ex.head()
            except UpstreamError as e:
                if not (
                    ex.reused
                    and e.kind == "disconnected"
                    and time.monotonic() - ex.sent_at <= RESEND_WITHIN_S
                    and (method in IDEMPOTENT or ex.unread)
                ):
                    raise
                ex = await self._send(method, head, pieces, fresh=True)
                resending("the upstream closed a reused connection before any answer")
                await ex.head()
        except asyncio.CancelledError:  # the client left while waiting: the engine must see it too
            ex.abort()
            raise
        return ex

    async def _send(self, method: str, head: bytes, pieces: list[bytes], *, fresh: bool) -> Exchange:
        cap = self._cap
        if cap is not None:
            await cap.acquire()
        try:
            conn = None if fresh else self._take()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
        except BaseException:
            if cap is not None:
                cap.release()
            raise
        ex = Exchange(conn, method, reused, cap.release if cap is not None else None)
        conn.send(ex, head, pieces, self.idle_timeout_s)
        return ex

    def _take(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                conn._cancel_timers()
                return conn
        return None

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                conn = await self._connect_any()
        except TimeoutError:
            raise UpstreamError(
                "connect_timeout", f"upstream connect timeout: not connected within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as e:
            raise UpstreamError("connect", f"upstream unreachable: {_os_reason(e)}") from None
        self.opened += 1
        return conn

    async def _connect_any(self) -> Connection:
        """A connection to the host's addresses (looked up at most every 10 s), raced as aiohttp's client races
        them (RFC 8305 Happy Eyeballs, 250 ms apart): an address that drops packets does not hold the others up.
        One address (an address literal, a name with one record) has nothing to race: the event loop connects to it
        itself, without a Python socket object (uvloop does it in C, which costs far less CPU under a burst of new
        streams)."""
        infos = await self.resolver.addresses()
        if not infos:
            raise OSError(f"no address for {self.host}")
        if len(infos) == 1 and (direct := _numeric(infos[0])) is not None:
            family, address, port = direct
            hostname = self.host if self.ssl else None
            _, conn = await self.loop.create_connection(
                lambda: Connection(self), address, port, family=family, ssl=self.ssl, server_hostname=hostname
            )
            return conn
        sock = await aiohappyeyeballs.start_connection(infos, happy_eyeballs_delay=0.25, interleave=1)
        try:
            _, conn = await self.loop.create_connection(
                lambda: Connection(self), sock=sock, ssl=self.ssl, server_hostname=self.host if self.ssl else None
            )
        except BaseException:
            sock.close()
            raise
        return conn

    def _release(self, conn: Connection) -> None:
        conn._idle_for(CLIENT_KEEPALIVE_S)
        self._idle.append(conn)

    def _lost(self, conn: Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    async def close(self, within_s: float = 1.0) -> None:
        """Close the idle connections, and wait (a little) until they are gone, so nothing is left half-closed."""
        idle, self._idle = list(self._idle), []
        for conn in idle:
            conn.close()
        if idle:
            await asyncio.wait([c.lost for c in idle], timeout=within_s)


def _numeric(info: Address) -> tuple[int, str, int] | None:
    """(family, address, port) of an IPv4 or IPv6 address the event loop can connect to by its text without a
    lookup; None for one it cannot name that way (an IPv6 address with a scope or a flow label)."""
    family, _, _, _, sockaddr = info
    if family == socket.AF_INET:
        return family, sockaddr[0], sockaddr[1]
    if family == socket.AF_INET6 and not sockaddr[2] and not sockaddr[3]:
        return family, sockaddr[0], sockaddr[1]
    return None


def _reader(head: bytes, framing: str, length: int) -> BodyReader | None:
    """What takes the framing off the body after ``head`` (None for a body read to the close, or none): llhttp where
    httptools is installed, which checks the head too (so a head is relayed only when both parsers take it)."""
    if _LLBody is None:
        return Framed(framing, length) if framing in (LENGTH, CHUNKED) else None
    body = _LLBody(head)
    return body if framing in (LENGTH, CHUNKED) else None


def request_head(method: str, target: str, authority: str, fields: Iterable[tuple[bytes, bytes]], size: int) -> bytes:
    """A request's head as it goes upstream: the fields as the client sent them, byte for byte (aiohttp's
    ``raw_headers``; decoding them and encoding them back would be most of building a head), Host for the upstream, and
    the body's length. The request line's text is encoded as aiohttp decoded it (UTF-8 with surrogates)."""
    start = f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n".encode("utf-8", "surrogateescape")
    out = [start]
    for k, v in fields:
        out += (k, b": ", v, b"\r\n")
    if size or method not in _NO_LENGTH_METHODS:
        out.append(b"Content-Length: %d\r\n" % size)
    out.append(b"\r\n")
    return b"".join(out)


def _os_reason(e: OSError) -> str:
    if isinstance(e, ssl.SSLError):
        return f"TLS: {e.reason or e}"
    if type(e).__module__ == "builtins" and e.errno and e.errno in errno.errorcode:
        return os.strerror(e.errno)  # "Connection refused", without the address asyncio's message adds
    return e.strerror or str(e) or type(e).__name__
