"""The simulated vLLM V1 engine core: continuous batching with speculative decoding, and its ground truth.

Pure: no sockets, no clock, no sleeping. The caller drives it one step at a time:

    duration_s = core.begin_step()        # admit waiting requests, decide drafts, price the step
    (wait duration_s, or advance a fake clock)
    outputs = core.finish_step(now_s)     # draw acceptance, emit tokens, update counters and truth

A newly admitted request spends its first step in prefill and gets exactly one token, no drafts. Every later
step gives 1 + accepted tokens, where draft position i is accepted with the profile's conditional probability
only if position i-1 was. A request cut by max_tokens still counts all of its last step's accepted drafts in
the counters and its per-request stats, as vLLM does (the scheduler counts before the stop check truncates).
A request that stops by itself ends exactly on its EOS, so the counters agree with what was emitted.
The records it fills in (truth, totals, step outputs and reports) are defined in records.py.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass

from specproxy.attribution.spans import position_bucket
from specproxy.sim.config import Profile, SimConfig
from specproxy.sim.corpus import EOS_TOKEN_ID, TokenStream
from specproxy.sim.records import RequestTruth, StepOutput, StepReport, Totals

# ngram: how concentrated requests' drafting probabilities are around their profile's mean (Beta a + b; lower is
# more spread)
NGRAM_DRAFT_CONCENTRATION = 3.0


@dataclass(slots=True)
class SimRequest:
    """One request inside the engine: its generation plan, its random streams and its truth record."""

    truth: RequestTruth
    profile: Profile
    text: TokenStream
    accept_rng: random.Random
    draft_prob: float = 1.0  # ngram: this request's chance that a step finds a match and drafts
    emitted: int = 0
    prefilled: bool = False
    drafted_now: int = 0
    last_token_at_s: float | None = None

    @property
    def id(self) -> str:
        return self.truth.id


def step_time_s(
    cfg: SimConfig, batch_size: int, max_drafted: int, prefill_tokens: int, tokens_verified: int = 0
) -> float:
    """The roofline step time (before `speed`): see the formula in config.py's module docstring. The compute roof is
    added as what it exceeds the memory time by, so that without one the sum is the same, to the bit, as before."""
    memory = cfg.model_bytes / cfg.bandwidth_bytes_s + cfg.per_seq_s * batch_size
    over_memory = max(0.0, cfg.compute_s_per_token * tokens_verified - memory)
    return (
        cfg.model_bytes / cfg.bandwidth_bytes_s
        + cfg.fixed_overhead_s
        + cfg.per_draft_token_s * max_drafted
        + cfg.per_seq_s * batch_size
        + cfg.prefill_s_per_token * prefill_tokens
        + over_memory
    )


def new_request(
    cfg: SimConfig,
    *,
    request_id: str,
    kind: str,
    profile_name: str,
    prompt_tokens: int,
    max_tokens: int,
    engine: int,
    started_at_s: float,
    content_key: bytes,
) -> SimRequest:
    """Build a request whose text, length and acceptance draws depend only on the seed and `content_key`.

    Text and acceptance use separate random streams, so the same request gets the same answer whatever the
    speculative method or k: only how it is chunked into steps changes.
    """
    profile = cfg.profiles[profile_name]
    digest = hashlib.blake2b(content_key, digest_size=16, key=str(cfg.seed).encode()[:64]).digest()
    text_rng = random.Random(int.from_bytes(digest[:8], "big"))
    accept_rng = random.Random(int.from_bytes(digest[8:], "big"))
    natural = text_rng.randint(profile.min_output_tokens, profile.max_output_tokens)
    truth = RequestTruth(
        id=request_id,
        kind=kind,
        profile=profile_name,
        engine=engine,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        natural_tokens=natural,
        started_at_s=started_at_s,
        per_position=[0] * cfg.k,
    )
    return SimRequest(
        truth=truth,
        profile=profile,
        text=TokenStream(profile.corpus, text_rng),
        accept_rng=accept_rng,
        draft_prob=_draft_prob(profile.ngram_draft_prob, random.Random(digest + b"ngram")),
    )


def _draft_prob(mean: float, rng: random.Random) -> float:
    """One request's ngram drafting probability: Beta-distributed around the profile's mean, because a reply that
    repeats its context finds matches on most steps and one that does not on few (replies of one workload on real vLLM
    differ that much)."""
    if mean <= 0.0 or mean >= 1.0:
        return mean
    return rng.betavariate(mean * NGRAM_DRAFT_CONCENTRATION, (1.0 - mean) * NGRAM_DRAFT_CONCENTRATION)


class EngineCore:
    """One data-parallel engine: a waiting queue, a running batch, counters and truth updates."""

    def __init__(self, cfg: SimConfig, index: int = 0) -> None:
        self.cfg = cfg
        self.index = index
        self.k = cfg.k
        self.totals = Totals(k=self.k)
        self._pending: dict[str, SimRequest] = {}  # registered, not yet submitted (e.g. a stall fault)
        self._waiting: deque[SimRequest] = deque()
        self._running: dict[str, SimRequest] = {}
        self._stepping: list[SimRequest] = []

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def reset_totals(self) -> None:
        self.totals = Totals(k=self.k)

    def register(self, req: SimRequest) -> None:
        """Know about a request before it reaches the queue, so an abort can still be recorded."""
        self._pending[req.id] = req

    def submit(self, req: SimRequest, now_s: float) -> None:
        self._pending.pop(req.id, None)
        req.truth.submitted_at_s = now_s
        self._waiting.append(req)

    def abort(self, request_id: str, now_s: float, reason: str = "abort") -> bool:
        """Remove a request wherever it is; count it as finished with `reason`. False if already finished."""
        req = self._pending.pop(request_id, None) or self._running.pop(request_id, None)
        if req is None:
            for i, waiting in enumerate(self._waiting):
                if waiting.id == request_id:
                    req = waiting
                    del self._waiting[i]
                    break
        if req is None:
            return False
        truth = req.truth
        truth.finish_reason = reason
        truth.finished_at_s = now_s
        if reason == "abort":
            truth.aborted = True
            truth.aborted_at_s = now_s
        self.totals.finished[reason] += 1
        return True

    def begin_step(self, now_s: float) -> float:
        """Admit waiting requests, decide this step's drafts, and return its duration in model seconds."""
        prefill_tokens = 0
        while self._waiting and len(self._running) < self.cfg.max_num_seqs:
            req = self._waiting.popleft()
            self._running[req.id] = req
            req.truth.admitted_at_s = now_s
            prefill_tokens += req.truth.prompt_tokens - req.truth.cached_tokens
        max_drafted = verified = 0
        for req in self._running.values():
            req.drafted_now = self._draft_count(req) if req.prefilled else 0
            max_drafted = max(max_drafted, req.drafted_now)
            verified += 1 + req.drafted_now
        self._stepping = list(self._running.values())
        return step_time_s(self.cfg, len(self._stepping), max_drafted, prefill_tokens, verified)

    def _draft_count(self, req: SimRequest) -> int:
        if self.k == 0:
            return 0
        if self.cfg.spec_method != "ngram":
            return self.k
        rng = req.accept_rng
        if rng.random() >= req.draft_prob:
            return 0  # no n-gram match: this step drafts nothing and counts nothing
        # A short match proposes fewer than k tokens; most matches are long enough for all k.
        return self.k if rng.random() < 0.8 else rng.randint(1, self.k)

    def finish_step(self, now_s: float) -> StepReport:
        """Run the verification of the step begun by `begin_step` and return what each request got.

        Each request of the batch still running (one aborted while the step ran is skipped) is advanced in
        batch order, completely before the next one: `_advance` draws how many of its drafts are accepted,
        decides how many tokens it emits and whether it finishes, draws those tokens, updates its truth and
        retires it if it finished. `_close_step` then adds the step to the engine's totals. Each request draws
        from its own random streams in this fixed order, so a seed always gives the same run.
        """
        outputs: list[StepOutput] = []
        admitted_prompt = 0
        for req in self._stepping:
            if req.id not in self._running:
                continue  # aborted while the step ran
            if not req.prefilled:
                admitted_prompt += req.truth.prompt_tokens
            outputs.append(self._advance(req, now_s))
        self._stepping = []
        return self._close_step(outputs, admitted_prompt)

    def _advance(self, req: SimRequest, now_s: float) -> StepOutput:
        """One request's share of the step: verify its drafts, emit its tokens, record it, retire it if done."""
        prefill = not req.prefilled
        req.prefilled = True
        drafted = req.drafted_now
        drawn = _draw_accepted(req, drafted)
        n_emit, accepted, finish = _plan_emission(req.truth, req.emitted, drawn)
        index = req.emitted
        texts, ids = _emit_tokens(req, n_emit, ends_on_eos=finish == "stop")
        req.emitted += n_emit
        _record_verification(req.truth, drafted, accepted, n_emit, prefill)
        if not prefill:
            _record_span(req.truth, req.text.span, index, drafted, n_emit)
        req.truth.completion_tokens = req.emitted
        ttft, itl, queue = _stamp_token_times(req, prefill, now_s)
        e2e = self._retire(req, finish, now_s) if finish is not None else None
        return StepOutput(
            request_id=req.id,
            texts=tuple(texts),
            token_ids=tuple(ids),
            drafted=drafted,
            accepted_counted=accepted,
            completion_tokens=req.emitted,
            finish_reason=finish,
            prefill=prefill,
            ttft_s=ttft,
            itl_s=itl,
            e2e_s=e2e,
            queue_s=queue,
        )

    def _retire(self, req: SimRequest, finish: str, now_s: float) -> float:
        """Take a finished request out of the batch and count it; return its end-to-end latency."""
        truth = req.truth
        truth.finish_reason = finish
        truth.finished_at_s = now_s
        self.totals.finished[finish] += 1
        del self._running[req.id]
        return now_s - (truth.submitted_at_s if truth.submitted_at_s is not None else now_s)

    def _close_step(self, outputs: list[StepOutput], admitted_prompt: int) -> StepReport:
        """Sum the step's outputs into a report and add it to the engine's totals."""
        drafts = draft_tokens = accepted = 0
        per_pos = [0] * self.k
        for out in outputs:
            if out.drafted:
                drafts += 1
                draft_tokens += out.drafted
                accepted += out.accepted_counted
                for pos in range(out.accepted_counted):
                    per_pos[pos] += 1
        read_bytes = self.cfg.model_bytes if outputs else 0
        t = self.totals
        t.drafts += drafts
        t.draft_tokens += draft_tokens
        t.accepted += accepted
        for pos, n in enumerate(per_pos):
            t.per_position[pos] += n
        t.prompt_tokens += admitted_prompt
        t.generation_tokens += sum(len(o.token_ids) for o in outputs)
        t.read_bytes += read_bytes
        t.steps += 1
        return StepReport(
            engine=self.index,
            outputs=tuple(outputs),
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted=accepted,
            per_position=tuple(per_pos),
            prompt_tokens=admitted_prompt,
            read_bytes=read_bytes,
        )


def _draw_accepted(req: SimRequest, drafted: int) -> int:
    """How many of `drafted` draft tokens the target model accepts: position i only if i-1 was. With per-span
    acceptance (`Profile.span_accept`), by the span of the text the step starts in, and never past that span's end."""
    span, left = req.text.ahead() if req.profile.span_accept is not None and drafted else (None, drafted + 1)
    drafted = min(drafted, left - 1)
    accepted = 0
    while accepted < drafted and req.accept_rng.random() < req.profile.accept_at(accepted, span):
        accepted += 1
    return accepted


def _record_span(truth: RequestTruth, span: str, index: int, drafted: int, n_emit: int) -> None:
    """One decode step in the truth per span type (of its last token's text) and per output position (of its first
    token): steps, tokens, accepted (emitted) and draft tokens, as a record's `spans` counts them."""
    for table, key in ((truth.spans, span), (truth.positions, str(position_bucket(index)))):
        cell = table.get(key)
        if cell is None:
            cell = table[key] = [0, 0, 0, 0]
        cell[0] += 1
        cell[1] += n_emit
        cell[2] += n_emit - 1
        cell[3] += drafted


def _plan_emission(truth: RequestTruth, emitted: int, accepted: int) -> tuple[int, int, str | None]:
    """Tokens to emit this step, accepted drafts to count, and the finish reason (None: keeps running).

    An EOS within reach ends the request on it, and nothing after it counts (it was never verified). A cut by
    max_tokens emits only up to the limit but still counts every accepted draft, as vLLM's scheduler does.
    """
    remaining_natural = truth.natural_tokens - emitted
    remaining_max = truth.max_tokens - emitted
    if remaining_natural <= min(1 + accepted, remaining_max):
        return remaining_natural, remaining_natural - 1, "stop"
    if remaining_max <= 1 + accepted:
        return remaining_max, accepted, "length"
    return 1 + accepted, accepted, None


def _emit_tokens(req: SimRequest, n_emit: int, *, ends_on_eos: bool) -> tuple[list[str], list[int]]:
    """Draw the step's tokens from the request's text stream; an EOS (empty text) replaces the last one."""
    texts: list[str] = []
    ids: list[int] = []
    for i in range(n_emit):
        if ends_on_eos and i == n_emit - 1:
            texts.append("")
            ids.append(EOS_TOKEN_ID)
        else:
            piece, tid = req.text.next()
            texts.append(piece)
            ids.append(tid)
    return texts, ids


def _record_verification(truth: RequestTruth, drafted: int, accepted: int, n_emit: int, prefill: bool) -> None:
    """Add one step's drafts, counted acceptances and emitted tokens to the request's truth."""
    if drafted:
        for pos in range(accepted):
            truth.per_position[pos] += 1
        truth.drafts += 1
        truth.draft_tokens += drafted
        truth.counted_accepted += accepted
        truth.per_step_accepted.append(accepted)
        truth.per_step_drafted.append(drafted)
    if not prefill:
        truth.accepted += n_emit - 1
    truth.step_emitted.append(n_emit)


def _stamp_token_times(req: SimRequest, prefill: bool, now_s: float) -> tuple[float | None, float | None, float | None]:
    """Record that tokens arrived now; return (time to first token, inter-token latency, queue time)."""
    truth = req.truth
    ttft = itl = queue = None
    if prefill:
        truth.first_token_at_s = now_s
        submitted = truth.submitted_at_s if truth.submitted_at_s is not None else now_s
        ttft = now_s - submitted
        queue = (truth.admitted_at_s if truth.admitted_at_s is not None else now_s) - submitted
    elif req.last_token_at_s is not None:
        itl = now_s - req.last_token_at_s
    req.last_token_at_s = now_s
    return ttft, itl, queue
