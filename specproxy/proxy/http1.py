"""HTTP/1.1 responses read from bytes: the head, how the body ends, and chunked framing (RFC 9112). Pure: bytes in,
facts out, no IO; :mod:`specproxy.proxy.upstream` feeds it what it reads from an engine.

As strict as llhttp (what aiohttp parses with) where leniency would let a response be read two ways: no whitespace
before a field's colon, no obs-fold, no control character but tab inside a field or the reason, one Content-Length
at most and never beside Transfer-Encoding, chunk sizes in hex only, chunked as the one transfer coding (a reply
de-chunked but still gzip-coded would reach the client as bytes it cannot know to decode). As lenient as RFC 9112
2.2 allows where nothing can be read two ways: a bare LF ends a line; a chunk size may carry extensions (ignored)
and trailing whitespace; trailers are read and dropped.

The relay reads bodies with llhttp (:mod:`specproxy.proxy.llbody`) after this module has judged the head; the body
reader here (:class:`Framed`) is what it falls back on without httptools, and the reference llhttp is tested against.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

MAX_HEAD_BYTES = 64 * 1024  # a response head (status line and fields) longer than this is refused
MAX_INTERIM = 32  # more 1xx heads than this before the answer are refused (a flood would otherwise hold the relay)
MAX_CHUNK_LINE = 4096  # a chunk-size line (with its extensions) or a trailer line

_STATUS = re.compile(rb"HTTP/(1)\.([01]) ([1-9]\d\d)(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?")
_BARE_CR = re.compile(rb"\r[^\n]")  # a CR that does not end a line: llhttp refuses it at once
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# control characters but tab: aiohttp's server refuses to write them, so they would end in a 500, not a 502
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_HEX_DIGITS = b"0123456789abcdefABCDEF"


class InvalidResponse(ValueError):
    """The upstream's bytes are not an HTTP/1.1 response (or not one that can be read one way only)."""


def head_end(buf: bytes | bytearray, start: int = 0) -> int:
    """Where the head in ``buf`` from ``start`` ends (the index just past its empty line), or -1 while it is
    incomplete. Only ``MAX_HEAD_BYTES`` past ``start`` are searched, so many heads in one buffer cost linear time."""
    stop = start + MAX_HEAD_BYTES + 3
    ends = [i for i in (buf.find(b"\n\r\n", start, stop), buf.find(b"\n\n", start, stop)) if i >= 0]
    if not ends:
        if _BARE_CR.search(buf, start, stop):  # it would never end: fail now rather than at the idle timeout
            raise InvalidResponse("a bare CR in the response head")
        return -1
    i = min(ends)
    return i + (3 if buf[i + 1 : i + 2] == b"\r" else 2)


class Head:
    """A parsed response head: ``version`` (major, minor), ``status``, ``reason``, ``fields`` as sent (decoded as
    aiohttp decodes them: UTF-8, undecodable bytes kept as surrogates)."""

    __slots__ = ("_by_name", "fields", "reason", "status", "version")

    def __init__(self, version: tuple[int, int], status: int, reason: str, fields: list[tuple[str, str]]):
        self.version = version
        self.status = status
        self.reason = reason
        self.fields = fields
        self._by_name: dict[str, list[str]] | None = None

    def values(self, name: str) -> list[str]:
        """Every value of the field ``name`` (any case), in order. The fields are indexed by name once: a head is
        asked for five or six of them (framing, keep-alive, what the client is told), each a scan of all."""
        by_name = self._by_name
        if by_name is None:
            self._by_name = by_name = {}
            for k, v in self.fields:
                by_name.setdefault(k.lower(), []).append(v)
        return by_name.get(name.lower(), [])

    def tokens(self, name: str) -> list[str]:
        """A list-valued field's elements (RFC 9110 5.6.1), lower case, over every line of it."""
        return list_elements(self.values(name))


def list_elements(values: Iterable[str]) -> list[str]:
    """The elements of a list-valued field (RFC 9110 5.6.1) over its lines ``values``, lower case, empty ones left
    out."""
    return [t.strip().lower() for v in values for t in v.split(",") if t.strip()]


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def parse_head(block: bytes) -> Head:
    """A head up to and including its empty line."""
    lines = block.split(b"\n")
    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    m = _STATUS.fullmatch(lines[0])
    if m is None:
        raise InvalidResponse(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
    fields: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            break
        if line[:1] in (b" ", b"\t"):
            raise InvalidResponse("a folded header line (obs-fold)")
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise InvalidResponse(f"an invalid header line: {line[:60]!r}")
        value = value.strip(b" \t")
        if _BAD_VALUE.search(value):
            raise InvalidResponse(f"a control character in header {_text(name)}")
        fields.append((_text(name), _text(value)))
    return Head((int(m[1]), int(m[2])), int(m[3]), _text(m[4] or b""), fields)


# How a response body ends.
NONE = "none"  # no body (HEAD, 1xx, 204, 304)
LENGTH = "length"  # Content-Length bytes
CHUNKED = "chunked"
CLOSE = "close"  # read to the connection's close


def framing(head: Head, method: str) -> tuple[str, int]:
    """The body's framing (RFC 9112 6.3) and its length for ``LENGTH``; a response that could be read two ways
    (Content-Length beside Transfer-Encoding, several Content-Lengths, a length that is not a number) is refused."""
    status = head.status
    if method == "HEAD" or status < 200 or status in (204, 304):
        return NONE, 0
    codings = head.tokens("Transfer-Encoding")
    lengths = head.values("Content-Length")
    if lengths and head.values("Transfer-Encoding"):  # even an empty one (or ","): llhttp refuses it too
        raise InvalidResponse("Content-Length together with Transfer-Encoding")
    if head.values("Transfer-Encoding") and not codings:
        raise InvalidResponse("an empty Transfer-Encoding")
    if codings:
        if codings != ["chunked"]:  # gzip and the like as transfer codings: no engine sends them, no client asks
            raise InvalidResponse(f"a transfer coding other than one chunked: {', '.join(codings)[:60]}")
        return CHUNKED, 0
    if len(lengths) > 1:
        raise InvalidResponse("more than one Content-Length")
    if lengths:
        value = lengths[0]
        if not value.isascii() or not value.isdigit() or len(value) > 18:
            raise InvalidResponse(f"an invalid Content-Length: {value[:30]!r}")
        return LENGTH, int(value)
    return CLOSE, 0


def keeps_alive(head: Head) -> bool:
    """Whether the connection may carry another request after this response (RFC 9112 9.3)."""
    conn = head.tokens("Connection")
    if "close" in conn:
        return False
    return head.version >= (1, 1) or "keep-alive" in conn


class Chunked:
    """Chunked framing taken off as bytes arrive: :meth:`feed` returns the data in them and what follows the
    body's end, if it ended."""

    __slots__ = ("_line", "_need", "_state")

    _SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)

    def __init__(self) -> None:
        self._state = self._SIZE
        self._need = 0  # data bytes left in this chunk
        self._line = b""  # a size or trailer line not yet complete

    @property
    def done(self) -> bool:
        return self._state == self._DONE

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """(the body bytes in ``data``, None while the body goes on, else the bytes after its end)."""
        if self._state == self._DONE:
            return b"", data
        out: list[bytes] = []
        i, n = 0, len(data)
        if self._state == self._SIZE and not self._line:
            # The usual read: whole chunks (an engine writes one event per chunk, each read holds one or more).
            # Anything else (extensions, the last chunk, a chunk cut by the read) goes the general way below.
            while i < n:
                j = data.find(b"\r\n", i, i + 18)
                if j <= i or data[i:j].strip(_HEX_DIGITS):
                    break
                end = j + 2 + int(data[i:j], 16)
                if end == j + 2 or data[end : end + 2] != b"\r\n":
                    break
                out.append(data[j + 2 : end])
                i = end + 2
            if i == n:
                return (out[0] if len(out) == 1 else b"".join(out)), None
        while i < n:
            state = self._state
            if state == self._DATA:
                take = min(self._need, n - i)
                out.append(data[i : i + take])
                i += take
                self._need -= take
                if not self._need:
                    self._state = self._DATA_END
                continue
            line, i = self._read_line(data, i)
            if line is None:
                break
            if state == self._SIZE:
                self._size(line)
            elif state == self._DATA_END:
                if line:
                    raise InvalidResponse("chunk data longer than its size")
                self._state = self._SIZE
            elif not line:  # the empty line after the trailers
                self._state = self._DONE
                return b"".join(out), data[i:]
            else:  # a trailer: dropped, but it must be a field line
                name, colon, value = line.partition(b":")
                if not colon or _TOKEN.fullmatch(name) is None or _BAD_VALUE.search(value):
                    raise InvalidResponse(f"an invalid trailer line: {line[:30]!r}")
        return b"".join(out), None

    def _read_line(self, data: bytes, i: int) -> tuple[bytes | None, int]:
        j = data.find(b"\n", i)
        if j < 0:
            self._line += data[i:]
            if len(self._line) > MAX_CHUNK_LINE:
                raise InvalidResponse(f"a chunk-size or trailer line over {MAX_CHUNK_LINE} bytes")
            return None, len(data)
        line = self._line + data[i:j]
        self._line = b""
        if len(line) > MAX_CHUNK_LINE:
            raise InvalidResponse(f"a chunk-size or trailer line over {MAX_CHUNK_LINE} bytes")
        return (line[:-1] if line.endswith(b"\r") else line), j + 1

    def _size(self, line: bytes) -> None:
        size, _, ext = line.partition(b";")
        size = size.rstrip(b" \t")
        if ext and _BAD_VALUE.search(ext):  # CR, NUL and the like in an extension: llhttp refuses them
            raise InvalidResponse(f"a control character in a chunk extension: {line[:30]!r}")
        if _HEX.fullmatch(size) is None:
            raise InvalidResponse(f"an invalid chunk size: {line[:30]!r}")
        self._need = int(size, 16)
        self._state = self._DATA if self._need else self._TRAILER


class BodyReader(Protocol):
    """Takes the framing off a body read by read: :class:`Framed` or :class:`specproxy.proxy.llbody.Body`."""

    @property
    def done(self) -> bool: ...

    def feed(self, data: bytes) -> tuple[bytes, bool | None]: ...


class Framed:
    """A body framed by Content-Length or chunked, read in Python: what the relay reads with where httptools is not
    installed (:class:`specproxy.proxy.llbody.Body` reads it otherwise), and the reference that one is tested
    against. :meth:`feed` returns the body bytes in a read and whether the body ended (None: not yet; False: ended
    with the read; True: bytes followed it)."""

    __slots__ = ("_chunked", "_left")

    def __init__(self, how: str, length: int) -> None:
        self._chunked = Chunked() if how == CHUNKED else None
        self._left = length

    @property
    def done(self) -> bool:
        return self._chunked.done if self._chunked is not None else self._left == 0

    def feed(self, data: bytes) -> tuple[bytes, bool | None]:
        if self._chunked is not None:
            piece, after = self._chunked.feed(data)
            return piece, None if after is None else bool(after)
        take = data if len(data) <= self._left else data[: self._left]
        self._left -= len(take)
        return take, None if self._left else len(take) < len(data)
