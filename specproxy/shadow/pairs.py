"""One shadow pair's figures, and the live book that puts pairs together as their records come.

A pair is a live request's record and its shadow's, the same request sent to two servers at the same moment: their
ratios cancel what the request itself brings (its prompt, its length, the load of that moment), so a handful of
pairs tells what many unpaired requests would. The records come in either order and at different times (the two
servers run at their own pace); :class:`PairBook` keeps the first half of each pair until the second arrives, and
the finished pairs in a window per candidate and workload.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WINDOW = 2000  # finished pairs kept per candidate and workload: the live figures are of the latest this many
PENDING_MAX = 20_000  # halves waiting for their other half; beyond, the oldest are forgotten (counted)
MAX_TEXT_CHARS = 32 * 2**20  # greedy texts waiting for their records, in all: the oldest go past it
TAIL_CHARS = 32  # greedy texts that part within their last this many characters (or 10 %) part by noise


@dataclass(frozen=True, slots=True)
class Pair:
    """One finished pair's figures; None where either side has no such figure."""

    candidate: str
    workload: str
    speedup: float | None  # decode tok/s, shadow over live
    tpot_ratio: float | None  # time per output token, shadow over live
    e2e_ratio: float | None  # end to end, live over shadow (above 1: the shadow finished sooner)
    ttft_delta_s: float | None  # shadow minus live
    accepted: float | None  # the shadow's accepted draft tokens
    draft_tokens: float | None
    drafts: float | None
    live_accepted: float | None  # the live request's, where its server speculates
    live_draft_tokens: float | None
    text: str | None  # greedy pairs only: "identical", "tail" (parted within the last tokens) or "diverged"
    parted_at: int | None  # the first character where the texts differ (greedy pairs whose texts differ)


def parted_at(a: str, b: str) -> int | None:
    """The first index where the two texts differ (the shorter one's length when one continues the other); None
    when they are equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def text_verdict(live: str, shadow: str) -> tuple[str, int | None]:
    """("identical" | "tail" | "diverged", where they part). Greedy speculative decoding returns the base model's
    tokens, but two servers' floating point can flip a near-tie, after which the texts go apart: near the end that
    is noise; early, it is a drafter that changes what the model says (a broken quantization accepting wrong
    drafts), unless most pairs agree (then it is a near-tie somewhere in a long reply: see the verdict's share)."""
    at = parted_at(live, shadow)
    if at is None:
        return "identical", None
    shorter = min(len(live), len(shadow))
    if at >= shorter - max(TAIL_CHARS, shorter // 10) and at >= shorter // 2:  # (a short text's tail is its end)
        return "tail", at
    return "diverged", at


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 and a > 0 else None


def _spec(rec: Mapping[str, Any], key: str) -> float | None:
    spec = rec.get("spec")
    return _num(spec.get(key)) if isinstance(spec, Mapping) else None


def pair_of(
    live: Mapping[str, Any],
    shadow: Mapping[str, Any],
    *,
    candidate: str,
    live_text: str | None = None,
    shadow_text: str | None = None,
) -> Pair | None:
    """The pair's figures, or None when either request did not end ``ok`` (a failed shadow is counted by its
    outcome, not compared). Texts are given for greedy pairs only."""
    if live.get("outcome") != "ok" or shadow.get("outcome") != "ok":
        return None
    text, at = (
        text_verdict(live_text, shadow_text) if live_text is not None and shadow_text is not None else (None, None)
    )
    ttft_l, ttft_s = _num(live.get("ttft_s")), _num(shadow.get("ttft_s"))
    return Pair(
        candidate=candidate,
        workload=str(live.get("workload") or "default"),
        speedup=_ratio(_num(shadow.get("decode_tok_s")), _num(live.get("decode_tok_s"))),
        tpot_ratio=_ratio(_num(shadow.get("tpot_s")), _num(live.get("tpot_s"))),
        e2e_ratio=_ratio(_num(live.get("e2e_s")), _num(shadow.get("e2e_s"))),
        ttft_delta_s=ttft_s - ttft_l if ttft_s is not None and ttft_l is not None else None,
        accepted=_spec(shadow, "accepted"),
        draft_tokens=_spec(shadow, "draft_tokens"),
        drafts=_spec(shadow, "drafts"),
        live_accepted=_spec(live, "accepted"),
        live_draft_tokens=_spec(live, "draft_tokens"),
        text=text,
        parted_at=at,
    )


def _thin(rec: Mapping[str, Any]) -> dict[str, Any]:
    """What a half keeps of a record until its other half comes: what :func:`pair_of` reads, without the record's
    chunks, body and text (a whole record is up to ``--capture-max-bytes`` twice over)."""
    out = {k: rec.get(k) for k in ("request_id", "workload", "outcome", "ttft_s", "tpot_s", "e2e_s", "decode_tok_s")}
    spec = rec.get("spec")
    out["spec"] = (
        {k: spec.get(k) for k in ("accepted", "draft_tokens", "drafts")} if isinstance(spec, Mapping) else None
    )
    return out


@dataclass(slots=True)
class _Half:
    remaining: int  # shadows whose record has not come yet
    record: Mapping[str, Any] | None = None
    # (candidate, record, request id) of shadows come first; every text waits in the book's texts, which are capped
    shadows: list[tuple[str, Mapping[str, Any], str]] | None = None


class PairBook:
    """Live requests that got shadows, and shadows, matched by the live request's id as their records come.

    The caller tells it which live requests were shadowed (:meth:`expect`, with how many shadows went out and
    whether their texts are compared), then hands it every record (:meth:`live`, :meth:`shadow`) and, before them,
    texts (:meth:`text`). A live request is forgotten once it and all its shadows are in.
    """

    def __init__(self, window: int = WINDOW, pending_max: int = PENDING_MAX) -> None:
        self.pairs: dict[tuple[str, str], collections.deque[Pair]] = {}
        self.failed: dict[str, dict[str, int]] = {}  # candidate -> outcome -> shadows that did not end ok
        self.forgotten = 0  # halves dropped past pending_max, or whose other half never came
        self.added = 0  # pairs ever finished
        self._window = window
        self._pending_max = pending_max
        self._pending: collections.OrderedDict[str, _Half] = collections.OrderedDict()
        self._texts: dict[str, str] = {}  # request id -> text, for the greedy pairs' records still to come
        self._text_chars = 0
        self._greedy: set[str] = set()

    def expect(self, live_id: str, shadows: int, *, greedy: bool) -> None:
        if shadows <= 0:
            return
        self._pending[live_id] = _Half(shadows)
        if greedy:
            self._greedy.add(live_id)
        while len(self._pending) > self._pending_max:
            old, half = self._pending.popitem(last=False)
            self._greedy.discard(old)
            for rid in (old, *(sid for _, _, sid in half.shadows or ())):
                self._take_text(rid)
            self.forgotten += 1

    def wants_text(self, request_id: str) -> bool:
        return request_id in self._greedy

    def text(self, request_id: str, text: str, shadow_of: str | None = None) -> None:
        """A response's text, before its record: kept only for a greedy pair's live request or shadow."""
        if (shadow_of or request_id) in self._greedy:
            self._take_text(request_id)
            self._texts[request_id] = text
            self._text_chars += len(text)
            while self._text_chars > MAX_TEXT_CHARS and len(self._texts) > 1:
                self._take_text(next(iter(self._texts)))

    def _take_text(self, request_id: str) -> str | None:
        text = self._texts.pop(request_id, None)
        if text is not None:
            self._text_chars -= len(text)
        return text

    def live(self, rec: Mapping[str, Any]) -> None:
        rid = str(rec.get("request_id"))
        half = self._pending.get(rid)
        if half is None:
            return  # not shadowed
        half.record = rec = _thin(rec)
        for candidate, shadow, sid in half.shadows or ():
            self._add(candidate, rec, shadow, self._texts.get(rid), self._take_text(sid))
        half.shadows = None
        self._settle(rid, half)

    def shadow(self, candidate: str, rec: Mapping[str, Any]) -> None:
        live_id = rec.get("shadow_of")
        half = self._pending.get(str(live_id))
        sid = str(rec.get("request_id"))
        if rec.get("outcome") != "ok":
            per = self.failed.setdefault(candidate, {})
            outcome = str(rec.get("outcome"))
            per[outcome] = per.get(outcome, 0) + 1
        if half is None:
            self._take_text(sid)
            return
        half.remaining -= 1
        if half.record is None:
            half.shadows = [*(half.shadows or []), (candidate, _thin(rec), sid)]
        else:
            self._add(candidate, half.record, rec, self._texts.get(str(live_id)), self._take_text(sid))
            self._settle(str(live_id), half)

    def _settle(self, live_id: str, half: _Half) -> None:
        """Forget a live request once it and every shadow of it are in."""
        if half.record is not None and half.remaining <= 0:
            self._pending.pop(live_id, None)
            self._greedy.discard(live_id)
            self._take_text(live_id)

    def _add(
        self, candidate: str, live: Mapping[str, Any], shadow: Mapping[str, Any], lt: str | None, st: str | None
    ) -> None:
        greedy = str(live.get("request_id")) in self._greedy
        pair = pair_of(live, shadow, candidate=candidate, live_text=lt if greedy else None, shadow_text=st)
        if pair is None:
            return
        key = (candidate, pair.workload)
        window = self.pairs.get(key)
        if window is None:
            window = self.pairs[key] = collections.deque(maxlen=self._window)
        window.append(pair)
        self.added += 1

    @property
    def pending(self) -> int:
        return len(self._pending)
