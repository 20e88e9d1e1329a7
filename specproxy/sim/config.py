"""Configuration of the vLLM simulator: every knob of `specproxy sim`, its defaults and its validation.

Owns `SimConfig` (one frozen object the CLI builds from its options), `Profile` (a workload's acceptance
behaviour and output corpus) and the built-in profiles. No IO except `load_profiles`, which reads a JSON file.

Roofline model of one engine step (documented here because the defaults are tuned against it):

    step_s = max(model_bytes / bandwidth_bytes_s        # weights streamed once per step
                 + per_seq_s * batch_size,              # KV reads and per-sequence bookkeeping
                 compute_s_per_token * tokens_verified) # the forward pass over every position verified
           + fixed_overhead_s                           # launch / scheduling / sampling
           + per_draft_token_s * max_drafted_in_batch   # proposing k drafts (the drafter's own passes)
           + prefill_s_per_token * prompt_tokens_admitted_this_step

`tokens_verified` is the sum over the batch of 1 + drafts: memory-bound while the weights dominate (small batches),
compute-bound beyond a knee that comes at a smaller batch the more tokens each step verifies, which is where
speculation stops paying (it spends compute that is no longer spare). `compute_s_per_token` is 0 by default (no
compute roof, the published batch-1 shape); `--compute-s-per-token 0.0002` puts the knee near batch 50 without
speculation and near batch 7 with k = 3.

The defaults give a batch-1 decode step of the published Qwen3.5-2B shape, and one draft token costs 20% of a base
step: a workload of low per-position conditional acceptance ([0.4, 0.33, 0.3, ...], Japanese chat) gains a little at
k=1 and loses from k=3 on, while one of high acceptance ([0.8, 0.75, 0.72], code) gains most at k=3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import orjson

from specproxy.sim.faults import parse_faults

SPEC_METHODS: tuple[str, ...] = ("none", "mtp", "ngram", "eagle", "draft_model")
CORPORA: tuple[str, ...] = ("code", "ja", "en", "mixed")
SPAN_KINDS: tuple[str, ...] = ("prose", "code", "json", "math", "cjk", "whitespace")  # as core/spans.py names them
METRICS_FAULTS: tuple[str, ...] = ("none", "fail", "hang")
SIM_DIALECTS: tuple[str, ...] = ("vllm", "sglang", "ollama", "llamacpp")  # the engine the server poses as
PER_REQUEST_METRICS: tuple[str, ...] = ("summary", "detailed")


@dataclass(frozen=True, slots=True)
class Profile:
    """How one workload behaves under speculation.

    accept: conditional acceptance probability per draft position: position i is accepted with probability
        accept[i] given that position i-1 was. Positions beyond the list repeat the last value minus 0.02 per
        extra position (never below 0.05).
    ngram_draft_prob: with `spec_method="ngram"`, the mean probability that a decode step finds a match and drafts
        (each request draws its own around it: engine.py).
    corpus: which built-in text the answer is made of: "code", "ja" (Japanese casual chat), "en", or "mixed" (prose,
        a code fence, Japanese, a JSON object and display math in turn, each followed by a blank line).
    span_accept: per span type of the text being drafted (SPAN_KINDS), its own conditional acceptance per position,
        in place of `accept` while the step's text is of that type. With it, a step never runs past the end of its
        span (a draft beyond it is rejected), so each step lies in one span and the truth per span is exact.
    min_output_tokens / max_output_tokens: natural answer length range (uniform, seeded), EOS included.
    """

    accept: tuple[float, ...]
    ngram_draft_prob: float
    corpus: str
    min_output_tokens: int = 60
    max_output_tokens: int = 400
    span_accept: Mapping[str, tuple[float, ...]] | None = None

    def accept_at(self, position: int, span: str | None = None) -> float:
        accept = self.accept
        if span is not None and self.span_accept is not None:
            accept = self.span_accept.get(span, accept)
        if position < len(accept):
            return accept[position]
        extra = position - len(accept) + 1
        return max(0.05, accept[-1] - 0.02 * extra)

    def validate(self, name: str) -> None:
        if not self.accept:
            raise ValueError(f"profile {name!r}: accept must list at least one probability")
        for p in (*self.accept, self.ngram_draft_prob):
            if not (isinstance(p, int | float) and 0.0 <= p <= 1.0 and math.isfinite(p)):
                raise ValueError(f"profile {name!r}: probabilities must be between 0 and 1, got {p!r}")
        if self.corpus not in CORPORA:
            raise ValueError(f"profile {name!r}: corpus must be one of {', '.join(CORPORA)}, got {self.corpus!r}")
        if not 1 <= self.min_output_tokens <= self.max_output_tokens:
            raise ValueError(f"profile {name!r}: need 1 <= min_output_tokens <= max_output_tokens")
        for span, accept in (self.span_accept or {}).items():
            if span not in SPAN_KINDS:
                raise ValueError(f"profile {name!r}: span_accept keys must be among {', '.join(SPAN_KINDS)}: {span!r}")
            if not accept or not all(isinstance(p, int | float) and 0.0 <= p <= 1.0 for p in accept):
                raise ValueError(f"profile {name!r}: span_accept[{span!r}] must list probabilities between 0 and 1")


DEFAULT_PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        "code": Profile(accept=(0.8, 0.75, 0.72, 0.7, 0.68), ngram_draft_prob=0.6, corpus="code"),
        "ja_chat": Profile(accept=(0.4, 0.33, 0.3, 0.28, 0.26), ngram_draft_prob=0.35, corpus="ja"),
        "other": Profile(accept=(0.6, 0.5, 0.45, 0.42, 0.4), ngram_draft_prob=0.4, corpus="en"),
    }
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything `specproxy sim` can be told. Field names are the CLI option names with `-` for `_`.

    host, port: where to listen; port 0 picks a free port (read it back from `SimHandle.url`).
    served_model_name: the only model name accepted in requests and listed by /v1/models.
    seed: makes generated text, lengths and acceptance draws reproducible per request content.
    spec_method: "none" | "mtp" | "ngram" | "eagle" | "draft_model". With "none" no spec metrics exist.
    num_speculative_tokens: k, draft tokens per speculative step (ngram proposes 1..k on the steps it drafts).
    engines: data-parallel engines; requests go round-robin, each engine batches on its own and is the
        `engine` label value "0".."N-1" on /metrics.
    max_num_seqs: most requests one engine runs at once; the rest wait (vllm:num_requests_waiting).
    per_request_spec_metrics: None (off) | "summary" | "detailed": adds vLLM's `metrics` object to responses.
    stream_interval: engine steps merged into one SSE chunk (the first and the last are always sent at once).
    output_lag_ms: after each chunk a stream's writer is away this long, as a saturated API server's HTTP task is;
        the steps that came meanwhile go out merged in one chunk (vLLM's output collector merges what its reader
        has not taken). 0: every step is sent as it comes.
    keepalive_s: send `: keep-alive` SSE comments after this many seconds of silence (None = never).
    metrics_fault: "none" | "fail" (GET /metrics answers 500) | "hang" (never answers); switchable at run
        time with POST /sim/faults.
    metrics_render_ms: each GET /metrics holds the server's event loop this long, as vLLM's API server renders its
        text on the loop that also takes requests and streams tokens (0: free). For measuring what scraping costs.
    request_faults: fault spec applied to every inference request unless it sends its own X-Sim-Fault header,
        same syntax: "status=503", "stall=2", "reset_after=5", "error_event_after=3", comma-separated.
    speed: divides every step time (and so every latency); 10 runs ten times faster than the model says.
    model_bytes: bytes read per step for the weights (default 2e9 params x 2 bytes).
    bandwidth_bytes_s: memory bandwidth in bytes per second.
    fixed_overhead_s: per-step time that does not depend on the batch.
    per_draft_token_s: extra step time per draft token of the longest draft in the batch.
    per_seq_s: extra step time per sequence in the batch.
    compute_s_per_token: step time per position verified (1 + drafts per sequence) when compute-bound; 0: none.
    prefill_s_per_token: extra step time per prompt token of requests admitted in that step (tokens the prefix
        cache served excluded).
    prefix_cache_entries: message prefixes the prefix cache keeps (sim/prefix_cache.py); 0 turns caching off.
    prompt_tokens_details: vLLM's --enable-prompt-tokens-details: final usage carries `cached_tokens` when non-zero.
    profiles: workload name -> Profile. Requests pick one by prompt content or the X-Sim-Profile header.
    default_max_tokens: max_tokens when a request sends none.
    max_model_len: prompt_tokens + max_tokens may not exceed this (400 otherwise, like vLLM).
    truth_capacity: most per-request ground-truth records kept (oldest dropped first).
    system_fingerprint: value of `system_fingerprint` on final chunks and non-streaming bodies.
    dialect: which engine the server poses as (sim/dialects.py): its /metrics names, Server header, probe paths.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = "sim-model"
    seed: int = 0
    spec_method: str = "mtp"
    num_speculative_tokens: int = 3
    engines: int = 1
    max_num_seqs: int = 256
    per_request_spec_metrics: str | None = None
    stream_interval: int = 1
    output_lag_ms: float = 0.0
    keepalive_s: float | None = None
    metrics_fault: str = "none"
    metrics_render_ms: float = 0.0
    request_faults: str = ""
    speed: float = 1.0
    model_bytes: int = 4_000_000_000
    bandwidth_bytes_s: float = 0.8e12
    fixed_overhead_s: float = 0.0034
    per_draft_token_s: float = 0.0017
    per_seq_s: float = 0.0001
    compute_s_per_token: float = 0.0
    prefill_s_per_token: float = 0.00002
    prefix_cache_entries: int = 65536
    prompt_tokens_details: bool = False
    profiles: Mapping[str, Profile] = field(default_factory=lambda: DEFAULT_PROFILES)
    default_max_tokens: int = 256
    max_model_len: int = 32768
    truth_capacity: int = 100_000
    system_fingerprint: str = "vllm-0.32.0-specsim"
    dialect: str = "vllm"

    @property
    def speculative(self) -> bool:
        return self.spec_method != "none"

    @property
    def k(self) -> int:
        """Draft tokens per speculative step; 0 without speculation."""
        return self.num_speculative_tokens if self.speculative else 0

    def _check_choices(self) -> None:
        for name, value, allowed in (
            ("spec_method", self.spec_method, SPEC_METHODS),
            ("dialect", self.dialect, SIM_DIALECTS),
            ("metrics_fault", self.metrics_fault, METRICS_FAULTS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")

    def validate(self) -> None:
        """Raise ValueError with a one-line reason for the first bad value."""
        self._check_choices()
        if self.speculative and self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1 with spec_method {self.spec_method!r}")
        if self.num_speculative_tokens > 64:
            raise ValueError("num_speculative_tokens must be <= 64")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        if not self.served_model_name:
            raise ValueError("served_model_name must not be empty")
        for name, ms in (("output_lag_ms", self.output_lag_ms), ("metrics_render_ms", self.metrics_render_ms)):
            if not 0 <= ms <= 10_000:
                raise ValueError(f"{name} must be between 0 and 10000, got {ms}")
        positive_ints = {
            "engines": self.engines,
            "max_num_seqs": self.max_num_seqs,
            "stream_interval": self.stream_interval,
            "default_max_tokens": self.default_max_tokens,
            "max_model_len": self.max_model_len,
            "truth_capacity": self.truth_capacity,
        }
        for name, value in positive_ints.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"speed must be a positive number, got {self.speed}")
        if self.keepalive_s is not None and not self.keepalive_s > 0:
            raise ValueError(f"keepalive_s must be positive, got {self.keepalive_s}")
        if self.per_request_spec_metrics not in (None, *PER_REQUEST_METRICS):
            raise ValueError(
                f"per_request_spec_metrics must be summary or detailed, got {self.per_request_spec_metrics!r}"
            )
        if self.prefix_cache_entries < 0:
            raise ValueError(f"prefix_cache_entries must be >= 0, got {self.prefix_cache_entries}")
        if self.model_bytes < 0 or not self.bandwidth_bytes_s > 0:
            raise ValueError("model_bytes must be >= 0 and bandwidth_bytes_s > 0")
        for name in (
            "fixed_overhead_s",
            "per_draft_token_s",
            "per_seq_s",
            "compute_s_per_token",
            "prefill_s_per_token",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not self.profiles:
            raise ValueError("profiles must define at least one workload")
        for name, profile in self.profiles.items():
            profile.validate(name)
        parse_faults(self.request_faults)


def load_profiles(path: Path, base: Mapping[str, Profile] = DEFAULT_PROFILES) -> dict[str, Profile]:
    """Read profiles from JSON: {"name": {"accept": [...], "ngram_draft_prob": 0.5, "corpus": "en", ...}}.

    Named profiles replace or extend `base`; a profile that gives only some keys inherits the rest from the
    base profile of the same name (or from "other"). Raises ValueError with a one-line reason.
    """
    try:
        raw = orjson.loads(path.read_bytes())
    except OSError as e:
        raise ValueError(f"cannot read profiles file {path}: {e.strerror or e}") from None
    except orjson.JSONDecodeError as e:
        raise ValueError(f"profiles file {path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"profiles file {path} must hold a JSON object of name -> profile")
    out = dict(base)
    known = {"accept", "ngram_draft_prob", "corpus", "min_output_tokens", "max_output_tokens", "span_accept"}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            raise ValueError(f"profile {name!r} must be a JSON object")
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"profile {name!r}: unknown keys {', '.join(sorted(unknown))}")
        parent = base.get(name) or base.get("other") or DEFAULT_PROFILES["other"]
        try:
            profile = Profile(
                accept=tuple(float(p) for p in spec.get("accept", parent.accept)),
                ngram_draft_prob=float(spec.get("ngram_draft_prob", parent.ngram_draft_prob)),
                corpus=str(spec.get("corpus", parent.corpus)),
                min_output_tokens=int(spec.get("min_output_tokens", parent.min_output_tokens)),
                max_output_tokens=int(spec.get("max_output_tokens", parent.max_output_tokens)),
                span_accept=_span_accept(spec["span_accept"]) if "span_accept" in spec else parent.span_accept,
            )
        except (TypeError, ValueError, AttributeError):
            raise ValueError(
                f"profile {name!r}: accept (and span_accept's values) must be lists of numbers, lengths integers"
            ) from None
        profile.validate(name)
        out[name] = profile
    return out


def _span_accept(raw: object) -> dict[str, tuple[float, ...]]:
    if not isinstance(raw, dict):
        raise TypeError("span_accept must be an object")
    return {str(k): tuple(float(p) for p in v) for k, v in raw.items()}
