"""Which strings are base URLs of an HTTP server: one rule for every option that names one (``--upstream``,
``--metrics-url``, ``--shadow``). Pure."""

from __future__ import annotations

from urllib.parse import urlsplit


def http_url(value: str) -> str | None:
    """``value`` as a base URL (no trailing slash) when it is an ``http://`` or ``https://`` URL with a host and, if
    given, a port that is a number in range; None otherwise (``http://[::1`` with its IPv6 address unclosed,
    ``http://h:99999``)."""
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  # a port that is not a number, or out of range, raises here
    except ValueError:
        return None
    return value.rstrip("/") if ok else None
