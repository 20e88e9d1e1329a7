"""Which strings are base URLs of an HTTP server: one rule for every option that names one (``--upstream``,
``--metrics-url``, ``--shadow``); and the forms of a request target a front door takes (RFC 9112 3.2). Pure."""

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


def origin_form(raw_target: str) -> str | None:
    """The target to forward, byte for byte: an origin-form target (RFC 9112 3.2.1) as it is; an absolute-form one
    (3.2.2, which a server must accept) without its scheme and authority, the rest untouched ("/" when its path is
    empty, 3.2.1); None for the authority and asterisk forms (3.2.3, 3.2.4), which name no resource."""
    if raw_target.startswith("/"):
        return raw_target
    scheme, sep, rest = raw_target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return None
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    tail = rest[cut:]
    return tail if tail.startswith("/") else "/" + tail


def target_path(target: str) -> str:
    """A target's path as records and rules see it: raw, without the query string (or a fragment a client should
    not have sent), which may carry keys and is written nowhere."""
    end = min((i for i in (target.find("?"), target.find("#")) if i >= 0), default=len(target))
    return target[:end]
