"""Error texts as records keep them and clients receive them: one line, printable, bounded, without secrets.

The texts are built from messages that were not written for that. aiohttp's parser errors span lines and quote the
upstream's raw bytes (``b'GAR\\x00BAGE'``); its client errors name the request's URL, query string included (which
may carry an API key: ``?api_key=...``), and the upstream's internal address; an engine's own error message can be
anything. :func:`one_line` makes any of them safe to write into a record's ``error`` field or a 502 body: Python
byte literals become ``<bytes>`` (and the caret pointing into them goes), URLs lose their query string and
fragment, the hosts named in ``hosts`` (the upstream's) become ``upstream``, every other query string goes, control
characters and line breaks become spaces, and the result is cut to ``limit`` characters. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# b'...' or b"..." with escapes, as repr() writes bytes (also inside bytearray(...))
_BYTES = re.compile(r"""\bb(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
# scheme://authority/path?query#fragment, up to a space, a quote or a bracket that closes the text around it
_URL = re.compile(r"""\b([a-zA-Z][a-zA-Z0-9+.\-]*://)([^\s/?#'"<>]*)([^\s?#'"<>]*)([?#][^\s'"<>]*)?""")
# the caret with which a parser error points into the bytes it quoted, once those are gone
_CARET = re.compile(r"""\s+\^+(?=[\s"')\]]|$)""")
# a query string that is not part of a full URL: "/v1/models?api_key=..." (at least one character after the "?")
_QUERY = re.compile(r"""(?<=[\w/.~%\-])\?[^\s'"<>]+""")

ELLIPSIS = "\u2026"


def one_line(text: object, limit: int = 200, *, hosts: Iterable[str] = ()) -> str:
    """``text`` (any object, through ``str``) as one printable line of at most ``limit`` characters, without raw
    bytes, query strings or the given ``hosts`` (each also with a ``:port``), which read ``upstream``."""
    s = str(text)
    s = s[: max(8 * limit, 4096)]  # bounded work whatever the message's size
    s = _BYTES.sub("<bytes>", s)
    hidden = [h.lower() for h in hosts if h]

    def url(m: re.Match[str]) -> str:
        scheme, authority, path = m.group(1), m.group(2), m.group(3)
        host = authority.rsplit("@", 1)[-1]  # user:password@ never survives either
        bare = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if host.lower() in hidden or bare.lower() in hidden or bare.strip("[]").lower() in hidden:
            return "upstream" + path
        return scheme + host + path

    s = _URL.sub(url, s)
    s = _QUERY.sub("", s)
    s = _CARET.sub("", s)
    for h in hidden:
        s = re.sub(rf"(?<![\w.\-]){re.escape(h)}(?::\d+)?(?![\w.\-])", "upstream", s, flags=re.IGNORECASE)
    s = "".join(c if c.isprintable() else " " for c in s)
    s = " ".join(s.split())
    if len(s) > limit:
        s = s[: max(limit - 1, 0)].rstrip() + ELLIPSIS
    return s


def shown_url(url: str) -> str:
    """A URL as logs and banners may show it: without ``user:password@`` (an upstream's credentials)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rsplit('@', 1)[-1]}{slash}{path}"
