"""Which strings are base URLs of an HTTP server (specproxy.core.urls.http_url)."""

from __future__ import annotations

import pytest

from specproxy.core.urls import http_url


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://localhost:8000", "http://localhost:8000"),
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
        ("http://h:8000///", "http://h:8000"),
        ("http://[::1]:8000/", "http://[::1]:8000"),
        ("http://10.0.0.1", "http://10.0.0.1"),
        ("HTTP://h", "HTTP://h"),  # urlsplit lower-cases the scheme: accepted, kept as given
    ],
)
def test_http_urls_are_kept_without_their_trailing_slash(value: str, expected: str) -> None:
    assert http_url(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "localhost:8000", "ftp://h", "http://", "http:///path", "http://[::1", "http://h:99999", "http://h:port"],
)
def test_anything_else_is_none(value: str) -> None:
    assert http_url(value) is None
