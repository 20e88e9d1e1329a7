"""The fast lane: the relay's own front door for the common request, before aiohttp's.

aiohttp's server (protocol, parser, request and response objects, router, middleware) costs more CPU per request
than the relay's own work, and an inference request is nearly always the same plain thing: ``POST /v1/... HTTP/1.1``
with a Content-Length and a small JSON body, or a plain GET (``/health``, ``/v1/models``, the proxy's own status).
The fast lane reads such a request itself (:mod:`specproxy.proxy.plain`), relays it through the same flow as every
other (:func:`specproxy.proxy.relay.relay_request`) or answers the proxy's own endpoints, and writes the answer's
head framed as aiohttp frames it.

Anything else (another method or version, Transfer-Encoding, Expect, Upgrade, a large body or head, anything a
strict reader would refuse or could read two ways) is handed to aiohttp's protocol whole, with every byte received
so far and before any was acted on (:meth:`FastDoor._hand_off`); so the fast lane has one error answer of its own,
the body's idle deadline (408). It keeps aiohttp's head deadline, keep-alive and pipelining, handler cancellation
when the client leaves, the stop in two steps (:meth:`FastLane.pre_shutdown`) and the fields aiohttp adds to an
answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from specproxy.core.headers import REQUEST_ID_HEADER
from specproxy.core.request_body import Body, stalled
from specproxy.proxy.plain import NEED_MORE, PlainRequest, answer_head, parse_request
from specproxy.proxy.relay import CLOSED_BODY, OWN_PATHS, Relay, error_body, forward_fields, relay_request

log = logging.getLogger("specproxy.proxy")

MAX_PIPELINED = 64 * 1024  # bytes of later requests held while one is relayed, before reading pauses
KEEPALIVE_S = 3630.0  # aiohttp's keepalive_timeout, which the connections aiohttp serves get


class FastLane:
    """The fast lane of one relay process: its settings, and its connections (for the stop)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        cfg = relay.cfg
        self.header_timeout = cfg.client_header_timeout_s
        self.body_timeout = cfg.client_body_timeout_s
        self.max_body = cfg.max_body_bytes
        self.doors: set[FastDoor] = set()
        self.closing = False

    def protocol(self, fallback: Callable[[], asyncio.Protocol]) -> FastDoor:
        """A new connection's protocol; ``fallback`` makes aiohttp's, for a connection handed to it."""
        return FastDoor(self, fallback)

    def pre_shutdown(self) -> None:
        """Stop: idle connections close now, the others after their answer."""
        self.closing = True
        for door in list(self.doors):
            if door.idle:
                door.close()

    def close(self) -> None:
        for door in list(self.doors):
            door.close()


class FastDoor(asyncio.Protocol):
    """One client connection while the fast lane serves it."""

    def __init__(self, lane: FastLane, fallback: Callable[[], asyncio.Protocol]) -> None:
        self._lane = lane
        self._fallback = fallback
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._req: PlainRequest | None = None  # a head read, its body still coming
        self._seen = 0  # bytes of an incomplete head already searched for its end
        self._task: asyncio.Task[None] | None = None  # the request being relayed
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = ""  # what the timer waits for: "head", "body", "idle" (kept alive), "" (nothing)
        self._paused = False  # reading paused: pipelined bytes piled up while a request is relayed
        self.transport: Any = None
        self.write_paused = False
        self.drainers: list[asyncio.Future[None]] = []

    @property
    def idle(self) -> bool:
        return self._task is None and not self._buf

    # -- the connection ------------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._lane.doors.add(self)
        self._wait("head", self._lane.header_timeout)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._task is not None:
            if len(self._buf) > MAX_PIPELINED and not self._paused:
                self._paused = True
                self.transport.pause_reading()
            return
        self._next()

    def eof_received(self) -> bool | None:
        return None  # as aiohttp's: the transport closes, a request in flight is cancelled

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None  # every writer checks: a request still being relayed writes nothing more
        self._lane.doors.discard(self)
        self._wait("", None)
        self._wake(ConnectionResetError("Connection lost"))
        if self._task is not None:
            self._task.cancel()  # handler cancellation: the record says client_cancelled, the upstream is cut

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _wake(self, exc: Exception | None) -> None:
        drainers, self.drainers = self.drainers, []
        for f in drainers:
            if not f.done():
                if exc is None:
                    f.set_result(None)
                else:
                    f.set_exception(exc)

    # -- reading requests ----------------------------------------------------------------------------------------------
    def _next(self) -> None:
        """Act on what the buffer holds: relay a whole plain request, wait for more of one, or hand over."""
        buf = self._buf
        if self._req is None:
            if not buf:
                return
            parsed = parse_request(buf, self._lane.max_body, self._seen)
            if parsed is None:
                self._hand_off()
                return
            if parsed == NEED_MORE:
                self._seen = len(buf)
                if self._waiting != "head":  # the first byte of the next request on a kept-alive connection
                    self._wait("head", self._lane.header_timeout)
                return
            assert isinstance(parsed, PlainRequest)
            self._req, self._seen = parsed, 0
        req = self._req
        if len(buf) < req.size:
            self._wait("body", self._lane.body_timeout)  # from the last byte that came
            return
        self._req = None
        self._wait("", None)
        body = Body([bytes(buf[req.head_len : req.size])]) if req.length else Body()
        del buf[: req.size]
        self._lane.relay.link.fast_lane += 1
        self._task = self._loop.create_task(self._serve(req, body))

    def _hand_off(self) -> None:
        """Give the connection to aiohttp with every byte received: it reads the request from its first byte."""
        transport, data = self.transport, bytes(self._buf)
        self._buf.clear()
        self._lane.doors.discard(self)
        self._lane.relay.link.handed += 1
        self._wait("", None)
        protocol = self._fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._paused:
            transport.resume_reading()
        if data:
            protocol.data_received(data)

    def _wait(self, what: str, seconds: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting = what
        if what and seconds is not None:
            self._timer = self._loop.call_later(seconds, self._late)

    def _late(self) -> None:
        self._timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._waiting == "head":
            log.info("closing a connection whose request head did not arrive within %g s", self._lane.header_timeout)
        elif self._waiting == "body":
            idle = self._lane.body_timeout
            log.info("closing a connection whose request body stopped for %g s", idle)
            self._lane.relay.link.refused(408)
            body = error_body(stalled(idle), 408, "RequestTimeout")
            transport.write(answer_head(408, "", [("Content-Type", "application/json")], len(body), close=True) + body)
        transport.close()

    # -- relaying one ----------------------------------------------------------------------------------------------
    async def _serve(self, req: PlainRequest, body: Body) -> None:
        r = self._lane.relay
        front = _FastFront(self, req)
        try:
            if req.method == "GET" and req.path in OWN_PATHS:  # the bookkeeper's answer, as aiohttp's door gives it
                status, content_type, answer = await r.link.query(req.path)
                front.whole(status, [("Content-Type", content_type)], answer)
            else:
                await self._relay(front, r, req, body)
        except asyncio.CancelledError:
            front.abort()
            raise
        except Exception:  # logged (and recorded) where it failed: answer 500 if nothing was sent yet, else cut
            if front.started or self.transport is None:
                front.abort()
            else:
                front.keep = False
                front.answer(500, error_body("specproxy failed to relay the request", 500, "InternalError"), None)
        finally:
            self._task = None
            self._done(front.keep)

    async def _relay(self, front: _FastFront, r: Relay, req: PlainRequest, body: Body) -> None:
        task = r.in_flight.enter()
        try:
            if r.closed:
                front.answer(503, CLOSED_BODY, None)
            else:
                await relay_request(front, r, req.target, req.path, body)
        finally:
            r.in_flight.leave(task)

    def _done(self, keep: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not keep or self._lane.closing:
            transport.close()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        self._wait("idle", KEEPALIVE_S)
        self._next()


class _FastFront:
    """One request of a :class:`FastDoor`, as :func:`specproxy.proxy.relay.relay_request` needs it."""

    __slots__ = ("_door", "_req", "chunked", "keep", "method", "started")

    def __init__(self, door: FastDoor, req: PlainRequest) -> None:
        self._door = door
        self._req = req
        self.method = req.method
        self.chunked = False
        self.started = False
        self.keep = not req.close

    def get(self, name: str) -> str | None:
        return self._req.get(name)

    def forward_fields(self, authorization: bytes | None) -> list[tuple[bytes, bytes]]:
        return forward_fields(self._req.fields, self._req.connection, authorization)

    def _close(self) -> bool:
        """The connection ends with this answer: the client asked, or the relay is stopping."""
        return not self.keep or self._door._lane.closing

    def answer(self, status: int, body: bytes, rid: str | None) -> None:
        fields = [("Content-Type", "application/json")]
        if rid is not None:
            fields.append((REQUEST_ID_HEADER, rid))
        self.whole(status, fields, body)

    def whole(self, status: int, fields: list[tuple[str, str]], body: bytes) -> None:
        """A whole answer of the proxy's own."""
        transport = self._door.transport
        if transport is None or transport.is_closing():
            return
        self.started = True
        transport.write(answer_head(status, "", fields, len(body), close=self._close()) + body)

    async def start(self, status: int, reason: str, fields: list[tuple[str, str]], length: int | None) -> Any:
        transport = self._door.transport
        if transport is None or transport.is_closing():
            return None
        empty = status < 200 or status in (204, 304)  # no body, whatever the upstream declared
        if empty and status != 304:
            length = None
        self.chunked = not empty and length is None
        self.started = True
        transport.write(answer_head(status, reason, fields, length, close=self._close(), chunked=self.chunked))
        return transport

    async def drain(self) -> None:
        door = self._door
        transport = door.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Connection lost")
        if door.write_paused:
            waiter: asyncio.Future[None] = door._loop.create_future()
            door.drainers.append(waiter)
            await waiter

    async def end(self) -> None:
        transport = self._door.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Connection lost")
        if self.chunked:
            transport.write(b"0\r\n\r\n")

    def abort(self) -> None:
        self.keep = False
        transport = self._door.transport
        if transport is not None:
            transport.abort()
