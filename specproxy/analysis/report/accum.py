"""The report's figures in one pass: per-group accumulators fed record by record, in bounded memory.

Latency and decode-rate figures use requests that finished ``ok``; counts cover every request. When records carry a
``repeat`` index, every scalar figure is computed once per repeat (one partition per ``run_id`` and ``repeat``) and
reported as the median over repeats with the min-max spread: the published method (one warm-up, then five measured runs,
medians). Per-position acceptance and histograms are pooled over all repeats. Nothing holds the records: each group
keeps counters, sums and a :class:`specproxy.analysis.figures.sketch.Quantiles` per latency figure (exact up to
:data:`specproxy.analysis.figures.sketch.EXACT_LIMIT` values, a DDSketch within its relative error beyond), and chunk
timelines reach the groups through :class:`specproxy.analysis.inputs.scan.ChunkBatch`. Records already in memory go
through the same pass (:func:`build_report`): there is one implementation of the report's figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from specproxy.analysis.figures.acceptance import AcceptancePool
from specproxy.analysis.figures.groups import DEFAULT_GROUP_BY, Grouping
from specproxy.analysis.figures.records import RunSpan, is_ok, key_value
from specproxy.analysis.figures.sketch import Quantiles
from specproxy.analysis.figures.slo import FigureSpec, GoodputCount, percentile_name
from specproxy.analysis.figures.spans import SpanPool
from specproxy.analysis.inputs.scan import ChunkBatch, GapSink, Item, StepSink, item_of
from specproxy.analysis.report.model import DEFAULT_SPEC, Figure, GroupReport, Report, combine
from specproxy.core.dialects.engine import OFF_ENGINE_FLAG
from specproxy.core.figures import acceptance_rate, mean_acceptance_length
from specproxy.core.record import Record


class PartAcc:
    """One partition's scalar figures, accumulated."""

    __slots__ = (
        "accepted",
        "cached",
        "cached_known",
        "draft_tokens",
        "drafts",
        "e2e",
        "good",
        "itl",
        "prompt",
        "run",
        "step",
        "tok_s",
        "tpot",
        "ttft",
    )

    def __init__(self) -> None:
        self.tok_s, self.ttft, self.tpot, self.e2e = Quantiles(), Quantiles(), Quantiles(), Quantiles()
        self.itl, self.step = Quantiles(), Quantiles()
        self.run = RunSpan()
        self.accepted = self.drafts = self.draft_tokens = 0.0
        self.good = GoodputCount()
        self.prompt = self.cached = 0.0  # prompt tokens of finished requests, and those the prefix cache served
        self.cached_known = 0  # requests whose engine said how many were cached

    def add(self, item: Item, ok: bool, spec: FigureSpec) -> None:
        rec = item.rec
        if ok:
            if item.tok_s is not None:
                self.tok_s.add(item.tok_s)
            if (v := rec["ttft_s"]) is not None:
                self.ttft.add(v)
            if item.tpot_s is not None:
                self.tpot.add(item.tpot_s)
            if (v := rec["e2e_s"]) is not None:
                self.e2e.add(v)
            if (p := rec["prompt_tokens"]) is not None:
                self.prompt += p
                if (c := rec["cached_tokens"]) is not None:
                    self.cached += c
                    self.cached_known += 1
        self.run.add(rec)
        block = rec["spec"]
        if block is not None:
            self.accepted += block["accepted"] or 0.0
            self.drafts += block["drafts"] or 0.0
            self.draft_tokens += block["draft_tokens"] or 0.0
        if spec.slo is not None:
            self.good.add(rec, spec.slo)

    def gap_targets(self) -> tuple[Quantiles, Quantiles | None]:
        return self.step, self.itl

    def merge(self, other: PartAcc) -> None:
        for name in ("tok_s", "ttft", "tpot", "e2e", "itl", "step"):
            getattr(self, name).merge(getattr(other, name))
        self.run.merge(other.run)
        self.accepted += other.accepted
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.good.merge(other.good)
        self.prompt += other.prompt
        self.cached += other.cached
        self.cached_known += other.cached_known

    def samples(self) -> dict[str, Quantiles]:
        return {"ttft": self.ttft, "itl": self.itl, "step": self.step, "tpot": self.tpot, "e2e": self.e2e}

    def figures(
        self, spec: FigureSpec, rates: tuple[float | None, float | None] | None = None
    ) -> dict[str, float | None]:
        out: dict[str, float | None] = {
            "decode_tok_s_p50": self.tok_s.percentile(50.0),
            "output_tok_s": self.run.output_tok_s(),
        }
        samples = self.samples()
        for metric, ps in spec.percentiles.items():
            for p in ps:
                out[percentile_name(metric, p)] = samples[metric].percentile(p)
        if rates is None:
            rates = (
                acceptance_rate(self.accepted, self.draft_tokens),
                mean_acceptance_length(self.accepted, self.drafts),
            )
        out["acceptance_rate"], out["mean_acceptance_length"] = rates
        # engines say nothing when nothing was cached (vLLM), so the share counts once any request said something
        out["prompt_cached_share"] = self.cached / self.prompt if self.cached_known and self.prompt > 0 else None
        if spec.slo is not None:
            gp = self.good.result(self.run.span_s())
            out.update(slo_attainment=gp.attainment, goodput_req_s=gp.requests_per_s, goodput_tok_s=gp.tokens_per_s)
        return out


class GroupAcc:
    """One group of a report: counts, pooled acceptance, and its partitions."""

    def __init__(self, spec: FigureSpec = DEFAULT_SPEC, *, gaps: bool = True) -> None:
        self.spec = spec
        self.gaps = gaps  # False: no latency gaps wanted (their figures are None), chunks are not parsed for them
        self.requests = 0
        self.outcomes: Counter[str] = Counter()
        self.token_sources: Counter[str] = Counter()
        self.chunks_not_steps = 0
        self.truncated = 0
        self.decode_off_engine = 0
        self.pool = AcceptancePool()
        self.spans = SpanPool()
        self.parts: dict[tuple[str, str], PartAcc] = {}
        self.repeated = False

    def add(self, item: Item, batch: ChunkBatch) -> None:
        rec = item.rec
        self.requests += 1
        self.outcomes[rec["outcome"]] += 1
        self.token_sources[rec["token_source"]] += 1
        if rec["stream"] and not rec["chunks_are_steps"]:
            self.chunks_not_steps += 1
        if rec["truncated"]:
            self.truncated += 1
        if OFF_ENGINE_FLAG in rec["flags"]:
            self.decode_off_engine += 1
        self.pool.add(rec)
        self.spans.add(rec)
        if rec["repeat"] is not None:
            self.repeated = True
        key = (key_value(rec, "run_id"), key_value(rec, "repeat"))
        part = self.parts.get(key)
        if part is None:
            part = self.parts[key] = PartAcc()
        ok = is_ok(rec)
        part.add(item, ok, self.spec)
        gaps: list[GapSink] = [part] if ok and self.gaps else []
        steps: list[StepSink] = [self.pool] if rec["spec"] is None and rec["chunks_are_steps"] else []
        batch.add(item.seg, gaps, steps)

    def merged(self) -> PartAcc:
        whole = PartAcc()
        for part in self.parts.values():
            whole.merge(part)
        return whole

    def report(self, key: tuple[tuple[str, str], ...]) -> GroupReport:
        acceptance = self.pool.result()
        if self.repeated:
            per_part = [p.figures(self.spec) for p in self.parts.values()]
        else:  # one partition of everything; acceptance pooled in record order, as the reference does
            rates = (acceptance.acceptance_rate, acceptance.mean_acceptance_length)
            per_part = [self.merged().figures(self.spec, rates)]
        figures: dict[str, Figure] = combine(per_part, self.spec.names)
        return GroupReport(
            key=key,
            requests=self.requests,
            outcomes=dict(self.outcomes),
            repeats=len(self.parts) if self.repeated else 0,
            figures=figures,
            acceptance=acceptance,
            token_sources=dict(self.token_sources),
            chunks_not_steps=self.chunks_not_steps,
            truncated=self.truncated,
            decode_off_engine=self.decode_off_engine,
            spans=self.spans.result(),
        )

    def quantile_info(self) -> tuple[int, bool]:
        """(the most values one figure holds, whether every figure is exact)."""
        most, exact = 0, True
        for part in self.parts.values():
            for q in (part.tok_s, *part.samples().values()):
                most = max(most, len(q))
                exact = exact and q.exact
        return most, exact


class ReportBuilder:
    """Feed items (:meth:`add`), flush the batch, then :meth:`build` the :class:`Report`."""

    def __init__(self, by: Sequence[str] = DEFAULT_GROUP_BY, spec: FigureSpec = DEFAULT_SPEC) -> None:
        self.spec = spec
        self.grouping: Grouping[GroupAcc] = Grouping(by, lambda: GroupAcc(spec))

    def add(self, item: Item, batch: ChunkBatch) -> None:
        self.grouping.get(item.rec).add(item, batch)

    def build(self) -> Report:
        by = self.grouping.by
        reports = tuple(acc.report(tuple(zip(by, key, strict=True))) for key, acc in self.grouping.ordered())
        exact = self.quantiles_exact()[1]
        return Report(by, reports, sum(g.requests for g in reports), self.spec, quantiles_exact=exact)

    def quantiles_exact(self) -> tuple[int, bool]:
        infos = [acc.quantile_info() for acc in self.grouping.groups.values()]
        return max((m for m, _ in infos), default=0), all(e for _, e in infos)


def stream_report(
    items: Iterable[Item],
    by: Sequence[str] = DEFAULT_GROUP_BY,
    spec: FigureSpec = DEFAULT_SPEC,
    *,
    parallel: bool = False,
) -> tuple[Report, bool]:
    """The report of a stream of items, and whether every quantile in it is exact."""
    builder = ReportBuilder(by, spec)
    batch = ChunkBatch(parallel=parallel)
    for item in items:
        builder.add(item, batch)
    batch.flush()
    report = builder.build()
    return report, report.quantiles_exact


def build_report(
    records: Iterable[Record], by: Sequence[str] = DEFAULT_GROUP_BY, spec: FigureSpec = DEFAULT_SPEC
) -> Report:
    """The report of records already in memory (``run``'s summary, ``matrix``): the same one pass, over them."""
    return stream_report(map(item_of, records), by, spec)[0]
