"""``specproxy roofline``: the memory-bandwidth ceiling of decode, and how far measured runs are from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from specproxy.analysis.figures.groups import DEFAULT_GROUP_BY, Grouping
from specproxy.analysis.figures.records import is_ok
from specproxy.analysis.figures.sketch import Quantiles
from specproxy.analysis.inputs.scan import Item
from specproxy.analysis.roofline import render as render_roofline
from specproxy.analysis.roofline.model import parse_bytes, parse_count, roofline
from specproxy.commands.common import TABLE_FORMATS, choice, command, emit, fail, scan_runs, tabular
from specproxy.commands.options import OutputOpt
from specproxy.core.record import number


@dataclass(frozen=True, slots=True)
class RooflineConfig:
    params: float
    active_params: float | None
    bytes_per_param: float
    extra_bytes_per_token: float
    bandwidth_bytes_s: float
    measured_tok_s: float | None
    runs: tuple[Path, ...]
    format: str
    output: Path | None


class _Rates:
    """Decode tok/s and recorded read bytes per token of one group's finished requests."""

    def __init__(self) -> None:
        self.tok_s, self.read_bytes = Quantiles(), Quantiles()

    def add(self, item: Item) -> None:
        if is_ok(item.rec):
            if item.tok_s is not None:
                self.tok_s.add(item.tok_s)
            if (rb := number(item.rec.get("read_bytes_per_token"))) is not None:
                self.read_bytes.add(rb)


def _measurements(paths: Sequence[Path]) -> list[tuple[str, float | None, float | None]]:
    """(workload / label, median decode tok/s, median recorded read bytes per token) per group."""
    grouping = Grouping(DEFAULT_GROUP_BY, _Rates)
    scan_runs(paths, lambda item, batch: grouping.get(item.rec).add(item))
    out: list[tuple[str, float | None, float | None]] = []
    for key, r in grouping.ordered():
        rb = r.read_bytes.percentile(50.0)
        out.append((" / ".join(key), r.tok_s.percentile(50.0), rb if rb and rb > 0 else None))
    return out


def run_roofline(cfg: RooflineConfig) -> None:
    try:
        r = roofline(
            cfg.params, cfg.bytes_per_param, cfg.bandwidth_bytes_s, cfg.active_params, cfg.extra_bytes_per_token
        )
    except ValueError as e:
        fail(str(e))
    measured: list[tuple[str, float | None, float | None]] = []
    if cfg.measured_tok_s is not None:
        measured.append(("given", cfg.measured_tok_s, None))
    if cfg.runs:
        measured.extend(_measurements(cfg.runs))
    rows = render_roofline.roofline_rows(r, measured)
    emit(
        tabular(
            cfg.format,
            render_roofline.roofline_tables(r, rows),
            (render_roofline.ROOFLINE_HEADERS, rows),
            render_roofline.roofline_json(r, rows),
        ),
        cfg.output,
    )


def _parse(parse: Callable[[str], float], value: str, option: str) -> float:
    try:
        return parse(value)
    except ValueError as e:
        fail(f"{option}: {e}")


def register(app: typer.Typer) -> None:
    @command(app, "roofline")
    def roofline_cmd(
        params: Annotated[str, typer.Option(help="Total parameters, e.g. 27B or 3e9.", show_default=False)],
        bytes_per_param: Annotated[
            float, typer.Option(help="Bytes per weight, e.g. 2 (FP16), 0.56 (4.5-bit).", show_default=False)
        ],
        bandwidth: Annotated[
            str, typer.Option(help="Memory bandwidth, e.g. 1.7TB/s, 1700GB/s, 1.7e12.", show_default=False)
        ],
        active_params: Annotated[str | None, typer.Option(help="Active parameters per token (MoE).")] = None,
        extra_bytes: Annotated[str, typer.Option(help="Other bytes read per token (KV cache...), e.g. 2GB.")] = "0",
        measured: Annotated[float | None, typer.Option(help="A measured decode tok/s to place.")] = None,
        run: Annotated[
            list[Path] | None, typer.Option(metavar="PATH", help="Runs whose decode tok/s to place (repeatable).")
        ] = None,
        format: Annotated[str, typer.Option("--format", "-f", help="table, md, csv or json.")] = "table",
        output: OutputOpt = None,
    ) -> None:
        """The memory-bandwidth ceiling of decode in tok/s, and how much of it a measurement reaches."""
        if measured is not None and not measured > 0:
            fail(f"--measured must be positive, got {measured}")
        cfg = RooflineConfig(
            params=_parse(parse_count, params, "--params"),
            active_params=_parse(parse_count, active_params, "--active-params") if active_params else None,
            bytes_per_param=bytes_per_param,
            extra_bytes_per_token=_parse(parse_bytes, extra_bytes, "--extra-bytes"),
            bandwidth_bytes_s=_parse(lambda v: parse_bytes(v, rate=True), bandwidth, "--bandwidth"),
            measured_tok_s=measured,
            runs=tuple(run or ()),
            format=choice(format, TABLE_FORMATS, "--format"),
            output=output,
        )
        run_roofline(cfg)
