"""Responses whose upstream connection closed under a read that would never end.

When aiohttp's HTTP parser fails in the middle of a response body (an invalid chunk size, say), aiohttp (seen in
3.14) closes the connection and stops its own read timer, but never wakes the reader of that body. The relay would
wait forever, and its client with it. So every relayed response is watched here, and a sweep once a second fails the
read of any whose connection has been closed for a whole sweep without its body ending: the relay then breaks the
client's stream, as it does when the upstream resets. Waiting one sweep first means a body that ends with its
connection (an HTTP/1.0 reply read to the close) is never cut: its end arrives as the connection closes.
"""

from __future__ import annotations

import asyncio

import aiohttp

SWEEP_S = 1.0


class StalledReads:
    __slots__ = ("_watched",)

    def __init__(self) -> None:
        self._watched: dict[aiohttp.ClientResponse, bool] = {}  # response -> found closed at the last sweep

    def watch(self, response: aiohttp.ClientResponse) -> None:
        self._watched[response] = False

    def forget(self, response: aiohttp.ClientResponse) -> None:
        self._watched.pop(response, None)

    def sweep(self) -> None:
        """Fail the reads that have stalled on a closed connection since the last sweep (each one's record says
        so: the relay ends it as ``upstream_reset``)."""
        for response, seen in list(self._watched.items()):
            content = response.content
            if content.is_eof() or content.exception() is not None:
                continue  # ended, or its reader is told already
            conn = response.connection
            if conn is not None and not conn.closed:
                self._watched[response] = False
                continue
            if not seen:
                self._watched[response] = True
                continue
            del self._watched[response]
            content.set_exception(aiohttp.ClientPayloadError(_reason(conn)))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep()


def _reason(conn: aiohttp.connector.Connection | None) -> str:
    cause = None
    protocol = conn.protocol if conn is not None else None
    if protocol is not None:
        cause = protocol.exception()
    why = f" after {type(cause).__name__}" if cause is not None else ""
    return f"its connection closed before the body ended{why} (the body was not valid HTTP/1.1)"
