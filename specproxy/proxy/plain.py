"""The plain request, which the fast lane (:mod:`specproxy.proxy.frontdoor`) reads itself, and the heads of the answers
it writes. Pure: bytes in, facts out.

Plain is strict: ``POST``, or ``GET`` without a body, of an origin-form target in printable ASCII, HTTP/1.1, every
line ended by CRLF, field names that are tokens with the colon right after them, no control character but tab in a
value, one Content-Length of digits at most (none: no body), no Transfer-Encoding, Expect or Upgrade, the head within
:data:`MAX_HEAD` and :data:`MAX_FIELDS`, the body within :data:`FAST_BODY_MAX` and ``--max-body``. Anything else is
not read here at all: :func:`parse_request` says None and aiohttp reads it, as it reads every request without the
fast lane. An answer's head (:func:`answer_head`) is what aiohttp writes for the same response to an HTTP/1.1
request.
"""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from http import HTTPStatus

from aiohttp.http import SERVER_SOFTWARE

from specproxy.core.urls import target_path
from specproxy.proxy.http1 import list_elements

MAX_HEAD = 16 * 1024  # a longer head is aiohttp's (its own limits apply)
MAX_FIELDS = 100
FAST_BODY_MAX = 1 << 20  # a larger body is aiohttp's: it is read in pieces, never copied into one
NEED_MORE = 0  # parse_request: the head is not whole yet

_LINE = re.compile(rb"(POST|GET) (/[!-~]*) HTTP/1\.1")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_AIOHTTPS = frozenset((b"transfer-encoding", b"expect", b"upgrade"))
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class PlainRequest:
    """A request the fast lane takes: its target as sent, the fields as sent, and where its bytes end."""

    __slots__ = ("close", "connection", "fields", "head_len", "length", "method", "path", "target")

    def __init__(self, method: str, target: str, fields: list[tuple[bytes, bytes]], head_len: int, length: int):
        self.method = method
        self.target = target
        self.path = target_path(target)
        self.fields = fields
        self.head_len = head_len
        self.length = length
        self.connection = list_elements(v.decode("latin-1") for k, v in fields if k.lower() == b"connection")
        self.close = "close" in self.connection

    @property
    def size(self) -> int:
        """The request's bytes, head and body."""
        return self.head_len + self.length

    def get(self, name: str) -> str | None:
        """The first value of the field ``name`` (lower case), decoded as aiohttp decodes it."""
        key = name.encode()
        for k, v in self.fields:
            if k.lower() == key:
                return v.decode("utf-8", "surrogateescape")
        return None


def parse_request(buf: bytes | bytearray, max_body: int, seen: int = 0) -> PlainRequest | int | None:
    """The request at the start of ``buf``: a :class:`PlainRequest` when it is one the fast lane takes,
    :data:`NEED_MORE` while its head is incomplete (and may still be one), None when it is aiohttp's. ``seen``: how
    many bytes of ``buf`` an earlier call answered :data:`NEED_MORE` for; only what came after them is searched, so a
    head that comes a byte at a time costs linear time, not quadratic."""
    from_ = max(0, seen - 3)
    end = buf.find(b"\r\n\r\n", from_, MAX_HEAD)
    if end < 0:
        # what came since: from a CR that ended the bytes seen, which may have awaited its LF (as the last may now)
        new = bytes(buf[seen - 1 if seen and buf[seen - 1] == 13 else seen : MAX_HEAD]).removesuffix(b"\r")
        crlf = new.count(b"\r\n")
        if new.count(b"\n") != crlf or new.count(b"\r") != crlf or len(buf) >= MAX_HEAD:
            return None  # a bare LF or CR (aiohttp's reading of it is the one that counts), or a head too long
        return NEED_MORE
    head = bytes(buf[:end])
    crlf = head.count(b"\r\n")
    if head.count(b"\n") != crlf or head.count(b"\r") != crlf:
        return None
    lines = head.split(b"\r\n")
    m = _LINE.fullmatch(lines[0])
    if m is None or len(lines) > MAX_FIELDS + 1:
        return None
    fields: list[tuple[bytes, bytes]] = []
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            return None  # also obs-fold and whitespace before the colon
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value) is not None:
            return None
        low = name.lower()
        if low in _AIOHTTPS:
            return None
        if low == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 15:
                return None
            length = int(value)
        fields.append((name, value))
    length = length or 0
    if length > FAST_BODY_MAX or length > max_body or (length and m[1] == b"GET"):
        return None
    return PlainRequest(m[1].decode("ascii"), m[2].decode("ascii"), fields, end + 4, length)


_date: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date field's value, made once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]


def answer_head(
    status: int, reason: str, fields: list[tuple[str, str]], length: int | None, *, close: bool, chunked: bool = False
) -> bytes:
    """An answer's head as aiohttp writes it for a response to an HTTP/1.1 request: the fields given, then the
    framing (Content-Length or Transfer-Encoding), Content-Type when a body has none, Date and Server when absent,
    and Connection: close when the connection ends."""
    names = {k.lower() for k, _ in fields}
    out = [f"HTTP/1.1 {status} {reason or _REASONS.get(status, '')}\r\n"]
    out += [f"{k}: {v}\r\n" for k, v in fields]
    if length is not None:
        out.append(f"Content-Length: {length}\r\n")
    elif chunked:
        out.append("Transfer-Encoding: chunked\r\n")
    has_body = chunked or (length is not None and length != 0 and status not in (204, 304) and status >= 200)
    if has_body and "content-type" not in names:
        out.append("Content-Type: application/octet-stream\r\n")
    if "date" not in names:
        out.append(f"Date: {_http_date()}\r\n")
    if "server" not in names:
        out.append(f"Server: {SERVER_SOFTWARE}\r\n")
    if close and "connection" not in names:
        out.append("Connection: close\r\n")
    out.append("\r\n")
    return "".join(out).encode("utf-8", "surrogateescape")
