"""A response's framed body read by llhttp (through httptools, the parser under uvicorn and aiohttp's own), for the
relay's client (:mod:`specproxy.proxy.upstream`). Pure: bytes in, body bytes out.

Why: the body is the per-read work. Every read of a stream goes through here in the connection's ``data_received``,
and llhttp takes the chunked framing off in C, several times faster per read than :class:`http1.Chunked` in Python.

The head has been read and judged by :mod:`specproxy.proxy.http1` first (it stays the stricter of the two: versions,
status classes, 1xx, the 64 KiB cap, transfer codings). llhttp reads that head again, so a head is accepted only if
both accept it, then reads the body. On top of llhttp:

- bare LF ends the head's lines (RFC 9112 2.2 allows it, as :mod:`http1` does), and whitespace may follow a chunk
  size (``lenient_optional_cr_before_lf``, ``lenient_spaces_after_chunk_size``); llhttp still refuses a bare LF after
  a chunk size, extensions that are not tokens or quoted strings and trailers that are not field lines;
- llhttp keeps no limit on framing: chunk extensions are skipped as they come and a trailer is held whole until it
  ends. Framing without body bytes is bounded here instead, per read: more than :data:`http1.MAX_CHUNK_LINE` bytes of
  it across reads that carry no body, or within a read that carries less body than framing, is refused at once;
- where the body ends: llhttp would go on to read a next response. Any byte after the end other than empty lines
  (which llhttp skips) fails it, which says the connection is not to be reused.
"""

from __future__ import annotations

import httptools

from specproxy.proxy.http1 import MAX_CHUNK_LINE, InvalidResponse


class _Past(Exception):
    """A response began after the body's end: bytes nobody asked for."""


class Body:
    """One response's body after ``head`` (the bytes up to and including its empty line); :meth:`feed` returns the
    body bytes in a read and whether the body ended (None: not yet; False: ended with the read; True: bytes followed
    it). ``head`` is checked by llhttp here (:class:`InvalidResponse` if it refuses it)."""

    __slots__ = ("_parser", "_pieces", "_run", "done", "on_body")

    def __init__(self, head: bytes) -> None:
        self._pieces: list[bytes] = []
        self.on_body = self._pieces.append  # llhttp calls it once per chunk: no Python frame of ours in between
        self.done = False
        self._run = 0  # framing bytes since the last read that carried body bytes
        self._parser = httptools.HttpResponseParser(self)
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True)
        try:
            self._parser.feed_data(head)
        except httptools.HttpParserError as e:
            raise InvalidResponse(_reason(e, "head")) from None

    # -- llhttp's callbacks
    def on_message_begin(self) -> None:
        if self.done:
            raise _Past

    def on_message_complete(self) -> None:
        self.done = True

    def feed(self, data: bytes) -> tuple[bytes, bool | None]:
        if self.done:
            return b"", bool(data)
        pieces = self._pieces
        past = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            if not self._ended():
                pieces.clear()
                raise InvalidResponse(_reason(e)) from None
            past = True  # a byte after the end that llhttp would not skip
        if not pieces:
            body = b""
        elif len(pieces) == 1:
            body = pieces[0]
            pieces.clear()
        else:
            body = b"".join(pieces)
            pieces.clear()
        framing = len(data) - len(body)  # with the bytes after the end, if any: where the end was is not known
        if body:
            self._run = 0
            if framing > MAX_CHUNK_LINE and framing > len(body):
                raise InvalidResponse(f"{framing} bytes of chunk framing beside {len(body)} of data in one read")
        else:
            self._run += framing
            if self._run > MAX_CHUNK_LINE:
                raise InvalidResponse(f"a chunk-size, extension or trailer line over {MAX_CHUNK_LINE} bytes")
        return body, past if self._ended() else None

    def _ended(self) -> bool:
        """``done`` as llhttp's callback left it in ``feed_data``: read through a call, since after ``if self.done``
        the type checker takes it as False from then on, and the compiled module would too."""
        return self.done


# llhttp's reasons (llhttp/src/native/...: "Invalid character in chunk size" and the like) in the words the rest of
# the relay's errors use, so a record says the same whichever parser read the body
_REASONS = (
    ("chunk size", "an invalid chunk size"),
    ("after chunk data", "chunk data longer than its size"),
    ("chunk extension", "an invalid chunk extension"),
    ("header", "an invalid trailer line"),
)


def _reason(e: Exception, where: str = "body") -> str:
    said = str(e)[:80] or type(e).__name__
    if where == "body":
        for key, words in _REASONS:
            if key in said:
                return f"{words} (llhttp: {said})"
    return f"the {where} as llhttp reads it: {said}"
