"""Hand-built SVG charts: grouped bars and lines, nothing fetched, no script needed to draw them.

Every chart is one ``<svg data-chart="NAME">``; its data elements carry ``class="mark"`` (bars are ``<rect>``,
lines ``<path>``, points ``<circle>``) so a viewer, or a test in a headless browser, can tell drawn data from axes.
Pure: numbers in, markup out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 56
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac")

Series = tuple[str, Sequence[float | None]]
Line = tuple[str, Sequence[tuple[float, float]]]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 5 times a power of ten); at least two of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo <= 1e-6 * max(1.0, abs(lo), abs(hi)):
        # One value only (or float noise around it): give it a unit-sized neighbourhood of its own magnitude.
        pad = 10.0 ** math.floor(math.log10(abs(lo))) if lo else 1.0
        lo, hi = (lo - pad if lo > 0 and lo - pad >= 0 else lo), hi + pad
    raw = (hi - lo) / count
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 5.0, 10.0) if m * mag >= raw)
    first = math.floor(lo / step)
    ticks = [(first + i) * step for i in range(count * 3)]
    ticks = [t for t in ticks if t <= hi + step * 0.999]
    return ticks if len(ticks) >= 2 else [first * step, (first + 1) * step]


def _label(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.2g}"


def _frame(name: str, title: str, body: list[str], legend: Sequence[str], colors: Sequence[int] = ()) -> str:
    # the legend goes under the chart, wrapped into as many rows as its entries need
    items = []
    x, row = LEFT, 0
    for i, text in enumerate(legend):
        width = 24 + 7 * len(text)
        if x > LEFT and x + width > WIDTH - RIGHT:
            x, row = LEFT, row + 1
        y = HEIGHT + 4 + 16 * row
        color = PALETTE[(colors[i] if i < len(colors) else i) % len(PALETTE)]
        items.append(
            f'<rect x="{x}" y="{y}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14}" y="{y + 9}" font-size="11">{escape(text)}</text>'
        )
        x += width
    height = HEIGHT + (16 * (row + 1) + 8 if legend else 0)
    return (
        f'<svg data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>"
        f'<text x="{LEFT}" y="14" font-size="13" font-weight="bold">{escape(title)}</text>'
        + "".join(items)
        + "".join(body)
        + "</svg>"
    )


def _y_axis(ticks: list[float], y: Callable[[float], float], label: str) -> list[str]:
    out = [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#333"/>']
    for t in ticks:
        out.append(
            f'<line x1="{LEFT}" y1="{y(t):.1f}" x2="{WIDTH - RIGHT}" y2="{y(t):.1f}" stroke="#e5e5e5"/>'
            f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" font-size="10" text-anchor="end">{_label(t)}</text>'
        )
    mid = (TOP + HEIGHT - BOTTOM) / 2
    out.append(
        f'<text x="14" y="{mid:.0f}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 14 {mid:.0f})">{escape(label)}</text>'
    )
    return out


def _empty(name: str, title: str) -> str:
    return _frame(
        name,
        title,
        [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="12" fill="#777">no data</text>'],
        (),
    )


def bar_chart(
    name: str,
    title: str,
    categories: Sequence[str],
    series: Sequence[Series],
    y_label: str,
    value_fmt: Callable[[float], str] = lambda v: f"{v:.1f}",
    colors: Sequence[int] = (),
) -> str:
    """``colors``: per series, its palette index (so a series keeps its colour across the page's charts)."""
    vals = [v for _, vs in series for v in vs if v is not None]
    if not categories or not vals:
        return _empty(name, title)
    ticks = nice_ticks(0.0, max(max(vals), 1e-9))
    top = ticks[-1]
    plot_h = HEIGHT - TOP - BOTTOM

    def y(v: float) -> float:
        return HEIGHT - BOTTOM - v / top * plot_h

    body = _y_axis(ticks, y, y_label)
    slot = (WIDTH - LEFT - RIGHT) / len(categories)
    bar_w = max(2.0, slot * 0.8 / max(1, len(series)))
    for ci, cat in enumerate(categories):
        x0 = LEFT + ci * slot + slot * 0.1
        for si, (sname, vs) in enumerate(series):
            v = vs[ci] if ci < len(vs) else None
            if v is None:
                continue
            x = x0 + si * bar_w
            h = max(0.5, HEIGHT - BOTTOM - y(v))
            body.append(
                f'<rect class="mark" x="{x:.1f}" y="{HEIGHT - BOTTOM - h:.1f}" width="{bar_w - 1:.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[(colors[si] if si < len(colors) else si) % len(PALETTE)]}">'
                f"<title>{escape(sname)} / {escape(cat)}: {escape(value_fmt(v))}</title></rect>"
            )
        body.append(
            f'<text x="{LEFT + (ci + 0.5) * slot:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" '
            f'text-anchor="middle">{escape(cat)}</text>'
        )
    return _frame(name, title, body, [s for s, _ in series], colors)


def line_chart(
    name: str,
    title: str,
    lines: Sequence[Line],
    x_label: str,
    y_label: str,
    *,
    step: bool = False,
    markers: bool = False,
    y_max: float | None = None,
    integer_x: bool = False,
    log2_x: bool = False,
    ref_y: float | None = None,
    whiskers: Sequence[Sequence[tuple[float, float, float]]] = (),
    colors: Sequence[int] = (),
) -> str:
    """``log2_x``: x values are drawn on a log-2 axis (loads that double); ``ref_y``: a dashed reference line (1.00x);
    ``whiskers``: per line, (x, lo, hi) intervals drawn as vertical bars; ``colors``: per line, its palette index
    (so a configuration keeps its colour across charts that show only some of them)."""
    if log2_x:
        lines = [(n, [(math.log2(px), py) for px, py in ps if px > 0]) for n, ps in lines]
        whiskers = [[(math.log2(wx), lo, hi) for wx, lo, hi in ws if wx > 0] for ws in whiskers]
        integer_x = True
    pts = [p for _, ps in lines for p in ps]
    if not pts:
        return _empty(name, title)
    x_lo, x_hi = min(p[0] for p in pts), max(p[0] for p in pts)
    xt = nice_ticks(x_lo, x_hi)
    top = max([p[1] for p in pts] + [hi for ws in whiskers for _, _, hi in ws] + [ref_y or 0.0])
    if integer_x and x_hi - x_lo <= 20:
        xt = [float(v) for v in range(math.floor(x_lo), math.ceil(x_hi) + 1)]
        if len(xt) < 2:
            xt.append(xt[0] + 1.0)
    yt = nice_ticks(0.0, y_max if y_max is not None else max(top, 1e-9))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(v: float) -> float:
        return LEFT + (v - xt[0]) / (xt[-1] - xt[0]) * plot_w

    def y(v: float) -> float:
        return HEIGHT - BOTTOM - (v - yt[0]) / (yt[-1] - yt[0]) * plot_h

    body = _y_axis(yt, y, y_label)
    body.append(f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" stroke="#333"/>')
    for t in xt:
        body.append(
            f'<text x="{x(t):.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="10" text-anchor="middle">'
            f"{_label(2**t if log2_x else t)}</text>"
        )
    if ref_y is not None:
        body.append(
            f'<line x1="{LEFT}" y1="{y(ref_y):.1f}" x2="{WIDTH - RIGHT}" y2="{y(ref_y):.1f}" stroke="#999" '
            'stroke-dasharray="4 3"/>'
        )
    body.append(
        f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 12}" font-size="11" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    for i, (lname, ps) in enumerate(lines):
        if not ps:
            continue
        color = PALETTE[(colors[i] if i < len(colors) else i) % len(PALETTE)]
        d = [f"M{x(ps[0][0]):.1f},{y(ps[0][1]):.1f}"]
        for qx, qy in ps[1:]:
            d.append(f"H{x(qx):.1f}V{y(qy):.1f}" if step else f"L{x(qx):.1f},{y(qy):.1f}")
        body.append(
            f'<path class="mark" d="{"".join(d)}" fill="none" stroke="{color}" stroke-width="2">'
            f"<title>{escape(lname)}</title></path>"
        )
        for wx, lo, hi in whiskers[i] if i < len(whiskers) else ():
            body.append(
                f'<line class="mark" x1="{x(wx):.1f}" y1="{y(lo):.1f}" x2="{x(wx):.1f}" y2="{y(hi):.1f}" '
                f'stroke="{color}" stroke-width="1.5"><title>{escape(lname)}: {lo:.3g}-{hi:.3g}</title></line>'
            )
        if markers or len(ps) == 1:
            body.extend(
                f'<circle class="mark" cx="{x(px):.1f}" cy="{y(py):.1f}" r="3.5" fill="{color}">'
                f"<title>{escape(lname)}: {py:.3g} at {2**px if log2_x else px:g}</title></circle>"
                for px, py in ps
            )
    return _frame(name, title, body, [n for n, _ in lines], colors)
