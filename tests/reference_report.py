"""The report's figures from lists of records: the reference the one streaming pass
(:mod:`specproxy.analysis.report.accum`) is held to, kept here only, written the plain way (every value in a list,
sorted percentiles) so that it is easy to check by eye.

Latency and decode-rate figures use requests that finished ``ok``; counts cover every request; with repeat indexes,
every scalar figure per (``run_id``, ``repeat``) partition and the median over them. Inter-step gaps leave out
engines that stream one event per token (no step to see); the streaming pass does not, which only matters for records
flagged ``chunks_not_steps_engine``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from specproxy.analysis.figures.acceptance import pool_acceptance
from specproxy.analysis.figures.groups import DEFAULT_GROUP_BY, GROUP_FIELDS, group_records
from specproxy.analysis.figures.records import PER_TOKEN_FLAG, is_ok, key_value, values
from specproxy.analysis.figures.slo import FigureSpec, goodput, percentile_name
from specproxy.analysis.report.model import DEFAULT_SPEC, GroupReport, Report, combine
from specproxy.core.dialects.engine import OFF_ENGINE_FLAG
from specproxy.core.record import Record
from specproxy.core.stats import decode_tok_s, median, percentile, step_and_token_gaps


def request_tok_s(rec: Record) -> float | None:
    v = rec["decode_tok_s"]
    return v if v is not None else decode_tok_s(rec["chunks"])


def request_tpot_s(rec: Record) -> float | None:
    v = rec["tpot_s"]
    if v is not None:
        return v
    rate = decode_tok_s(rec["chunks"])
    return 1.0 / rate if rate else None


def partitions(records: Sequence[Record]) -> list[list[Record]]:
    """One partition per (run_id, repeat) when any record has a repeat index; else one partition of everything."""
    if all(r["repeat"] is None for r in records):
        return [list(records)]
    parts: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        parts.setdefault((key_value(r, "run_id"), key_value(r, "repeat")), []).append(r)
    return list(parts.values())


def gaps(records: Iterable[Record]) -> tuple[list[float], list[float]]:
    """Pooled (inter-step, inter-token) gaps over the records' chunk timelines."""
    steps: list[float] = []
    tokens: list[float] = []
    for rec in records:
        s, t = step_and_token_gaps(rec["chunks"])
        if PER_TOKEN_FLAG not in rec["flags"]:  # llama.cpp, Ollama: an event per token, no step to see
            steps.extend(s)
        tokens.extend(t)
    return steps, tokens


def output_tok_s(records: Sequence[Record]) -> float | None:
    """Sum of completion tokens over the wall-clock span from the first start to the last end."""
    spans = [(s, s + e) for r in records if (s := r["started_at"]) is not None and (e := r["e2e_s"]) is not None]
    tokens = sum(r["completion_tokens"] or 0.0 for r in records)
    if not spans:
        return None
    span = max(end for _, end in spans) - min(start for start, _ in spans)
    return tokens / span if span > 0 else None


def scalar_figures(records: Sequence[Record], spec: FigureSpec = DEFAULT_SPEC) -> dict[str, float | None]:
    """Every figure ``spec`` names, for one partition of records."""
    ok = [r for r in records if is_ok(r)]
    step, token = gaps(ok)
    samples = {
        "ttft": values(ok, lambda r: r["ttft_s"]),
        "itl": token,
        "step": step,
        "tpot": values(ok, request_tpot_s),
        "e2e": values(ok, lambda r: r["e2e_s"]),
    }
    acc = pool_acceptance(records)
    out: dict[str, float | None] = {
        "decode_tok_s_p50": median(values(ok, request_tok_s)),
        "output_tok_s": output_tok_s(records),
    }
    for metric, ps in spec.percentiles.items():
        for p in ps:
            out[percentile_name(metric, p)] = percentile(samples[metric], p)
    out["acceptance_rate"] = acc.acceptance_rate
    out["mean_acceptance_length"] = acc.mean_acceptance_length
    prompts = [r for r in ok if r["prompt_tokens"] is not None]
    prompt = sum(r["prompt_tokens"] or 0 for r in prompts)
    known = any(r["cached_tokens"] is not None for r in prompts)
    out["prompt_cached_share"] = sum(r["cached_tokens"] or 0 for r in prompts) / prompt if known and prompt else None
    if spec.slo is not None:
        gp = goodput(records, spec.slo)
        out.update(slo_attainment=gp.attainment, goodput_req_s=gp.requests_per_s, goodput_tok_s=gp.tokens_per_s)
    return out


def summarize_group(
    key: tuple[tuple[str, str], ...], records: Sequence[Record], spec: FigureSpec = DEFAULT_SPEC
) -> GroupReport:
    parts = partitions(records)
    repeated = any(r["repeat"] is not None for r in records)
    token_sources = Counter(r["token_source"] for r in records)
    return GroupReport(
        key=key,
        requests=len(records),
        outcomes=dict(Counter(r["outcome"] for r in records)),
        repeats=len(parts) if repeated else 0,
        figures=combine([scalar_figures(p, spec) for p in parts], spec.names),
        acceptance=pool_acceptance(records),
        token_sources=dict(token_sources),
        chunks_not_steps=sum(1 for r in records if r["stream"] and not r["chunks_are_steps"]),
        truncated=sum(1 for r in records if r["truncated"]),
        decode_off_engine=sum(1 for r in records if OFF_ENGINE_FLAG in r["flags"]),
    )


def build_report(
    records: Iterable[Record], by: Sequence[str] = DEFAULT_GROUP_BY, spec: FigureSpec = DEFAULT_SPEC
) -> Report:
    """Group the records and summarise each group. ``by`` fields must be in :data:`GROUP_FIELDS`."""
    unknown = [f for f in by if f not in GROUP_FIELDS]
    if unknown or not by:
        raise ValueError(f"cannot group by {','.join(unknown) or '(nothing)'}; choose from {','.join(GROUP_FIELDS)}")
    groups = group_records(records, by)
    reports = tuple(summarize_group(tuple(zip(by, key, strict=True)), recs, spec) for key, recs in groups.items())
    return Report(group_by=tuple(by), groups=reports, requests=sum(g.requests for g in reports), spec=spec)


def in_flight(records: Iterable[Record]) -> list[tuple[float, int]]:
    """Step function of requests in flight: ``[(seconds since the first start, count after this instant)]``."""
    events: list[tuple[float, int]] = []
    for r in records:
        start, e2e = r["started_at"], r["e2e_s"]
        if start is not None and e2e is not None:
            events.append((start, 1))
            events.append((start + e2e, -1))
    if not events:
        return []
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    t0 = events[0][0]
    out: list[tuple[float, int]] = [(0.0, 0)]
    level = 0
    for t, d in events:
        level += d
        out.append((t - t0, level))
    return out
