"""Plain tables and their renderings: aligned text for a terminal, GitHub-flavoured markdown, CSV.

A :class:`Table` holds strings already formatted; numbers are formatted once by the helpers here, so every output
format shows the same figures. Cells carry client-controlled strings (a request's model and path, a workload or label
from a header), so every rendering escapes them for its format: :func:`text_cell` for a terminal, :func:`md_cell`
for markdown, :func:`csv_cell` for a spreadsheet (the HTML report uses ``html.escape``). Pure: tables in, text out.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    # "l" or "r" per column; numbers right-aligned.
    align: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def alignment(self, i: int) -> str:
        return self.align[i] if i < len(self.align) else "l"


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_ms(seconds: float | None, digits: int = 1) -> str:
    return "-" if seconds is None else f"{seconds * 1000.0:.{digits}f}"


def fmt_pct(fraction: float | None, digits: int = 1) -> str:
    return "-" if fraction is None else f"{fraction * 100.0:.{digits}f}%"


def fmt_signed_pct(percent: float | None) -> str:
    return "-" if percent is None else f"{percent:+.1f}%"


def fmt_x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def fmt_spread(lo: float | None, hi: float | None, digits: int = 1) -> str:
    return "-" if lo is None or hi is None else f"{lo:.{digits}f}-{hi:.{digits}f}"


# C0 and C1 controls, DEL, and the bidirectional overrides and isolates (Unicode TR9): a terminal acts on the first
# (an ESC sequence can clear the screen or rewrite what was printed), and the last reorder what is shown.
_UNPRINTABLE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _visible(m: re.Match[str]) -> str:
    return m.group(0).encode("unicode_escape").decode("ascii")


def text_cell(text: str) -> str:
    """A cell for a terminal: control and bidi characters shown as escapes (``\\x1b``, ``\\n``), never acted on."""
    return _UNPRINTABLE_RE.sub(_visible, text)


def render_text(tables: Sequence[Table]) -> str:
    out: list[str] = []
    for t in tables:
        t = Table(
            text_cell(t.title),
            tuple(text_cell(h) for h in t.headers),
            tuple(tuple(text_cell(c) for c in r) for r in t.rows),
            t.align,
            tuple(text_cell(n) for n in t.notes),
        )
        widths = [len(h) for h in t.headers]
        for row in t.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def line(cells: Sequence[str], t: Table = t, widths: list[int] = widths) -> str:
            parts = [
                c.rjust(w) if t.alignment(i) == "r" else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  ".join(parts).rstrip()

        if t.title:
            out.append(t.title)
        out.append(line(t.headers))
        out.append("  ".join("-" * w for w in widths))
        out.extend(line(r) for r in t.rows)
        out.extend(f"  {n}" for n in t.notes)
        out.append("")
    return "\n".join(out)


# GitHub-flavoured markdown: a backslash escapes any ASCII punctuation (spec 2.4), so "|" stays in its cell (spec
# 4.10), backticks open no code span and brackets no link or image (an image is fetched when the page is viewed);
# "<", ">" and "&" become entity references so no raw HTML (spec 6.6) reaches the renderer. The backslash itself is
# escaped first, or "\\|" in a name would end the cell.
_MD_ESCAPES = str.maketrans(
    {"\\": "\\\\", "|": "\\|", "`": "\\`", "[": "\\[", "]": "\\]", "<": "&lt;", ">": "&gt;", "&": "&amp;"}
)
_LINE_BREAK_RE = re.compile("\r\n|[\r\n\u2028\u2029]")


def md_cell(text: str) -> str:
    """Text for one markdown table cell, heading or list item: escaped, on one line, without control characters."""
    return text_cell(_LINE_BREAK_RE.sub(" ", text.translate(_MD_ESCAPES)))


def render_md(tables: Sequence[Table], heading: str = "###") -> str:
    out: list[str] = []
    for t in tables:
        if t.title:
            out.append(f"{heading} {md_cell(t.title)}")
            out.append("")
        out.append("| " + " | ".join(md_cell(h) for h in t.headers) + " |")
        out.append("|" + "|".join("---:" if t.alignment(i) == "r" else "---" for i in range(len(t.headers))) + "|")
        out.extend("| " + " | ".join(md_cell(c) for c in r) + " |" for r in t.rows)
        if t.notes:
            out.append("")
            out.extend(f"- {md_cell(n)}" for n in t.notes)
        out.append("")
    return "\n".join(out)


def csv_cell(value: object) -> object:
    """A CSV value that a spreadsheet shows rather than runs: text starting with ``=``, ``+``, ``-``, ``@``, a tab
    or a carriage return is a formula to Excel, LibreOffice and Google Sheets (OWASP "CSV Injection"), so it gets a
    leading ``'``. Only text: numbers, negative ones included, are written as numbers."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def render_csv(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """CSV by the csv module (RFC 4180 quoting: commas, quotes and line breaks stay inside their cell), each cell
    through :func:`csv_cell`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_cell(h) for h in headers])
    for r in rows:
        w.writerow([csv_cell(v) for v in r])
    return buf.getvalue()
