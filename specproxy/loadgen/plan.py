"""The plan of a load run: which requests, in which order, from which workload, with which body. Pure.

A plan is an endless, deterministic sequence of :class:`PlannedRequest` (index 0, 1, 2, ...): a run takes its first
``--requests`` entries, or as many as fit in ``--duration``. Several workloads are interleaved round-robin (each
cycling through its items in file order) or, with a seed, in a fresh random order in every round, with every
workload's items shuffled afresh on each pass: either way each workload gets its share of the requests. A shard
``i/N`` takes every N-th entry starting at ``i``, so the shards of a plan together are exactly the plan, and the
open-loop arrival offsets of the whole plan are kept entry by entry (each shard then sends about rate / N).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeVar

from specproxy.loadgen.dialect_bodies import DIALECT_ENDPOINTS, dialect_body
from specproxy.workloads import Workload, WorkloadItem

T = TypeVar("T")

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Continuous usage puts the cumulative completion_tokens on every chunk: exact tokens per step (engine-facts.md).
STREAM_OPTIONS: dict[str, Any] = {"include_usage": True, "continuous_usage_stats": True}


@dataclass(frozen=True, slots=True)
class BodyOptions:
    """How request bodies are built. ``None`` means: the item's or workload's own value (for dataset bodies, the
    body's own), else the default (temperature 0, thinking off)."""

    model: str
    endpoint: str = "chat"
    max_tokens: int | None = None
    temperature: float | None = None
    thinking: bool | None = None


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int  # position in the whole plan (or in the recording, for a replay)
    workload: str
    item_id: str
    path: str
    body: dict[str, Any]
    replay_of: str | None = None
    # A conversation: after the reply, each follow-up is sent as the next user turn (chat bodies only).
    followups: tuple[str, ...] = ()
    think_time_s: float = 0.0

    @property
    def turns(self) -> int:
        return 1 + len(self.followups)


def next_turn(body: dict[str, Any], reply: str, followup: str) -> dict[str, Any]:
    """The body of a conversation's next turn: the last body's messages, the model's own reply, the next user turn."""
    messages = [*body["messages"], {"role": "assistant", "content": reply}, {"role": "user", "content": followup}]
    return {**body, "messages": messages}


@dataclass(frozen=True, slots=True)
class Shard:
    """Part ``index`` of ``count``: the plan entries whose index is ``index`` modulo ``count``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard must be i/N with 0 <= i < N, got {self.index}/{self.count}")

    def take(self, entries: Iterable[T]) -> Iterator[T]:
        return islice(entries, self.index, None, self.count)

    def share(self, total: int) -> int:
        """This shard's part of ``total`` (concurrency), the remainder going to the first shards."""
        return total // self.count + (1 if self.index < total % self.count else 0)

    def sub(self, index: int, count: int) -> Shard:
        """Part ``index`` of ``count`` of this shard (a worker process of one machine's shard)."""
        return Shard(self.index + self.count * index, self.count * count)


def parse_shard(value: str) -> Shard:
    """``i/N`` (0-based i). Raises ValueError with the reason."""
    head, sep, tail = value.partition("/")
    try:
        if not sep:
            raise ValueError
        return Shard(int(head), int(tail))
    except ValueError:
        raise ValueError(f"--shard must be i/N with 0 <= i < N (e.g. 0/4), got {value!r}") from None


def _prompt_of(item: WorkloadItem) -> str:
    if item.prompt is not None:
        return item.prompt
    # A chat item sent to /v1/completions: its turns as plain text, the way a raw-prompt client would send them.
    return "\n\n".join(str(m.get("content", "")) for m in item.messages)


def request_body(workload: Workload, item: WorkloadItem, opts: BodyOptions) -> tuple[str, dict[str, Any]]:
    """(path, body) for one item. Dataset bodies are sent as given apart from model and streaming, which
    measurement needs; flags override their sampling settings only when given."""
    if item.body is not None:
        body = dict(item.body)
        path = ENDPOINTS["chat"] if "messages" in body else ENDPOINTS["completions"]
        body["model"] = opts.model
        body["stream"] = True
        given = body.get("stream_options")
        body["stream_options"] = {**(given if isinstance(given, dict) else {}), **STREAM_OPTIONS}
        if opts.max_tokens is not None:
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = opts.max_tokens
        if opts.temperature is not None:
            body["temperature"] = opts.temperature
        if opts.thinking is not None and "messages" in body:
            kwargs = body.get("chat_template_kwargs")
            body["chat_template_kwargs"] = {
                **(kwargs if isinstance(kwargs, dict) else {}),
                "enable_thinking": opts.thinking,
            }
        return path, body
    max_tokens = opts.max_tokens if opts.max_tokens is not None else workload.max_tokens_for(item)
    temperature = opts.temperature if opts.temperature is not None else 0.0
    if opts.endpoint == "completions":
        return ENDPOINTS["completions"], {
            "model": opts.model,
            "prompt": _prompt_of(item),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": dict(STREAM_OPTIONS),
        }
    chat = {
        "model": opts.model,
        "messages": [dict(m) for m in item.messages],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": dict(STREAM_OPTIONS),
        "chat_template_kwargs": {"enable_thinking": bool(opts.thinking)},
    }
    if opts.endpoint in DIALECT_ENDPOINTS:  # another engine API: the same request, in its words
        return dialect_body(opts.endpoint, chat)
    return ENDPOINTS["chat"], chat


def plan_order(sizes: Sequence[int], seed: int | None) -> Iterator[tuple[int, int]]:
    """Endless (workload index, item index) pairs for workloads of ``sizes`` items."""
    if not sizes or any(n < 1 for n in sizes):
        raise ValueError("every workload needs at least one item")
    cursors = [0] * len(sizes)
    if seed is None:
        while True:
            for w, n in enumerate(sizes):
                yield w, cursors[w] % n
                cursors[w] += 1
    rng = random.Random(seed)
    orders: list[list[int]] = [[] for _ in sizes]
    while True:
        round_ = list(range(len(sizes)))
        rng.shuffle(round_)
        for w in round_:
            if cursors[w] % sizes[w] == 0:  # a new pass through this workload: a fresh shuffle
                orders[w] = list(range(sizes[w]))
                rng.shuffle(orders[w])
            yield w, orders[w][cursors[w] % sizes[w]]
            cursors[w] += 1


def iter_plan(workloads: Sequence[Workload], opts: BodyOptions, seed: int | None) -> Iterator[PlannedRequest]:
    """The endless plan over ``workloads``; bodies are built lazily, one per entry."""
    for index, (w, i) in enumerate(plan_order([len(wl.items) for wl in workloads], seed)):
        wl = workloads[w]
        item = wl.items[i]
        path, body = request_body(wl, item, opts)
        # follow-ups need the chat messages a reply can be appended to
        followups = item.followups if "messages" in body else ()
        yield PlannedRequest(
            index=index,
            workload=wl.name,
            item_id=item.id,
            path=path,
            body=body,
            followups=followups,
            think_time_s=wl.think_time_s if followups else 0.0,
        )


def plan_run_id(workloads: Sequence[Workload], parts: Sequence[object]) -> str:
    """A run id every shard of one plan computes alike (so merged shards form one run), from what defines it."""
    h = hashlib.sha256()
    for wl in workloads:
        h.update(f"{wl.name}\0".encode())  # not the source path: it differs between machines
        for item in wl.items:
            h.update(f"{item.id}\0".encode())
            if item.followups:
                h.update(f"turns {item.turns}\0".encode())
    for p in parts:
        h.update(f"{p!r}\0".encode())
    return h.hexdigest()[:12]
