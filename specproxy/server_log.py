"""What aiohttp's server logs about a request it could not parse: one line, never the request's bytes.

aiohttp logs such a request (a malformed request line, a bad header, an HTTP version it does not speak) at ERROR, with
a traceback whose message quotes the raw request line, query string included: an API key sent as ``?key=...`` would
reach the proxy's log and, through it, the disk. A client's malformed request is not the proxy's failure either. The
filter turns each such record into one WARNING line that names the error and the client, without the bytes, and
takes query strings out of any other line the server logs.
"""

from __future__ import annotations

import logging
import re

from aiohttp.http_exceptions import HttpProcessingError

SERVER_LOGGER = "aiohttp.server"
_QUERY = re.compile(r"\?[^\s'\"]*")
_QUOTED = ("b'", 'b"', "^")


def _reason(exc: HttpProcessingError) -> str:
    """The error's own words without the quoted bytes and the caret line under them."""
    lines = [ln.strip() for ln in str(exc.message).splitlines()]
    words = " ".join(ln for ln in lines if ln and not ln.startswith(_QUOTED)).rstrip(":")
    return _QUERY.sub("?...", words) or type(exc).__name__


class BadRequestLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = ""
            if isinstance(record.args, tuple) and record.args:
                peer = f" from {record.args[-1]}"  # aiohttp: "Error handling request from %s"
            record.msg = "unparsable request%s: %s %s (request bytes not logged)"
            record.args = (peer, exc.code, _reason(exc))
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            if record.levelno > logging.WARNING:  # aiohttp says ERROR; a debug record stays debug
                record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        message = record.getMessage()
        if "?" in message:
            record.msg, record.args = _QUERY.sub("?...", message), ()
        return True


_FILTER = BadRequestLine()


def quiet_bad_requests() -> None:
    """Attach the filter to aiohttp's server logger (once; a forked process keeps it)."""
    logger = logging.getLogger(SERVER_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
