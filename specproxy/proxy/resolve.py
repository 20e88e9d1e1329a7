"""The upstream's addresses, looked up once per ``ttl_s`` however many connections are opened meanwhile.

An engine behind a name (``http://vllm:8000`` in Compose or Kubernetes) would otherwise cost a lookup per new
connection, run in the event loop's thread pool: at a burst of hundreds of streams that is hundreds of lookups
queued on a few threads before the first request goes out. aiohttp's client caches for 10 s, and so does this
(a changed record is seen within that). Lookups that overlap share one; a failed lookup is not cached.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

DNS_TTL_S = 10.0

Address = tuple[int, int, int, str, Any]  # (family, type, proto, canonname, sockaddr) as getaddrinfo gives them


class Resolver:
    __slots__ = ("_at", "_cached", "_pending", "host", "lookups", "port", "ttl_s")

    def __init__(self, host: str, port: int, ttl_s: float = DNS_TTL_S) -> None:
        self.host, self.port, self.ttl_s = host, port, ttl_s
        self._cached: list[Address] | None = None
        self._at = 0.0
        self._pending: asyncio.Future[list[Address]] | None = None
        self.lookups = 0  # lookups made (for tests)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        sockaddr = (host, port, 0, 0) if ip.version == 6 else (host, port)
        literal = (family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)
        self._cached, self._at = [literal], float("inf")  # an address literal: nothing to look up

    async def addresses(self) -> list[Address]:
        loop = asyncio.get_running_loop()
        if self._cached is not None and loop.time() - self._at < self.ttl_s:
            return self._cached
        if self._pending is None:
            self._pending = loop.create_future()
            self._pending.add_done_callback(_retrieved)
            try:
                self.lookups += 1
                infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
                found: list[Address] = []
                for info in infos:
                    if info not in found:
                        found.append(info)
                self._cached, self._at = found, loop.time()
                self._pending.set_result(found)
            except BaseException as e:  # OSError, or the waiter cancelled: those waiting on it are told the same
                self._pending.set_exception(e if isinstance(e, OSError) else OSError(f"lookup cancelled: {e!r}"))
                raise
            finally:
                self._pending = None
            return found
        return await asyncio.shield(self._pending)


def _retrieved(fut: asyncio.Future[list[Address]]) -> None:
    if not fut.cancelled():
        fut.exception()  # read, so that a failure nobody else awaited is not logged as never retrieved
