"""The types every workload reader produces (`Workload`, `WorkloadItem`), the error they raise (`WorkloadError`), and
the small checks and naming rules they share.

Pure: no IO. A reader module builds `WorkloadItem`s and one `Workload`; anything it rejects is a `WorkloadError`
whose message names the file and the place in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

DEFAULT_MAX_TOKENS = 512
MAX_NAME_CHARS = 64
# A trace's token lengths become prompt text built in memory and max_tokens sent to the server, so they are bounded:
# 10 million tokens is above any context window served today, and a larger figure is a corrupt or hostile file.
MAX_TRACE_TOKENS = 10_000_000

_NAME_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAME_CHARS}}}")


class WorkloadError(ValueError):
    """A workload could not be found or read; the message is one line naming the file and where in it."""


@dataclass(frozen=True, slots=True)
class WorkloadItem:
    """One request. `messages` is always a chat conversation ending with a user turn (or the source's own list).

    `prompt` is set when the source gave a plain prompt (completions style); `body` when it gave a whole OpenAI
    request body, to be sent as is apart from model and streaming options. `arrival_s` is the offset from the start
    of a recorded trace; `expected_output_tokens` is the output length the source recorded.

    `followups` makes the item a conversation: after the model answers `messages`, each follow-up is sent as the next
    user turn, after the model's *own* earlier replies (sent live, never canned), so turn n carries turns 1..n-1.
    `category` is the source's category (SpecBench, MT-Bench), which the loader can make a workload of its own.
    """

    id: str
    messages: tuple[dict[str, Any], ...]
    max_tokens: int | None = None
    prompt: str | None = None
    body: dict[str, Any] | None = None
    arrival_s: float | None = None
    expected_output_tokens: int | None = None
    followups: tuple[str, ...] = ()
    category: str | None = None

    @property
    def turns(self) -> int:
        return 1 + len(self.followups)


@dataclass(frozen=True, slots=True)
class Workload:
    """A named set of requests; `max_tokens` applies to items without their own. `source` says where it came from.

    `think_time_s` is the pause between a reply and the user's next turn in a conversation (items with follow-ups).
    """

    name: str
    description: str
    max_tokens: int
    items: tuple[WorkloadItem, ...]
    source: str
    think_time_s: float = 0.0

    def max_tokens_for(self, item: WorkloadItem) -> int:
        return item.max_tokens if item.max_tokens is not None else self.max_tokens


def check(ok: bool, where: str, what: str) -> None:
    """Raise `WorkloadError("<where>: <what>")` unless `ok`: every reader reports its problems this one way."""
    if not ok:
        raise WorkloadError(f"{where}: {what}")


def positive_int(value: Any) -> bool:
    # bool is an int subclass, and `"max_tokens": true` is a typo, not 1.
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def trace_length(value: Any, where: str, what: str) -> int:
    """A token length from a trace: an integer from 0 (an empty reply is a length a trace can record) to
    `MAX_TRACE_TOKENS`; anything else is a `WorkloadError` naming the place."""
    check(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        where,
        f"{what} must be a non-negative integer (got {value!r})",
    )
    check(
        value <= MAX_TRACE_TOKENS,
        where,
        f"{what} {value} is beyond the {MAX_TRACE_TOKENS:,} tokens a trace may ask for (a corrupt trace?)",
    )
    return int(value)


def check_name(name: Any, where: str) -> str:
    """A workload name as the specproxy format requires it: reports and per-workload tags carry it verbatim."""
    check(
        isinstance(name, str) and _NAME_RE.fullmatch(name) is not None,
        where,
        f"workload name must be 1-{MAX_NAME_CHARS} characters of A-Z a-z 0-9 _ . - (got {name!r})",
    )
    return str(name)


def name_from(source: str) -> str:
    """A name for a workload whose file carries none (datasets, traces): the file name, made one `check_name` allows."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", PurePath(source).stem)[:MAX_NAME_CHARS]
    return stem or "workload"


def unique_id(item_id: str, seen: set[str]) -> str:
    """`item_id`, or `item_id#2`, `#3`... when taken, for datasets whose ids repeat; adds the result to `seen`."""
    candidate, n = item_id, 1
    while candidate in seen:
        n += 1
        candidate = f"{item_id}#{n}"
    seen.add(candidate)
    return candidate
