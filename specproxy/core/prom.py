"""Prometheus snapshots of an engine's ``/metrics``, deltas between them, and engine adapters.

Parsing is ``prometheus_client.parser`` (it accepts vLLM's ``vllm:`` names). A snapshot keeps every sample by
(name, labels); ``*_created`` samples are timestamps, not counts: they are kept apart and used only to detect a
restart. A delta is computed per series, so a counter reset on one engine is seen even when the sum over engines
still grew; across a reset the delta is the value since the restart, never negative. Adapters then sum a family over
every label but the ones that matter (``engine``, ``model_name`` are summed away; ``position`` is kept).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from specproxy.core import figures

Labels = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, Labels]


class MetricsParseError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Snapshot:
    values: Mapping[SeriesKey, float]
    created: Mapping[SeriesKey, float]  # keyed like the counter sample it belongs to (``..._total``)
    types: Mapping[str, str]  # sample name -> family type


def _created_target(name: str) -> str:
    return name[: -len("_created")] + "_total"


# The families a recorder reads (every engine adapter below), as line prefixes. vLLM's /metrics is tens of KB and
# prometheus_client's parser is pure Python: filtering lines first keeps a scrape's
# cost on the event loop small (the histogram buckets alone are most of the text).
RECORDER_FAMILIES: tuple[str, ...] = (
    "vllm:spec_decode_",
    "vllm:generation_tokens_",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_created",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:estimated_read_bytes_per_gpu_",
    "vllm:inter_token_latency_seconds_count",
    "vllm:inter_token_latency_seconds_created",
    "vllm:time_per_output_token_seconds_count",
    "vllm:time_to_first_token_seconds_count",
    "vllm:time_to_first_token_seconds_created",
    "sglang:",
    "llamacpp:",
)


def select_families(text: str, prefixes: tuple[str, ...] = RECORDER_FAMILIES) -> str:
    """The lines of an exposition text that belong to families starting with ``prefixes`` (TYPE lines kept)."""
    types = tuple("# TYPE " + p for p in prefixes)
    out = [line for line in text.splitlines() if line.startswith(prefixes) or line.startswith(types)]
    out.append("")
    return "\n".join(out)


PROBE_LINES = 64  # lines of an unrelated text parsed to tell an exposition from something else


def _families(text: str) -> list[Metric]:
    try:
        return list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends on malformed exposition text
        raise MetricsParseError(f"malformed metrics text: {e}") from e


def parse_snapshot(text: str, *, only: tuple[str, ...] | None = None) -> Snapshot:
    """Parse an exposition text; ``only``: keep just the families with these name prefixes (much faster)."""
    if only is not None:
        selected = select_families(text, only)
        if not selected.strip() and text.strip():
            # Nothing of ours in it. Parse its head, so that a text that is not an exposition at all (an HTML page,
            # a wrong URL) is an error rather than an empty snapshot, but never the whole of a large unrelated text.
            selected = "\n".join(text.splitlines()[:PROBE_LINES]) + "\n"
            _families(selected)
            selected = ""
        text = selected
    values: dict[SeriesKey, float] = {}
    created: dict[SeriesKey, float] = {}
    types: dict[str, str] = {}
    for fam in _families(text):
        for s in fam.samples:
            labels: Labels = tuple(sorted(s.labels.items()))
            if s.name.endswith("_created"):
                created[(_created_target(s.name), labels)] = s.value
                continue
            if math.isnan(s.value):
                continue
            values[(s.name, labels)] = s.value
            types[s.name] = fam.type
    return Snapshot(values=values, created=created, types=types)


@dataclass(frozen=True, slots=True)
class Delta:
    values: Mapping[SeriesKey, float]
    resets: tuple[SeriesKey, ...] = ()

    @property
    def reset(self) -> bool:
        return bool(self.resets)


_MONOTONIC_TYPES = frozenset({"counter", "histogram", "summary"})


def _is_monotonic(name: str, types: Mapping[str, str]) -> bool:
    t = types.get(name)
    if t is not None and t not in ("unknown", "untyped"):
        return t in _MONOTONIC_TYPES
    return name.endswith(("_total", "_count", "_sum", "_bucket"))


def delta(before: Snapshot, after: Snapshot) -> Delta:
    """Per-series increase of every counter-like series from ``before`` to ``after``.

    A series that went down, or whose ``_created`` changed, restarted: its increase is its value after. A series
    new in ``after`` started from zero. Histogram ``_sum`` may legitimately be any sign only through resets, so it
    is treated like the counters.
    """
    out: dict[SeriesKey, float] = {}
    resets: list[SeriesKey] = []
    for key, now in after.values.items():
        if not _is_monotonic(key[0], after.types):
            continue
        prev = before.values.get(key)
        if prev is None:
            out[key] = now
            continue
        c0, c1 = before.created.get(key), after.created.get(key)
        if now < prev or (c0 is not None and c1 is not None and c1 != c0):
            resets.append(key)
            out[key] = now
        else:
            out[key] = now - prev
    for key in before.values:
        if key not in after.values and _is_monotonic(key[0], before.types):
            resets.append(key)  # the series vanished: the server restarted without it
    return Delta(values=out, resets=tuple(resets))


def family_sum(values: Mapping[SeriesKey, float], name: str, **match: str) -> float | None:
    """Sum of every sample named exactly ``name`` whose labels include ``match``; None when there is none."""
    total = 0.0
    found = False
    for (n, labels), v in values.items():
        if n != name:
            continue
        if match and any(dict(labels).get(k) != want for k, want in match.items()):
            continue
        total += v
        found = True
    return total if found else None


def by_label(values: Mapping[SeriesKey, float], name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in values.items():
        if n == name:
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + v
    return out


@dataclass(frozen=True, slots=True)
class SpecCounters:
    """Speculative-decoding figures read from one snapshot or one delta, summed over engines."""

    engine: str
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    read_bytes: float | None = None
    decode_steps: float | None = None  # request-steps after the first token (the ITL histogram's count)
    prefills: float | None = None  # first tokens (the TTFT histogram's count)
    acceptance_length_gauge: float | None = None  # SGLang / vLLM V0 publish gauges, not counters
    acceptance_rate_gauge: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def has_spec(self) -> bool:
        return self.draft_tokens is not None or self.acceptance_length_gauge is not None

    @property
    def acceptance_rate(self) -> float | None:
        if self.accepted is None or self.draft_tokens is None:
            return None
        return figures.acceptance_rate(self.accepted, self.draft_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        if self.accepted is None or self.drafts is None:
            return None
        return figures.mean_acceptance_length(self.accepted, self.drafts)


def _positions(values: Mapping[SeriesKey, float], name: str) -> tuple[float, ...]:
    pos = by_label(values, name, "position")
    if not pos:
        return ()
    try:
        n = max(int(p) for p in pos) + 1
    except ValueError:
        return ()
    return tuple(pos.get(str(i), 0.0) for i in range(n))


def detect_engine(snapshot: Snapshot) -> str:
    names = {n for n, _ in snapshot.values}
    if "vllm:spec_decode_num_drafts_total" in names or "vllm:spec_decode_num_draft_tokens_total" in names:
        if "vllm:spec_decode_num_emitted_tokens_total" in names and "vllm:spec_decode_num_drafts_total" not in names:
            return "vllm-v0"
        return "vllm"
    if "vllm:spec_decode_draft_acceptance_rate" in names:
        return "vllm-v0"
    if any(n.startswith("sglang:") for n in names):
        return "sglang"
    if any(n.startswith("llamacpp:") for n in names):
        return "llamacpp"
    if any(n.startswith("vllm:") for n in names):
        return "vllm"
    return "unknown"


# Engines whose /metrics have no accepted-token counter (SGLang: gauges only): their deltas attribute nothing.
NO_SPEC_COUNTERS = frozenset({"sglang"})


def spec_counters(engine: str, values: Mapping[SeriesKey, float]) -> SpecCounters:
    """Read the speculative figures of ``engine`` (see :func:`detect_engine`) from snapshot or delta values."""
    f = family_sum
    if engine in ("vllm", "vllm-v0"):
        notes: tuple[str, ...] = ()
        if engine == "vllm-v0":
            notes = ("legacy vLLM V0: no drafts counter; rates are gauges",)
        return SpecCounters(
            engine=engine,
            drafts=f(values, "vllm:spec_decode_num_drafts_total"),
            draft_tokens=f(values, "vllm:spec_decode_num_draft_tokens_total"),
            accepted=f(values, "vllm:spec_decode_num_accepted_tokens_total"),
            per_position=_positions(values, "vllm:spec_decode_num_accepted_tokens_per_pos_total"),
            generation_tokens=f(values, "vllm:generation_tokens_total"),
            prompt_tokens=f(values, "vllm:prompt_tokens_total"),
            read_bytes=f(values, "vllm:estimated_read_bytes_per_gpu_total"),
            # vLLM observes inter_token_latency once per decode step per request (named time_per_output_token
            # before 0.10), time_to_first_token once per request
            decode_steps=_first(
                f(values, "vllm:inter_token_latency_seconds_count"),
                f(values, "vllm:time_per_output_token_seconds_count"),
            ),
            prefills=f(values, "vllm:time_to_first_token_seconds_count"),
            acceptance_rate_gauge=f(values, "vllm:spec_decode_draft_acceptance_rate"),
            notes=notes,
        )
    if engine == "llamacpp":
        return SpecCounters(
            engine=engine,
            drafts=f(values, "llamacpp:spec_decode_num_drafts_total"),
            draft_tokens=f(values, "llamacpp:spec_decode_num_draft_tokens_total"),
            accepted=f(values, "llamacpp:spec_decode_num_accepted_tokens_total"),
            per_position=_positions(values, "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"),
            generation_tokens=f(values, "llamacpp:tokens_predicted_total"),
            prompt_tokens=f(values, "llamacpp:prompt_tokens_total"),
        )
    if engine == "sglang":
        # SGLang counts verify calls but publishes acceptance only as gauges: with no accepted counter there is
        # nothing to share per request (its per-request meta_info is the source), so no drafts either.
        return SpecCounters(
            engine=engine,
            drafts=None,
            draft_tokens=None,
            accepted=None,
            generation_tokens=f(values, "sglang:generation_tokens_total"),
            prompt_tokens=f(values, "sglang:prompt_tokens_total"),
            acceptance_length_gauge=f(values, "sglang:spec_accept_length"),
            acceptance_rate_gauge=f(values, "sglang:spec_accept_rate"),
            notes=("SGLang publishes acceptance as gauges recomputed every --decode-log-interval steps",),
        )
    return SpecCounters(engine=engine)


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def gauge(snapshot: Snapshot, name: str) -> float | None:
    return family_sum(snapshot.values, name)
