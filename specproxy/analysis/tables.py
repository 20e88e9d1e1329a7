"""Plain tables and their renderings: aligned text for a terminal, GitHub-flavoured markdown, CSV.

A :class:`Table` holds strings already formatted; numbers are formatted once by the helpers here, so every output
format shows the same figures. Pure: tables in, text out.
"""

from __future__ import annotations

import csv
import io
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


def render_text(tables: Sequence[Table]) -> str:
    out: list[str] = []
    for t in tables:
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


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_md(tables: Sequence[Table], heading: str = "###") -> str:
    out: list[str] = []
    for t in tables:
        if t.title:
            out.append(f"{heading} {t.title}")
            out.append("")
        out.append("| " + " | ".join(_md_cell(h) for h in t.headers) + " |")
        out.append("|" + "|".join("---:" if t.alignment(i) == "r" else "---" for i in range(len(t.headers))) + "|")
        out.extend("| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows)
        if t.notes:
            out.append("")
            out.extend(f"- {_md_cell(n)}" for n in t.notes)
        out.append("")
    return "\n".join(out)


def render_csv(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    for r in rows:
        w.writerow(["" if v is None else v for v in r])
    return buf.getvalue()
