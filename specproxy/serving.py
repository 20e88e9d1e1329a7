"""Listening and stopping: the set-up the proxy, the simulator and the load generator share.

:func:`start_app` puts an aiohttp app on a host and port (0: any free one) and hands back its runner, whose
``cleanup()`` stops it; :func:`base_url` and :func:`bound_ports` say where it listens. :func:`stop_signals` routes
SIGINT and SIGTERM to a callback for the time of a ``with`` block, so a long-running command can stop cleanly
(drain, write its records) instead of dying on ``KeyboardInterrupt``.

What aiohttp does not do on its own lives here too. A front door: a deadline for the request head
(``client_header_timeout`` of :func:`start_app`, see :class:`_HeadClock`), a front door of the server's own before
aiohttp's (:class:`Door`), a body read within a size limit and an idle timeout (:func:`read_body`). And a stop in two
steps (:class:`InFlight`, :func:`stop_in_two_steps`): stop accepting, let the requests in flight finish, then cut
those still running when the drain time is up or when asked to (a second signal), so that their handlers still end,
and record, before the app's cleanup runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from aiohttp import web

from specproxy.core.request_body import Body, stalled

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CUT_GRACE_S = 5.0  # how long cut handlers get to end (they end at once: cancellation closes their upstream)

log = logging.getLogger("specproxy.serving")


async def start_app(
    app: web.Application,
    host: str,
    port: int,
    *,
    shutdown_timeout: float,
    handler_cancellation: bool,
    reuse_address: bool | None = None,
    client_header_timeout: float | None = None,
    reuse_port: bool | None = None,
    door: Door | None = None,
) -> web.AppRunner:
    """Listen on ``host:port``; if that fails, nothing stays set up. ``shutdown_timeout``: how long ``cleanup()``
    lets in-flight handlers finish. ``handler_cancellation``: a client that disconnects cancels its handler at once.
    ``reuse_address``: None leaves the system's default. ``client_header_timeout``: seconds a client has to send a
    whole request head, from the moment it connects or from the first byte of its next request (None: no limit; a
    number adds a middleware to ``app`` and serves it through :class:`_HeadTimedSite`). ``reuse_port``: SO_REUSEPORT.
    ``door``: a front door each new connection meets before aiohttp's protocol, which it hands connections to."""
    runner = web.AppRunner(
        app, handler_cancellation=handler_cancellation, shutdown_timeout=shutdown_timeout, access_log=None
    )
    if client_header_timeout is not None:
        app.middlewares.append(_head_clock_middleware)  # before setup(), which freezes the app
    await runner.setup()
    try:
        # a listen backlog of 1,024 (aiohttp's default is 128, nginx's 511): a burst of that many new streams gets in
        listen: dict[str, Any] = {"reuse_address": reuse_address, "reuse_port": reuse_port, "backlog": 1024}
        if client_header_timeout is None and door is None:
            await web.TCPSite(runner, host, port, **listen).start()
        else:
            await _HeadTimedSite(runner, host, port, client_header_timeout, door, **listen).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_ports(runner: web.AppRunner) -> list[int]:
    """Every port the runner listens on (one per address the host resolved to)."""
    return [int(address[1]) for address in runner.addresses]


def base_url(runner: web.AppRunner) -> str:
    """``http://host:port`` of the runner's first address, IPv6 hosts in brackets."""
    host, port = runner.addresses[0][:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def stop_signals(on_signal: Callable[[int], object]) -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM call ``on_signal(signum)`` in the running loop; on leaving it, their
    default behaviour is back (a signal after the block, e.g. during a slow shutdown outside it, ends the process).
    Where the loop cannot take signal handlers (not the main thread, no signal support) nothing is installed."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, int(sig))
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


# --- the request head's deadline ---------------------------------------------------------------------------------
# aiohttp times idle keep-alive connections (``keepalive_timeout``, from the connect only in its newest releases) and
# nothing bounds a request head once begun: a client that trickles a header, or sends nothing, holds a connection
# (and a file descriptor) for an hour. aiohttp has no hook where a head starts or ends, so each connection's protocol
# (the one aiohttp's server makes) is wrapped in a _HeadClock that passes every call through and keeps one timer,
# armed when the connection opens and at the first byte of each later request, disarmed when the app starts handling
# the request (a middleware tells it). The site installs it: the one place aiohttp hands its protocol factory to the
# event loop. Nothing of it runs per byte of a response.


class _HeadClock(asyncio.Protocol):
    """One connection: aiohttp's protocol for it, and the deadline of the request head being received."""

    __slots__ = ("_busy", "_inner", "_loop", "_quiet", "_served", "_timeout", "_timer", "_transport")

    def __init__(self, inner: asyncio.Protocol, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._inner = inner
        self._loop = loop
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._busy = False  # the app is handling a request
        self._quiet = True  # no byte since the connection opened or since the last response
        self._served = False  # a response went out on this connection

    @property
    def idle(self) -> bool:
        """Neither a request being handled nor one being received: closing the connection loses nothing."""
        return not self._busy and self._quiet

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport's
        self._arm()  # the first request head is due from the moment the connection opens
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._quiet:
            self._quiet = False
            if self._served:  # the first byte of the next request on a kept-alive connection: its head is now due
                self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def request_started(self) -> None:
        self._busy = True
        self._disarm()

    def request_finished(self) -> None:
        self._busy = False
        self._quiet = self._served = True  # idle keep-alive is aiohttp's keepalive_timeout's business, not the head's

    def _arm(self) -> None:
        self._disarm()
        self._timer = self._loop.call_later(self._timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if self._busy or transport is None or transport.is_closing():
            return
        log.info("closing a connection whose request head did not arrive within %g s", self._timeout)
        transport.close()  # no request was parsed, so there is none to answer


@web.middleware
async def _head_clock_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    clock = request.transport.get_protocol() if request.transport is not None else None
    if not isinstance(clock, _HeadClock):
        return await handler(request)
    clock.request_started()
    try:
        return await handler(request)
    finally:
        clock.request_finished()


class Door(Protocol):
    """A front door of a server's own (:class:`specproxy.proxy.frontdoor.FastLane`): each new connection's protocol
    first, which hands the connection to aiohttp's (``fallback()``) for what it does not serve itself. The stop
    tells it to close idle connections and the others after their answer (``pre_shutdown``), then every one."""

    def protocol(self, fallback: Callable[[], asyncio.Protocol]) -> asyncio.Protocol: ...
    def pre_shutdown(self) -> None: ...
    def close(self) -> None: ...


class _HeadTimedSite(web.BaseSite):
    """aiohttp's TCPSite, each connection met first by ``door``, aiohttp's protocol wrapped in a :class:`_HeadClock`."""

    __slots__ = ("_header_timeout", "_host", "_listen", "_port", "door")

    def __init__(
        self, runner: web.AppRunner, host: str, port: int, timeout: float | None, door: Door | None, **listen: Any
    ):
        super().__init__(runner)
        self._host, self._port = host, port
        self._header_timeout, self._listen, self.door = timeout, listen, door  # listen: reuse_address, _port

    @property
    def name(self) -> str:
        return f"http://[{self._host}]:{self._port}" if ":" in self._host else f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server, timeout = self._runner.server, self._header_timeout
        assert server is not None

        def aiohttps() -> asyncio.Protocol:
            return server() if timeout is None else _HeadClock(server(), loop, timeout)

        def protocol() -> asyncio.Protocol:
            return aiohttps() if self.door is None else self.door.protocol(aiohttps)

        # BaseSite's stop() and the runner's addresses read the listening server from _server, as for every site
        self._server = await loop.create_server(protocol, self._host, self._port, **self._listen)


@dataclass(eq=False)  # an exception keeps its identity hash
class Refused(Exception):
    """A request turned away before it is handled: ``status`` and a one-line ``reason``; ``close_now``: close the
    connection once answered instead of letting aiohttp read and drop the rest of the body."""

    status: int
    reason: str
    close_now: bool = False


def declared_too_large(request: web.BaseRequest, limit: int) -> Refused | None:
    """413 for a declared Content-Length over ``limit``, before a byte of the body is read."""
    length = request.content_length
    if length is not None and length > limit:
        return Refused(413, f"request body of {length} bytes over the limit of {limit}")
    return None


async def read_body(request: web.BaseRequest, *, limit: int, idle_s: float) -> Body:
    """The whole request body, in the pieces it came in (never copied into one). Raises :class:`Refused`: 413 at
    once for a declared length over ``limit`` (nothing read), 413 as soon as a body without one grows over it, 408
    (closing) when no byte of it comes for ``idle_s`` (between two reads, like nginx's client_body_timeout)."""
    refused = declared_too_large(request, limit)
    if refused is not None:
        raise refused
    body = Body()
    if not request.body_exists:
        return body
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(idle_s) as deadline:
            while chunk := await request.content.readany():
                body.append(chunk)
                if body.size > limit:
                    raise Refused(413, f"request body over the limit of {limit} bytes")
                deadline.reschedule(loop.time() + idle_s)
    except TimeoutError:
        log.info("closing a connection whose request body stopped for %g s", idle_s)
        raise Refused(408, stalled(idle_s), True) from None
    return body


async def close_after(request: web.BaseRequest, resp: web.StreamResponse) -> web.StreamResponse:
    """Send ``resp`` and close the connection at once. Left to aiohttp, a body not read to its end is read and
    dropped for up to its lingering time (10 s), which is for a client still sending, not for one that stopped."""
    resp.force_close()
    with contextlib.suppress(ConnectionError):
        await resp.prepare(request)
        await resp.write_eof()
    if request.transport is not None:
        request.transport.close()
    return resp


# --- stopping in two steps ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Cut:
    """A request to cut what a draining stop still waits for, now; ``reason`` says why, ``signum`` which signal."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    signum: int | None = None

    def now(self, reason: str, signum: int | None = None) -> None:
        self.reason, self.signum = reason, signum
        self.event.set()


class InFlight:
    """The handler tasks of the requests in flight: a stop waits for them, then cancels those left. A handler that
    ends by cancellation reads :attr:`cut_reason`: set, the stop cut it; None, its client left."""

    __slots__ = ("_empty", "_tasks", "cut_reason")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._empty = asyncio.Event()
        self._empty.set()
        self.cut_reason: str | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def enter(self) -> asyncio.Task[Any] | None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            self._empty.clear()
        return task

    def leave(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks.discard(task)
            if not self._tasks:
                self._empty.set()

    async def drain(self, within_s: float, cut: Cut | None = None) -> bool:
        """Wait until no request is in flight (True), or until ``within_s`` passes or ``cut`` is asked for (False)."""
        waits = [asyncio.ensure_future(self._empty.wait())]
        if cut is not None:
            waits.append(asyncio.ensure_future(cut.event.wait()))
        try:
            await asyncio.wait(waits, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return not self._tasks

    async def cut(self, reason: str) -> int:
        """Cancel every handler still running, marked by ``reason``, and wait (briefly) until they have ended."""
        self.cut_reason = reason
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CUT_GRACE_S)
        return len(tasks)


@dataclass(frozen=True, slots=True)
class Stopped:
    """How a stop went: how many requests were cut, why, and by which signal (None: by the drain timeout)."""

    cut: int = 0
    cut_reason: str | None = None
    signum: int | None = None


async def stop_in_two_steps(runner: web.AppRunner, in_flight: InFlight, drain_s: float, cut: Cut | None) -> Stopped:
    """Stop listening and close idle connections; let the requests in flight finish for up to ``drain_s`` (or until
    ``cut`` is asked for); cancel the rest (their handlers see :attr:`InFlight.cut_reason`); then run aiohttp's
    cleanup, which runs the app's (where records are written)."""
    doors = [site.door for site in runner.sites if isinstance(site, _HeadTimedSite) and site.door is not None]
    for site in list(runner.sites):
        await site.stop()
    for door in doors:
        door.pre_shutdown()
    await asyncio.sleep(0)  # requests whose head arrived just before have started (as aiohttp's own cleanup does)
    if runner.server is not None:
        runner.server.pre_shutdown()  # connections close after their response
        for conn in runner.server.connections:
            # aiohttp closes idle kept-alive ones only after its wait: a request sent on one meanwhile waits for nothing
            transport = conn.transport
            clock = transport.get_protocol() if transport is not None else None
            if isinstance(clock, _HeadClock) and clock.idle and transport is not None:
                transport.close()
    stopped = Stopped()
    if not await in_flight.drain(drain_s, cut):
        if cut is not None and cut.event.is_set():
            reason, signum = cut.reason, cut.signum
        else:
            reason, signum = f"the drain timeout ({drain_s:g} s) passed", None
        stopped = Stopped(await in_flight.cut(reason), reason, signum)
    else:
        in_flight.cut_reason = "the stop"  # a late request that aiohttp's cleanup cancels is cut by the stop too
    for door in doors:
        door.close()  # what is left open: cut, or a head that never ended
    await runner.cleanup()
    return stopped
