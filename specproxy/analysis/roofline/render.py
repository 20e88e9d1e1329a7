"""The roofline as a table (text, markdown, CSV) and the JSON documented in ``docs/report-json.md``. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specproxy.analysis.report.render import JSON_VERSION
from specproxy.analysis.roofline.model import Roofline
from specproxy.analysis.tables import Table, fmt, fmt_pct


def roofline_rows(r: Roofline, measured: Sequence[tuple[str, float | None, float | None]]) -> list[list[Any]]:
    """``measured``: (what, decode tok/s, read bytes per token or None) per row."""
    rows: list[list[Any]] = []
    for what, tok_s, read_bytes in measured or [("", None, None)]:
        ceiling = r.bandwidth_bytes_s / read_bytes if read_bytes else r.ceiling_tok_s
        rows.append(
            [
                what,
                read_bytes or r.bytes_per_token,
                "measured" if read_bytes else "estimated",
                ceiling,
                tok_s,
                tok_s / ceiling if tok_s is not None else None,
            ]
        )
    return rows


ROOFLINE_HEADERS = [
    "measurement",
    "bytes_per_token",
    "bytes_source",
    "ceiling_tok_s",
    "measured_tok_s",
    "fraction_of_ceiling",
]


def roofline_tables(r: Roofline, rows: Sequence[Sequence[Any]]) -> list[Table]:
    body = tuple(
        (what or "-", f"{b / 1e9:.2f} GB ({src})", fmt(c), fmt(m), fmt_pct(frac, 0))
        for what, b, src, c, m, frac in rows
    )
    notes = (
        f"ceiling = bandwidth {r.bandwidth_bytes_s / 1e12:.3f} TB/s / bytes read per token "
        f"({r.active_params / 1e9:.3g}B active params x {r.bytes_per_param:g} byte/param"
        + (f" + {r.extra_bytes_per_token / 1e9:.3g} GB other reads" if r.extra_bytes_per_token else "")
        + ")",
        "speculative decoding emits several tokens per weight read, so a measurement can exceed 100%",
    )
    return [
        Table(
            "Decode roofline",
            ("measurement", "bytes per token", "ceiling tok/s", "measured tok/s", "of ceiling"),
            body,
            ("l", "r", "r", "r", "r"),
            notes,
        )
    ]


def roofline_json(r: Roofline, rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    return {
        "kind": "specproxy.roofline",
        "version": JSON_VERSION,
        "params": r.params,
        "active_params": r.active_params,
        "bytes_per_param": r.bytes_per_param,
        "extra_bytes_per_token": r.extra_bytes_per_token,
        "bandwidth_bytes_s": r.bandwidth_bytes_s,
        "ceiling_tok_s": r.ceiling_tok_s,
        "rows": [dict(zip(ROOFLINE_HEADERS, row, strict=True)) for row in rows],
    }
