"""One relayed request's way through the proxy, whichever front door took it: the target and the fields that go
upstream, the upstream's answer, the stream read by read, and the outcome its record gets.

Two front doors serve clients. aiohttp's (:mod:`specproxy.proxy.server`) takes every request; the fast lane
(:mod:`specproxy.proxy.frontdoor`) takes the common one (a POST whose head and body are plainly formed) off it
before aiohttp sees the connection. Both hand :func:`relay_request` a :class:`Front`: what the flow needs of the
client's side (its fields; a whole answer; a streamed one begun, drained, ended or cut), so a request relayed
through either is relayed, recorded and answered by the same code.

Byte for byte (RFC 9112 3.2): the target is forwarded as sent after the upstream's path, and recorded without its
query string; the client's fields go upstream as the bytes it sent, less the hop-by-hop ones. A request whose pooled
connection fails before any byte of an answer (the upstream closed it as it was reused) is sent once more on a new
connection (:meth:`specproxy.proxy.upstream.Pool.request`). Error texts, in records and in the proxy's own error
responses, go through :func:`specproxy.core.errors.one_line`, without the upstream's host.

The relay reads nothing of what it relays: it hands events to the bookkeeping (:class:`specproxy.proxy.link.
EventLink`: the request, the response head, each read with the time it arrived, the outcome).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson
from yarl import URL

from specproxy.core.errors import one_line
from specproxy.core.headers import REQUEST_ID_HEADER, WORKLOAD_HEADER
from specproxy.core.request_body import Body
from specproxy.proxy.config import ProxyConfig, basic_authorization
from specproxy.proxy.http1 import Head
from specproxy.proxy.link import EventLink, Relayed
from specproxy.proxy.upstream import Exchange, Pool, Sink, UpstreamError, request_head
from specproxy.serving import InFlight

log = logging.getLogger("specproxy.proxy")

# RFC 9110 7.6.1 hop-by-hop fields, plus the ones a proxy must recompute.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
# the body has been read already: an Expect: 100-continue is answered here, not passed on
_REQ_DROP = HOP_BY_HOP | {"host", "content-length", "expect", WORKLOAD_HEADER.lower()}
_RESP_DROP = HOP_BY_HOP | {"content-length"}
_REQ_DROP_RAW = frozenset(h.encode() for h in _REQ_DROP)  # for the fields as the client sent them


@dataclass(frozen=True, slots=True)
class Upstream:
    """The upstream's base URL, taken apart once: requests go to ``host:port``, with ``authority`` as their Host,
    ``prefix`` + the target as sent as their target (no requoting, no dot segments removed)."""

    scheme: str
    host: str
    port: int
    authority: str  # the Host field: the host, and the port unless it is the scheme's
    prefix: str  # the base URL's path as written, without a trailing slash ("" for none)
    hosts: tuple[str, ...]  # its host, as error texts must not show it
    authorization: str | None = field(repr=False)  # --upstream-credentials-file or the URL's, for requests without

    @property
    def authorization_field(self) -> bytes | None:
        """:attr:`authorization` as the bytes of a field value (as a client's field would have been sent)."""
        a = self.authorization
        return None if a is None else a.encode("utf-8", "surrogateescape")

    @classmethod
    def parse(cls, base: str, authorization: str | None = None) -> Upstream:
        url = URL(base)
        host = url.raw_host or ""
        auth = authorization
        if auth is None and url.user is not None:
            auth = basic_authorization(url.user or "", url.password or "")
        return cls(
            url.scheme,
            host,
            url.port or 80,
            url.host_port_subcomponent or host,
            urlsplit(base).path.rstrip("/"),
            (host, f"[{host}]"),
            auth,
        )


@dataclass(slots=True)
class Relay:
    """What every relayed request of one relay process shares: its settings, the upstream, the events' way to the
    bookkeeping, the handlers in flight, and (once the app has started) the connections to the upstream."""

    cfg: ProxyConfig
    upstream: Upstream
    link: EventLink
    in_flight: InFlight
    pool: Pool | None = None

    def safe(self, text: str) -> str:
        """An error text fit for a record and for the client: one line, no raw bytes, no query string, no upstream
        host."""
        return one_line(text, hosts=self.upstream.hosts)

    @property
    def closed(self) -> bool:
        """``--fail-closed`` and records cannot be written: every request is turned away (:data:`CLOSED_BODY`)."""
        return self.cfg.fail_closed and not self.link.healthy


class Front(Protocol):
    """The client's side of one request, as the relay's flow needs it."""

    method: str

    def get(self, name: str) -> str | None:
        """The first value of the request's field ``name`` (lower case), or None."""

    def forward_fields(self, authorization: bytes | None) -> list[tuple[bytes, bytes]]:
        """The client's fields for the upstream, as the bytes it sent, without the hop-by-hop ones (those named in
        its Connection too); ``authorization`` (the upstream's credentials) for a request that brings none."""

    def answer(self, status: int, body: bytes, rid: str | None) -> None:
        """A whole JSON answer from the proxy itself (an error)."""

    async def start(self, status: int, reason: str, fields: list[tuple[str, str]], length: int | None) -> Any:
        """Send the answer's head; the client's transport to write the body to, or None when the client is gone."""

    async def drain(self) -> None:
        """Wait until the client's buffer has room again (ConnectionResetError if it went away)."""

    async def end(self) -> None:
        """The body is whole: end it as it is framed (ConnectionResetError if the client went away)."""

    def abort(self) -> None:
        """Cut the client's connection: the upstream broke mid-answer and the client must see the break."""

    @property
    def chunked(self) -> bool:
        """The body goes to the client in chunked framing."""


def error_body(message: str, code: int, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


CLOSED_BODY = error_body("specproxy cannot write records (--fail-closed)", 503, "ServiceUnavailable")
# The proxy's own endpoints, answered for GET and HEAD on their exact raw path (in origin or absolute form, with any
# query) by the bookkeeper, which describes the whole proxy whichever relay is asked; any other spelling of them
# (/v1/../specproxy/status, /specproxy/%73tatus) is a path like any other and goes to the upstream as sent.
OWN_PATHS = frozenset(("/specproxy/metrics", "/specproxy/status"))


def forward_fields(
    raw: Sequence[tuple[bytes, bytes]], connection: list[str], authorization: bytes | None
) -> list[tuple[bytes, bytes]]:
    """:meth:`Front.forward_fields` from the fields as sent and the elements of the request's Connection field."""
    drop = _REQ_DROP_RAW | {t.encode("utf-8", "surrogateescape") for t in connection} if connection else _REQ_DROP_RAW
    out = [(k, v) for k, v in raw if k.lower() not in drop]
    if authorization is not None and not any(k.lower() == b"authorization" for k, _ in out):
        out.append((b"Authorization", authorization))
    return out


async def relay_request(front: Front, r: Relay, target: str, path: str, body: Body) -> None:
    """Relay one request whose body has been read; its record gets the outcome. A cancellation (the client left, or
    the stop cut it) and a failure of ours are recorded and raised again."""
    link = r.link
    # the body and the request's facts go to the bookkeeping as they are: parsing, rules and the rest happen there
    relayed = link.begin(front.method, path, front, front.get(WORKLOAD_HEADER.lower()), body)
    outcome: str = "proxy_error"
    error: str | None = "unfinished"
    try:
        outcome, error = await _relay(front, r, target, body, relayed)
    except asyncio.CancelledError:
        cut_by = r.in_flight.cut_reason
        if cut_by is not None:  # the proxy is stopping and cut this stream, not the client
            outcome, error = "shutdown", f"cut by shutdown: {cut_by}"
        else:
            outcome, error = "client_cancelled", "client disconnected"
        raise
    except Exception as e:  # never let our own failure pass silently: record it, answer 502 if we still can
        log.exception("relay failed")
        outcome, error = "proxy_error", r.safe(f"{type(e).__name__}: {e}")
        raise
    finally:
        link.finish(relayed, outcome, error)


async def _relay(front: Front, r: Relay, target: str, body: Body, relayed: Relayed) -> tuple[str, str | None]:
    up = r.upstream
    head = request_head(
        front.method, up.prefix + target, up.authority, front.forward_fields(up.authorization_field), body.size
    )

    def resending(why: str) -> None:
        relayed.retried = why

    assert r.pool is not None
    try:
        ex = await r.pool.request(front.method, head, body.pieces() if body.size else [], resending)
    except UpstreamError as e:
        reason = r.safe(str(e))
        if relayed.retried:
            reason += " (sent twice: the first on a reused connection that failed before any answer)"
        if e.kind in ("connect_timeout", "head_timeout"):
            front.answer(504, error_body(reason, 504, "GatewayTimeout"), relayed.request_id)
            return "timeout", reason
        front.answer(502, error_body(reason, 502, "BadGateway"), relayed.request_id)
        return "upstream_error", reason
    try:
        return await _relay_body(front, r, ex, relayed)
    finally:
        ex.abort()  # cut one still streaming (client gone, relay failed): the engine aborts it; else nothing


async def _relay_body(front: Front, r: Relay, ex: Exchange, relayed: Relayed) -> tuple[str, str | None]:
    link = r.link
    head = await ex.head()
    link.head(relayed, head.status, first(head, "Content-Type"), first(head, "Content-Encoding"))
    fields, length = reply_fields(head, relayed.request_id)
    transport = await front.start(head.status, head.reason, fields, length)
    if transport is None:
        return "client_cancelled", "client disconnected"
    outcome, error = "ok", None
    if head.status >= 400:
        outcome, error = "upstream_error", f"HTTP {head.status}"
    try:
        await ex.relay(client_sink(transport, front.chunked, link, relayed), front.drain)
    except ConnectionResetError:
        return "client_cancelled", "client disconnected"
    if ex.outcome != "ok":  # the upstream broke mid-response or went quiet: the client must see the break
        front.abort()
        return ex.outcome, r.safe(ex.error or ex.outcome)
    try:
        await front.end()
    except ConnectionResetError:
        return "client_cancelled", "client disconnected"
    return outcome, error


def reply_fields(head: Head, rid: str) -> tuple[list[tuple[str, str]], int | None]:
    """The upstream's fields as the client gets them (without the hop-by-hop ones, with the request's id, and for
    an event stream the fields that keep buffering proxies from holding it), and the body's length when the upstream
    declared it (the exact bytes are relayed undecoded, so it stays true; HEAD: as sent)."""
    connection = head.tokens("Connection")  # fields named in it are hop-by-hop too (RFC 9110 7.6.1)
    drop = _RESP_DROP.union(connection) if connection else _RESP_DROP
    out = [(k, v) for k, v in head.fields if k.lower() not in drop]
    put(out, REQUEST_ID_HEADER, rid)
    content_type = first(head, "Content-Type")
    if content_type and content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
        put(out, "X-Accel-Buffering", "no")
        if not any(k.lower() == "cache-control" for k, _ in out):
            out.append(("Cache-Control", "no-cache"))
    length = first(head, "Content-Length")
    if length is not None and not head.values("Transfer-Encoding") and length.isascii() and length.isdigit():
        return out, int(length)
    return out, None


def put(fields: list[tuple[str, str]], name: str, value: str) -> None:
    """Set ``name`` to ``value`` as a multidict's item assignment does: in the place of its first occurrence (any
    case), the others removed; at the end when it is not there."""
    low = name.lower()
    at = [i for i, (k, _) in enumerate(fields) if k.lower() == low]
    if not at:
        fields.append((name, value))
        return
    fields[at[0]] = (name, value)
    for i in reversed(at[1:]):
        del fields[i]


def first(head: Head, name: str) -> str | None:
    values = head.values(name)
    return values[0] if values else None


def client_sink(transport: Any, chunked: bool, link: EventLink, relayed: Relayed) -> Sink:
    """What the upstream connection does with each read of a reply's body, in its own callback: the bytes to the
    client first (framed as the client's response is), then the event to the bookkeeping; True when the client's
    buffer is full."""
    high = transport.get_write_buffer_limits()[1]
    perf = time.perf_counter_ns
    chunk = link.chunk

    def sink(t: int, data: bytes) -> bool:
        if transport.is_closing():
            return False  # the client left: its handler is being cancelled, which cuts the upstream
        if not chunked:
            transport.write(data)
        elif len(data) < 16384:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        b = perf()
        try:
            chunk(relayed, t, data)  # appends an event, or sheds it: never waits
        except Exception:  # a bug of ours: the stream goes on, the record says its events are incomplete
            log.exception("appending a chunk event failed")
            relayed.shed = True
        # what recording adds to relaying this read (the write itself is what any proxy pays)
        ns = perf() - b
        relayed.ov_ns += ns
        relayed.ov_n += 1
        if ns > relayed.ov_max:
            relayed.ov_max = ns
        return bool(transport.get_write_buffer_size() > high)

    return sink
