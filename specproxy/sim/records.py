"""What the simulated engine reports: per-request ground truth, per-engine totals, per-step outputs.

Plain records, no logic beyond JSON views: the engine fills them, the runtime fans step outputs out and keeps
the truth, the metrics layer counts step reports, and the wire layer turns a truth into vLLM's per-request
`metrics` object. Kept apart from the engine so those layers depend on the records, not on the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")


@dataclass(slots=True)
class RequestTruth:
    """What really happened to one request. Times are seconds on the caller's clock (server: since start)."""

    id: str
    kind: str
    profile: str
    engine: int
    prompt_tokens: int
    max_tokens: int
    natural_tokens: int
    started_at_s: float
    stream: bool = False
    cached_tokens: int = 0  # prompt tokens the prefix cache served (not prefilled again)
    completion_tokens: int = 0
    finish_reason: str | None = None
    accepted: int = 0
    counted_accepted: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    per_position: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)
    step_emitted: list[int] = field(default_factory=list)
    # per span type of the text (core/spans.py's names) and per output-position bucket (the lower edge, as a string),
    # over decode steps: [steps, tokens, accepted (emitted), draft tokens]
    spans: dict[str, list[int]] = field(default_factory=dict)
    positions: dict[str, list[int]] = field(default_factory=dict)
    aborted: bool = False
    aborted_at_s: float | None = None
    submitted_at_s: float | None = None
    admitted_at_s: float | None = None
    first_token_at_s: float | None = None
    finished_at_s: float | None = None

    def as_json(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def summary(self) -> dict[str, object]:
        return {
            "id": self.id,
            "profile": self.profile,
            "engine": self.engine,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "counted_accepted": self.counted_accepted,
            "aborted": self.aborted,
        }


@dataclass(slots=True)
class Totals:
    """What one engine's /metrics counters should show since the last reset."""

    k: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    read_bytes: int = 0
    steps: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))

    def __post_init__(self) -> None:
        if not self.per_position:
            self.per_position = [0] * self.k

    def as_json(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One request's share of one step, as the API server receives it."""

    request_id: str
    texts: tuple[str, ...]
    token_ids: tuple[int, ...]
    drafted: int
    accepted_counted: int
    completion_tokens: int
    finish_reason: str | None
    prefill: bool
    ttft_s: float | None
    itl_s: float | None
    e2e_s: float | None
    queue_s: float | None


@dataclass(frozen=True, slots=True)
class StepReport:
    """Everything one step changed, for the metrics layer."""

    engine: int
    outputs: tuple[StepOutput, ...]
    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]
    prompt_tokens: int
    read_bytes: int
