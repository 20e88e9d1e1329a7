"""The end-of-run summary: one row per workload from the run's records, plus send lag and what was not sent. Pure.

With ``--repeat N`` every figure is computed per repeat and the row shows the median over repeats (the published
method: one warm-up, then five measured runs, medians); a second table gives each workload's decode tok/s and
acceptance as median (min-max) over repeats. Latency and decode figures use requests that finished ``ok``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specproxy.core.record import Record
from specproxy.core.stats import Summary, median, percentile, step_and_token_gaps, summarize


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over repeats: the median, its min and max, and how many repeats gave a value."""

    value: float | None
    min: float | None = None
    max: float | None = None
    n: int = 0


@dataclass(frozen=True, slots=True)
class WorkloadSummary:
    workload: str
    requests: int
    ok: int
    errors: int
    cancelled: int
    repeats: int
    decode_tok_s: Spread  # per-request decode tok/s, median per repeat
    output_tok_s: Spread  # all completion tokens over the wall-clock span of the repeat
    ttft_s_p50: Spread
    ttft_s_p99: Spread
    itl_s_p50: Spread  # per token: each step's gap spread over the tokens it brought
    step_s_p50: Spread  # per step (one chunk)
    acceptance_rate: Spread
    mean_acceptance_length: Spread
    acceptance_source: str | None  # the spec source most records used; "mixed" notes several


@dataclass(frozen=True, slots=True)
class RunSummary:
    workloads: tuple[WorkloadSummary, ...]
    send_lag_s: Summary | None = None
    warmup_sent: int = 0
    warmup_failed: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    interrupted: bool = False

    @property
    def requests(self) -> int:
        return sum(w.requests for w in self.workloads)

    @property
    def failed(self) -> int:
        return sum(w.errors for w in self.workloads)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _spread(values: Iterable[float | None]) -> Spread:
    xs = [v for v in values if v is not None]
    return Spread(median(xs), min(xs), max(xs), len(xs)) if xs else Spread(None)


def _figures(records: Sequence[Record]) -> dict[str, float | None]:
    ok = [r for r in records if r.get("outcome") == "ok"]
    ttft = [v for r in ok if (v := _num(r.get("ttft_s"))) is not None]
    steps: list[float] = []
    tokens: list[float] = []
    for r in ok:
        step_gaps, token_gaps = step_and_token_gaps([(float(c[0]), int(c[1])) for c in r.get("chunks") or []])
        steps.extend(step_gaps)
        tokens.extend(token_gaps)
    spans = [
        (a, a + e)
        for r in records
        if (a := _num(r.get("started_at"))) is not None and (e := _num(r.get("e2e_s"))) is not None
    ]
    total = sum(_num(r.get("completion_tokens")) or 0.0 for r in records)
    span = max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0
    accepted = drafts = draft_tokens = 0.0
    for r in records:
        spec = r.get("spec")
        if isinstance(spec, dict) and spec.get("source"):
            accepted += _num(spec.get("accepted")) or 0.0
            drafts += _num(spec.get("drafts")) or 0.0
            draft_tokens += _num(spec.get("draft_tokens")) or 0.0
    return {
        "decode": median([v for r in ok if (v := _num(r.get("decode_tok_s"))) is not None]),
        "output": total / span if span > 0 else None,
        "ttft50": percentile(ttft, 50),
        "ttft99": percentile(ttft, 99),
        "itl50": percentile(tokens, 50),
        "step50": percentile(steps, 50),
        "acc": accepted / draft_tokens if draft_tokens else None,
        "mal": 1 + accepted / drafts if drafts else None,
    }


def summarize_workload(workload: str, records: Sequence[Record]) -> WorkloadSummary:
    by_repeat: dict[int, list[Record]] = {}
    for r in records:
        rep = r.get("repeat")
        by_repeat.setdefault(rep if isinstance(rep, int) else 0, []).append(r)
    figs = [_figures(part) for _, part in sorted(by_repeat.items())]
    outcomes = Counter(str(r.get("outcome")) for r in records)
    sources = Counter(
        str(spec["source"]) for r in records if isinstance(spec := r.get("spec"), dict) and spec.get("source")
    )
    source = None
    if sources:
        source = sources.most_common(1)[0][0] if len(sources) == 1 else "mixed"
    return WorkloadSummary(
        workload=workload,
        requests=len(records),
        ok=outcomes.get("ok", 0),
        errors=len(records) - outcomes.get("ok", 0),
        cancelled=outcomes.get("client_cancelled", 0),
        repeats=len(by_repeat),
        decode_tok_s=_spread(f["decode"] for f in figs),
        output_tok_s=_spread(f["output"] for f in figs),
        ttft_s_p50=_spread(f["ttft50"] for f in figs),
        ttft_s_p99=_spread(f["ttft99"] for f in figs),
        itl_s_p50=_spread(f["itl50"] for f in figs),
        step_s_p50=_spread(f["step50"] for f in figs),
        acceptance_rate=_spread(f["acc"] for f in figs),
        mean_acceptance_length=_spread(f["mal"] for f in figs),
        acceptance_source=source,
    )


def summarize_run(
    records: Iterable[Record],
    *,
    lags_s: Sequence[float] = (),
    warmup_sent: int = 0,
    warmup_failed: int = 0,
    notes: Sequence[str] = (),
    interrupted: bool = False,
    order: Sequence[str] = (),
) -> RunSummary:
    """Group by workload (in ``order`` first, then as met) and summarise each."""
    groups: dict[str, list[Record]] = {w: [] for w in order}
    for r in records:
        groups.setdefault(str(r.get("workload")), []).append(r)
    return RunSummary(
        workloads=tuple(summarize_workload(w, recs) for w, recs in groups.items() if recs),
        send_lag_s=summarize(lags_s) if lags_s else None,
        warmup_sent=warmup_sent,
        warmup_failed=warmup_failed,
        notes=tuple(notes),
        interrupted=interrupted,
    )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]


def format_summary(s: RunSummary, *, title: str = "") -> str:
    lines: list[str] = [title] if title else []
    repeats = max((w.repeats for w in s.workloads), default=0)
    header = ["workload", "ok", "errors", "decode tok/s", "output tok/s", "TTFT p50", "TTFT p99", "ITL p50",
              "step p50", "acceptance", "accept len", "source"]  # fmt: skip
    rows = [header]
    for w in s.workloads:
        err = str(w.errors) + (f" ({w.cancelled} cancelled)" if w.cancelled else "")
        rows.append([
            w.workload, str(w.ok), err, _f(w.decode_tok_s.value), _f(w.output_tok_s.value), _ms(w.ttft_s_p50.value),
            _ms(w.ttft_s_p99.value), _ms(w.itl_s_p50.value), _ms(w.step_s_p50.value),
            _f(w.acceptance_rate.value, ".3f"), _f(w.mean_acceptance_length.value, ".2f"), w.acceptance_source or "-",
        ])  # fmt: skip
    if len(rows) == 1:
        lines.append("no requests were recorded")
    else:
        if repeats > 1:
            lines.append(f"medians over {repeats} repeats:")
        lines.extend(_table(rows))
    if repeats > 1:
        lines.append("")
        lines.append(f"per-repeat spread (median, min-max over {repeats} repeats):")
        spread = [["workload", "decode tok/s", "acceptance"]]
        for w in s.workloads:
            d, a = w.decode_tok_s, w.acceptance_rate
            spread.append([
                w.workload,
                f"{_f(d.value)} ({_f(d.min)}-{_f(d.max)})" if d.n else "-",
                f"{_f(a.value, '.3f')} ({_f(a.min, '.3f')}-{_f(a.max, '.3f')})" if a.n else "-",
            ])  # fmt: skip
        lines.extend(_table(spread))
    if s.send_lag_s is not None:
        lag = s.send_lag_s
        lines.append(
            f"send lag (actual send - scheduled): p50 {_ms(lag.p50)}, p99 {_ms(lag.p99)}, max {_ms(lag.max)} "
            f"over {lag.count} requests"
        )
    if s.warmup_sent:
        failed = f", {s.warmup_failed} failed" if s.warmup_failed else ""
        lines.append(f"warm-up: {s.warmup_sent} requests sent, not recorded{failed}")
    lines.extend(s.notes)
    if s.interrupted:
        lines.append("interrupted: requests in flight were cancelled (outcome client_cancelled); records kept")
    return "\n".join(lines)
