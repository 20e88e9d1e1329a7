"""Comments and docstrings say what the code does and why: no dates, no measured figures.

Measurements and the history of a choice go to CHANGELOG.md and commit messages, where they keep their date and
setting; in a comment they go stale unseen. A comment may name constants and units ("in ms", "every 250 ms", "HTTP
408", "RFC 9110", "64 KiB"); what it may not hold is a figure read off a run: a number with decimals or a range next
to a unit ("3.2 ms", "41-74 ms"), a size or a rate read in KB, MB, GB or tok/s, microseconds, a ratio ("1.85x"), a
rate "per 1,000" things. Option help texts are code, not comments, and are not read here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PKG = Path(__file__).resolve().parent.parent / "specproxy"


_NUM = r"\d+(?:\.\d+)?"
_DECIMAL_OR_RANGE = rf"(?:\d+\.\d+|{_NUM}\s?(?:-|–|to)\s?{_NUM})"
_ANY_UNIT = (
    r"(?:ns|us|µs|μs|ms|s|secs?|seconds|min|minutes|h|hours|[KMGT]i?B|bytes|%|x|×|points|"
    r"tok/s|tokens/s|req/s|requests/s|rps|cores)"
)
_MEASURED_UNIT = r"(?:ns|us|µs|μs|[KMGT]B|tok/s|tokens/s|req/s|requests/s)"  # units a constant is seldom given in
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
FORBIDDEN = re.compile(
    "|".join(
        (
            r"\b(?:19|20)\d{2}-(?:0[1-9]|1[0-2])\b",  # 2025-11-03, 2026-12
            rf"\b{_MONTH} (?:\d{{1,2}},? )?(?:19|20)\d{{2}}\b",  # Nov 2025, March 3, 2026
            rf"(?<![\w.])(?!1\.0+[x×]){_DECIMAL_OR_RANGE}\s?{_ANY_UNIT}(?![\w/])",  # 3.2 ms, 41-74 ms, 1.6 %
            rf"(?<![\w.])\d+(?:,\d{{3}})*\s?{_MEASURED_UNIT}(?![\w/])",  # 148 MB, 12 us, 112 tok/s
            r"(?<![\w.])(?!1(?:\.0+)?[x×])\d+(?:\.\d+)?[x×](?!\w)",  # 1.85x, 4x (1.00x, the no-change line, is fine)
            r"\bper \d{1,3}(?:,\d{3})+\b",  # per 1,000 requests
        )
    )
)

_INLINE_CODE = re.compile(r"``.+?``|`[^`]+`")


def _texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring (a bare string statement: module, class, function or
    attribute docstring) line of a module."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + i, line


def offences(source: str) -> list[tuple[int, str]]:
    """(line, what matched) of each date or measured figure in a module's comments and docstrings. Inline code
    (``5GB``, ``--slo ttft=500ms``) is an example of what a user types, not a figure, and is left out."""
    return sorted(
        (n, m.group(0)) for n, text in _texts(source) for m in FORBIDDEN.finditer(_INLINE_CODE.sub(" ", text))
    )


@pytest.mark.parametrize(
    "text",
    [
        "# a refit cost 41-74 ms at concurrency 256",
        "# about 12.9 us a character",
        "# 3.2 ms per scrape",
        "# the bookkeeper kept 148 MB",
        "# 1.85x faster than before",
        "# a frozen __init__ costs 4x",
        "# at most 0.02 MB per 1,000 events",
        "# 3 allocations per 1,000 events",
        "# measured on 2025-11-03",
        "# as of 2026-12",
        "# seen in Nov 2025",
        "# 5 to 15 ms on a 2-core CPU",
        "# every request 1.6 % faster",
        "# 112 tok/s from the weights alone",
        '"""A record is about 2.5 KB of JSON."""',
    ],
)
def test_a_figure_or_a_date_is_found(text: str) -> None:
    assert offences(text + "\n") != []


@pytest.mark.parametrize(
    "text",
    [
        "# seconds, in ms",
        "# a default of 60 s, nginx's",
        "# every 250 ms while requests are in flight",
        "# HTTP 408 after the body's idle deadline (RFC 9110 15.5.9)",
        "# http://127.0.0.1:8000/v1",
        "# reads of exactly 2**n bytes, up to 64 KiB",
        "# a body over 1 MiB",
        "# 95% intervals, the smallest k within 1% of the best",
        "# not distinguishable from 1.00x",
        "# 3 x 7 = 21 requests",
        "# 0x1F, sha256 of the body, k=3, utf-8",
        "# 16 bytes, 8 bytes for a span id",
        "# at concurrency 256, 1,024 streams",
        '"""``--slo ttft=500ms,tpot=50ms``."""',
        '"""``1.7TB/s``, ``5GB``, ``2e9`` -> bytes."""',
        "# `2023-11-16 18:15:46` as the trace writes it",
    ],
)
def test_constants_and_units_in_prose_are_not_figures(text: str) -> None:
    assert offences(text + "\n") == []


def test_a_docstring_figure_is_found_on_its_line() -> None:
    assert offences('x = 1\n\n\ndef f() -> None:\n    """What.\n\n    It took 3.2 ms."""\n') == [(7, "3.2 ms")]


def test_no_comment_carries_a_date_or_a_measured_figure() -> None:
    found = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        found += [f"specproxy/{rel}:{n}: {what!r}" for n, what in offences(f.read_text(encoding="utf-8"))]
    assert not found, "dates or measured figures in comments (they belong in CHANGELOG.md):\n" + "\n".join(found)
