"""The front door: what the proxy takes from a client before it relays anything, and what it tells a client (and
its records) when something fails: error texts are one printable line without raw bytes, query strings or the
upstream's address."""

from __future__ import annotations

from specproxy.core.errors import one_line


def test_one_line() -> None:
    multi = (
        "400, message=\"Bad status line:\n\n  b'GAR\\x00BAGE'\n    ^\", url='http://10.1.2.3:8000/v1/x?api_key=sk-1'"
    )
    assert one_line(multi, hosts=["10.1.2.3"]) == "400, message=\"Bad status line: <bytes>\", url='upstream/v1/x'"
    assert one_line("Cannot connect to host 10.1.2.3:8000 ssl:default", hosts=["10.1.2.3"]) == (
        "Cannot connect to host upstream ssl:default"
    )
    assert one_line("see https://u:p@docs.example/x?utm=1#a and /v1/models?key=2 ok?") == (
        "see https://docs.example/x and /v1/models ok?"
    )
    assert one_line("a\x00b\r\nc\u2028d\te") == "a b c d e"
    cut = one_line("x" * 1000, 50)
    assert len(cut) == 50 and cut.endswith("\u2026")
    assert one_line("日本語のエラー") == "日本語のエラー"
