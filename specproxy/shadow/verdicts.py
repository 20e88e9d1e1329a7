"""What the pairs say, per candidate and workload: paired figures with bootstrap intervals, the speedup's verdict,
how many greedy pairs were lossless, and one sentence; and the guard that stops shadowing when it hurts.

The two requests of a pair ran at the same moment, so the drift of a run (the machine, the hour's load) is in both
and cancels in their ratio: the speedup's verdict needs its interval clear of 1 only, not of a run's drift as
:func:`specproxy.analysis.figures.confidence.speedup_verdict` does for runs one after another.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specproxy.analysis.figures.confidence import Interval, median_of_ratios, pooled_ratio
from specproxy.core.stats import median
from specproxy.shadow.pairs import Pair

# A candidate is "not lossless" when more than this share of its greedy pairs parted before their tails (and at
# least NOT_LOSSLESS_MIN of them did): a near-tie flipped by floating point parts some pairs, a broken drafter most
# (docs/shadow.md has the pairs this was set from).
NOT_LOSSLESS_SHARE = 0.5
NOT_LOSSLESS_MIN = 3


def verdict(point: float | None, ci: Interval | None) -> str:
    """``faster`` when the paired speedup's interval lies above 1, ``slower`` when below, else ``not
    distinguishable from 1.00x``; ``-`` without an interval (fewer than two pairs)."""
    if point is None or ci is None:
        return "-"
    if ci.lo > 1.0:
        return "faster"
    if ci.hi < 1.0:
        return "slower"
    return "not distinguishable from 1.00x"


def _values(pairs: Iterable[Pair], attr: str) -> list[float]:
    return [v for p in pairs if (v := getattr(p, attr)) is not None]


def _figure(values: Sequence[float], seed: int) -> dict[str, Any]:
    ci = median_of_ratios(values, seed=seed)  # the median of the values, resampled (works for deltas as well)
    return {"median": median(list(values)), "ci": [ci.lo, ci.hi] if ci is not None else None}


def _pooled(pairs: Sequence[Pair], num: str, den: str, seed: int) -> dict[str, Any]:
    both = [(n, d) for p in pairs if (n := getattr(p, num)) is not None and (d := getattr(p, den)) is not None]
    total = sum(d for _, d in both)
    if not both or total <= 0:
        return {"value": None, "ci": None}
    ci = pooled_ratio(both, seed=seed)
    return {"value": sum(n for n, _ in both) / total, "ci": [ci.lo, ci.hi] if ci is not None else None}


def lossless(pairs: Sequence[Pair]) -> dict[str, Any]:
    """Greedy pairs: how many texts were identical, parted only in their tails, or diverged; and the verdict."""
    greedy = [p for p in pairs if p.text is not None]
    counts = collections.Counter(p.text for p in greedy)
    diverged = counts["diverged"]
    if not greedy:
        word = "-"
    elif diverged >= NOT_LOSSLESS_MIN and diverged > NOT_LOSSLESS_SHARE * len(greedy):
        word = "not lossless"
    else:
        word = "lossless"
    at = [p.parted_at for p in greedy if p.text == "diverged" and p.parted_at is not None]
    return {
        "greedy_pairs": len(greedy),
        "identical": counts["identical"],
        "tail": counts["tail"],
        "diverged": diverged,
        "lossless": counts["identical"] + counts["tail"],
        "median_parted_at_char": median(at) if at else None,
        "verdict": word,
    }


def summarize_pairs(candidate: str, workload: str, pairs: Sequence[Pair], *, seed: int = 0) -> dict[str, Any]:
    speed = _figure(_values(pairs, "speedup"), seed)
    ci = Interval(*speed["ci"]) if speed["ci"] is not None else None
    word = verdict(speed["median"], ci)
    acc = _pooled(pairs, "accepted", "draft_tokens", seed)
    live_acc = _pooled(pairs, "live_accepted", "live_draft_tokens", seed)
    mal = _pooled(pairs, "accepted", "drafts", seed)
    out = {
        "pairs": len(pairs),
        "speedup": speed,  # decode tok/s, shadow over live: above 1, the candidate decodes faster
        "verdict": word,
        "tpot_ratio": _figure(_values(pairs, "tpot_ratio"), seed),
        "e2e_speedup": _figure(_values(pairs, "e2e_ratio"), seed),
        "ttft_delta_s": _figure(_values(pairs, "ttft_delta_s"), seed),
        "acceptance": acc,
        "live_acceptance": live_acc,
        "acceptance_delta": (
            acc["value"] - live_acc["value"] if acc["value"] is not None and live_acc["value"] is not None else None
        ),
        "mean_acceptance_length": 1 + mal["value"] if mal["value"] is not None else None,
        "lossless": lossless(pairs),
    }
    out["says"] = sentence(candidate, workload, out)
    return out


def sentence(candidate: str, workload: str, s: Mapping[str, Any]) -> str:
    """What a user reads, in this shape:
    ``mtp3 would be 1.31x [1.22-1.40] faster for code_agent at today's load, lossless on 412 of 412 greedy pairs``.
    """
    speed, word = s["speedup"], s["verdict"]
    if speed["median"] is None:
        head = f"{candidate}: no paired decode speed yet for {workload}"
    elif speed["ci"] is None:
        head = f"{candidate} would be {speed['median']:.2f}x for {workload} (too few pairs for an interval yet)"
    else:
        ci = speed["ci"]
        span = f" [{ci[0]:.2f}-{ci[1]:.2f}]"
        how = {"faster": "faster", "slower": "slower"}.get(word, "not distinguishable from today's")
        head = f"{candidate} would be {speed['median']:.2f}x{span} {how} for {workload} at today's load"
    ll = s["lossless"]
    if ll["greedy_pairs"]:
        tail = f", lossless on {ll['lossless']} of {ll['greedy_pairs']} greedy pairs"
        if ll["verdict"] == "not lossless":
            tail += " (NOT LOSSLESS: its texts part from the live server's)"
    else:
        tail = ", no greedy pairs to check losslessness"
    return head + tail + f" ({s['pairs']} pairs)"


def summarize(
    pairs: Mapping[tuple[str, str], Sequence[Pair]], *, seed: int = 0
) -> dict[str, dict[str, dict[str, Any]]]:
    """candidate -> workload -> its summary (:func:`summarize_pairs`)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (candidate, workload), ps in sorted(pairs.items()):
        if ps:
            out.setdefault(candidate, {})[workload] = summarize_pairs(candidate, workload, list(ps), seed=seed)
    return out


class Guard:
    """Whether live requests that ran while shadows were in flight are slower than those that ran without: the
    candidate shares something with the live server (a node, a network, a balancer) and shadowing is measurably
    disturbing it. Compares time per output token, per workload, over the last :data:`WINDOW` of each kind."""

    WINDOW = 500
    MIN_EACH = 30
    LIMIT = 1.10  # beside shadows, 10 % slower per token (median) stops shadowing

    def __init__(self) -> None:
        self._beside: dict[str, collections.deque[float]] = {}
        self._alone: dict[str, collections.deque[float]] = {}

    def observe(self, workload: str, tpot_s: float | None, beside_shadows: bool) -> None:
        if tpot_s is None or tpot_s <= 0:
            return
        book = self._beside if beside_shadows else self._alone
        book.setdefault(workload, collections.deque(maxlen=self.WINDOW)).append(tpot_s)

    def ratios(self) -> dict[str, float]:
        """workload -> median TPOT beside shadows over median TPOT without, where both have enough requests."""
        out = {}
        for w, beside in self._beside.items():
            alone = self._alone.get(w)
            if alone is None or len(beside) < self.MIN_EACH or len(alone) < self.MIN_EACH:
                continue
            b, a = median(list(beside)), median(list(alone))
            if b is not None and a:
                out[w] = b / a
        return out

    def tripped(self) -> str | None:
        """The workload whose live requests are over :data:`LIMIT` slower beside shadows, with the figure; else None."""
        for w, r in sorted(self.ratios().items()):
            if r > self.LIMIT:
                return f"{w}: live requests beside shadows {r:.2f}x slower per token"
        return None

    def reset(self) -> None:
        self._beside.clear()
        self._alone.clear()
