"""Listening and stopping: the set-up the proxy, the simulator and the load generator share.

:func:`start_app` puts an aiohttp app on a host and port (0: any free one) and hands back its runner, whose
``cleanup()`` stops it; :func:`base_url` and :func:`bound_ports` say where it listens. :func:`stop_signals` routes
SIGINT and SIGTERM to a callback for the time of a ``with`` block, so a long-running command can stop cleanly
(drain, write its records) instead of dying on ``KeyboardInterrupt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

from aiohttp import web

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def start_app(
    app: web.Application,
    host: str,
    port: int,
    *,
    shutdown_timeout: float,
    handler_cancellation: bool,
    reuse_address: bool | None = None,
) -> web.AppRunner:
    """Listen on ``host:port``; if that fails, nothing stays set up. ``shutdown_timeout``: how long ``cleanup()``
    lets in-flight handlers finish. ``handler_cancellation``: a client that disconnects cancels its handler at once.
    ``reuse_address``: None leaves the system's default."""
    runner = web.AppRunner(
        app, handler_cancellation=handler_cancellation, shutdown_timeout=shutdown_timeout, access_log=None
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=reuse_address).start()
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
    default behaviour is back (a second Ctrl-C during a slow shutdown still ends the process). Where the loop cannot
    take signal handlers (not the main thread, no signal support) nothing is installed."""
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
