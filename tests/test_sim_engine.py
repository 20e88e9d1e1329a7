"""The pure simulator engine, driven with a fake clock: determinism, acceptance, counters, speed shape."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from specproxy.sim.config import DEFAULT_PROFILES, Profile, SimConfig, load_profiles
from specproxy.sim.corpus import CODE_LINES, EN_SENTENCES, EOS_TOKEN_ID, TokenStream, classify
from specproxy.sim.engine import EngineCore, SimRequest, new_request, step_time_s
from specproxy.sim.faults import GARBLED, garbled, parse_faults
from specproxy.sim.records import StepReport

LONG = {name: replace(p, min_output_tokens=1500, max_output_tokens=1500) for name, p in DEFAULT_PROFILES.items()}


def make(cfg: SimConfig, i: int, profile: str = "code", max_tokens: int = 100_000, engine: int = 0) -> SimRequest:
    return new_request(
        cfg,
        request_id=f"r{i}",
        kind="chat",
        profile_name=profile,
        prompt_tokens=50,
        max_tokens=max_tokens,
        engine=engine,
        started_at_s=0.0,
        content_key=f"request {i}".encode(),
    )


def drive(core: EngineCore, now_s: float = 0.0) -> tuple[float, list[StepReport]]:
    """Run the core until idle on a fake clock; return the clock and every step's report."""
    reports = []
    while core.has_work:
        now_s += core.begin_step(now_s)
        reports.append(core.finish_step(now_s))
    return now_s, reports


def run_batch(cfg: SimConfig, reqs: list[SimRequest]) -> tuple[EngineCore, list[StepReport]]:
    core = EngineCore(cfg)
    for r in reqs:
        core.register(r)
        core.submit(r, 0.0)
    _, reports = drive(core)
    return core, reports


def tokens_per_s(cfg: SimConfig, profile: str, n: int = 30) -> float:
    """Concurrency 1: one request at a time, total emitted tokens over total model time."""
    core = EngineCore(cfg)
    now = 0.0
    tokens = 0
    for i in range(n):
        req = make(cfg, i, profile)
        core.submit(req, now)
        start = now
        now, _ = drive(core, now)
        assert now > start
        tokens += req.truth.completion_tokens
    return tokens / now


def test_same_seed_same_everything_other_seed_differs() -> None:
    cfg = SimConfig(seed=7)
    a_core, a = run_batch(cfg, [make(cfg, i) for i in range(5)])
    b_core, b = run_batch(cfg, [make(cfg, i) for i in range(5)])
    assert [r.outputs for r in a] == [r.outputs for r in b]
    assert a_core.totals == b_core.totals
    other = SimConfig(seed=8)
    _, c = run_batch(other, [make(other, i) for i in range(5)])
    assert [r.outputs for r in a] != [r.outputs for r in c]


def test_text_does_not_depend_on_speculation() -> None:
    texts = []
    for method, k in (("none", 3), ("mtp", 1), ("mtp", 5), ("ngram", 3)):
        cfg = SimConfig(spec_method=method, num_speculative_tokens=k)
        _, reports = run_batch(cfg, [make(cfg, 3, "other")])
        texts.append("".join(t for r in reports for o in r.outputs for t in o.texts))
    assert len(set(texts)) == 1 and len(texts[0]) > 50


@pytest.mark.parametrize(("profile", "k"), [("code", 5), ("ja_chat", 3), ("other", 4)])
def test_conditional_acceptance_per_position_matches_profile(profile: str, k: int) -> None:
    cfg = SimConfig(num_speculative_tokens=k, profiles=LONG)
    core, _ = run_batch(cfg, [make(cfg, i, profile) for i in range(12)])
    t = core.totals
    reached = [t.drafts, *t.per_position[:-1]]  # drafts that got as far as position i
    for pos in range(k):
        assert reached[pos] > 300
        rate = t.per_position[pos] / reached[pos]
        assert rate == pytest.approx(DEFAULT_PROFILES[profile].accept[pos], abs=0.05), (pos, rate)


def test_counters_equal_sum_of_truth_and_prefill_gives_one_token() -> None:
    cfg = SimConfig(max_num_seqs=4, num_speculative_tokens=4)
    profiles = ["code", "ja_chat", "other"]
    reqs = [make(cfg, i, profiles[i % 3], max_tokens=20 + 37 * i) for i in range(10)]
    core, reports = run_batch(cfg, reqs)
    truths = [r.truth for r in reqs]
    t = core.totals
    assert t.drafts == sum(x.drafts for x in truths)
    assert t.draft_tokens == sum(x.draft_tokens for x in truths)
    assert t.accepted == sum(x.counted_accepted for x in truths)
    assert t.per_position == [sum(x.per_position[p] for x in truths) for p in range(4)]
    assert t.generation_tokens == sum(x.completion_tokens for x in truths)
    assert t.prompt_tokens == 50 * len(reqs)
    assert t.finished["stop"] + t.finished["length"] == len(reqs)
    assert max(len(r.outputs) for r in reports) == 4  # max_num_seqs held
    for x in truths:
        assert x.step_emitted[0] == 1
        assert sum(x.step_emitted) == x.completion_tokens <= x.max_tokens
        assert x.drafts == len(x.step_emitted) - 1  # mtp drafts on every decode step, never in prefill
    prefills = [o for r in reports for o in r.outputs if o.prefill]
    assert len(prefills) == len(reqs) and all(len(o.token_ids) == 1 and o.drafted == 0 for o in prefills)


def test_length_cut_counts_the_unemitted_tail_and_stop_ends_on_eos() -> None:
    cfg = SimConfig(num_speculative_tokens=4)
    reqs = [make(cfg, i, "code", max_tokens=33) for i in range(40)]
    run_batch(cfg, reqs)
    tails = []
    for r in reqs:
        t = r.truth
        assert t.accepted == t.completion_tokens - len(t.step_emitted)  # what the chunks show
        if t.finish_reason == "length":
            assert t.completion_tokens == 33
            tails.append(t.counted_accepted - t.accepted)
        else:
            assert t.finish_reason == "stop" and t.counted_accepted == t.accepted
    assert tails and all(0 <= d <= 4 for d in tails)
    assert any(d > 0 for d in tails)  # some cut steps had accepted drafts that were never sent
    stopped = [make(cfg, 1000 + i, "other", max_tokens=10_000) for i in range(5)]
    _, reports = run_batch(cfg, stopped)
    last = {o.request_id: o for r in reports for o in r.outputs if o.finish_reason}
    assert all(
        o.finish_reason == "stop" and o.token_ids[-1] == EOS_TOKEN_ID and o.texts[-1] == "" for o in last.values()
    )


def test_ngram_drafts_fewer_than_k_and_skips_steps() -> None:
    cfg = SimConfig(spec_method="ngram", num_speculative_tokens=3, profiles=LONG)
    reqs = [make(cfg, i, "ja_chat") for i in range(4)]
    core, reports = run_batch(cfg, reqs)
    t = core.totals
    decode_steps = sum(len(r.truth.step_emitted) - 1 for r in reqs)
    assert 1.0 < t.draft_tokens / t.drafts < 3.0
    assert t.drafts / decode_steps == pytest.approx(DEFAULT_PROFILES["ja_chat"].ngram_draft_prob, abs=0.05)
    assert all(o.accepted_counted == 0 for r in reports for o in r.outputs if o.drafted == 0)


def test_no_speculation_counts_nothing() -> None:
    cfg = SimConfig(spec_method="none")
    core, reports = run_batch(cfg, [make(cfg, i) for i in range(3)])
    assert core.totals.drafts == core.totals.draft_tokens == 0 and core.totals.per_position == []
    assert all(len(o.token_ids) == 1 for r in reports for o in r.outputs)


def test_roofline_shape_k1_beats_k3_beats_k5_for_japanese_chat_and_code_gains() -> None:
    base = SimConfig(spec_method="none")
    ja = {k: tokens_per_s(SimConfig(num_speculative_tokens=k), "ja_chat") for k in (1, 3, 5)}
    ja_base = tokens_per_s(base, "ja_chat")
    assert 100 < ja_base < 130  # the published 2B baseline, ~115 tok/s
    assert ja[1] > ja[3] > ja[5]
    assert 1.08 < ja[1] / ja_base < 1.3
    assert ja[5] < ja_base
    code = tokens_per_s(SimConfig(num_speculative_tokens=3), "code")
    assert 1.6 < code / tokens_per_s(base, "code") < 2.0


def test_a_bigger_batch_takes_longer_per_step() -> None:
    cfg = SimConfig()
    solo = EngineCore(cfg)
    solo.submit(make(cfg, 1), 0.0)
    t1 = solo.begin_step(0.0)
    crowd = EngineCore(cfg)
    for i in range(64):
        crowd.submit(make(cfg, i), 0.0)
    assert crowd.begin_step(0.0) > t1


def test_abort_removes_from_batch_and_counts() -> None:
    cfg = SimConfig()
    core = EngineCore(cfg)
    a, b = make(cfg, 1), make(cfg, 2)
    core.submit(a, 0.0)
    core.submit(b, 0.0)
    core.begin_step(0.0)
    assert core.abort("r1", 0.005)
    report = core.finish_step(0.01)
    assert [o.request_id for o in report.outputs] == ["r2"]
    assert a.truth.aborted and a.truth.aborted_at_s == 0.005 and a.truth.finish_reason == "abort"
    assert core.totals.finished["abort"] == 1
    assert not core.abort("r1", 0.02)


def test_classifier_and_corpus() -> None:
    assert classify((Path(__file__).parent / "data" / "prompt-code.txt").read_text()) == "code"
    assert classify("Hi! Can you tell me three fun facts about octopuses?") == "other"
    assert classify("こんにちは、元気ですか。") == "ja_chat"
    assert classify("Please fix this: int main() { return 0; }") == "code"
    for corpus in ("code", "ja", "en"):
        import random

        src = TokenStream(corpus, random.Random(1))
        pieces = [src.next()[0] for _ in range(300)]
        assert all(pieces) and max(len(p) for p in pieces) <= 12
        if corpus == "ja":
            assert all(len(p) <= 3 for p in pieces)
    assert "".join(TokenStream("en", random.Random(2)).next()[0] for _ in range(5))
    assert len(CODE_LINES) >= 30 and len(EN_SENTENCES) >= 30


def test_config_validation_and_profiles_file(tmp_path: Path) -> None:
    SimConfig().validate()
    bad = [
        SimConfig(num_speculative_tokens=0),
        SimConfig(engines=0),
        SimConfig(speed=-1.0),
        SimConfig(spec_method="medusa"),
        SimConfig(metrics_fault="explode"),
        SimConfig(per_request_spec_metrics="all"),
        SimConfig(request_faults="status=200"),
        SimConfig(profiles={"x": Profile(accept=(1.5,), ngram_draft_prob=0.5, corpus="en")}),
    ]
    for cfg in bad:
        with pytest.raises(ValueError) as e:
            cfg.validate()
        assert "\n" not in str(e.value)
    SimConfig(spec_method="none", num_speculative_tokens=0).validate()
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"code": {"accept": [0.9]}, "rag": {"accept": [0.7, 0.6], "corpus": "en"}}))
    profiles = load_profiles(path)
    assert profiles["code"].accept == (0.9,) and profiles["code"].corpus == "code"
    assert profiles["rag"].ngram_draft_prob == DEFAULT_PROFILES["other"].ngram_draft_prob
    assert profiles["rag"].accept_at(5) < profiles["rag"].accept_at(1)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profiles(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_profiles(tmp_path / "missing.json")
    assert parse_faults("status=503, stall=0.5,reset_after=3").reset_after == 3
    with pytest.raises(ValueError):
        parse_faults("explode=1")
    assert parse_faults("garble=0.25").garble == 0.25
    for bad in ("garble=1.5", "garble=-0.1", "garble=x"):
        with pytest.raises(ValueError, match="garble=P"):
            parse_faults(bad)


def test_a_broken_drafter_garbles_accepted_drafts_only_and_alike_every_time() -> None:
    texts = ("a", "b", "c", "bonus")
    assert garbled(texts, 0, 1.0, "r/1") == texts  # nothing accepted: nothing of the drafter's sent
    assert garbled(texts, 3, 0.0, "r/1") == texts  # a healthy drafter
    assert garbled(texts, 3, 1.0, "r/1") == (GARBLED, GARBLED, GARBLED, "bonus")  # the bonus token is the model's
    some = [garbled(texts, 3, 0.5, f"r/{i}") for i in range(50)]
    assert some == [garbled(texts, 3, 0.5, f"r/{i}") for i in range(50)]  # the same seed, the same garbling
    assert 0 < sum(t.count(GARBLED) for t in some) < 150


def _pinned_run(cfg: SimConfig) -> tuple[list[tuple[object, ...]], str]:
    """Step a mixed batch to completion (queueing, length cuts, natural stops, one abort mid-step).

    Returns per-request (completion_tokens, counted_accepted, drafts, draft_tokens, finish_reason) and a digest
    of every step's outputs and the final totals, so any change in the order of random draws shows up.
    """
    profiles = ["code", "ja_chat", "other"]
    reqs = [make(cfg, i, profiles[i % 3], max_tokens=30 + 97 * i) for i in range(7)]
    core = EngineCore(cfg)
    for r in reqs:
        core.register(r)
        core.submit(r, 0.0)
    now_s, steps = 0.0, 0
    digest = hashlib.sha256()
    while core.has_work:
        now_s += core.begin_step(now_s)
        steps += 1
        if steps == 5:
            core.abort("r1", now_s)  # r1 is in the batch with its drafts decided: its share is skipped
        report = core.finish_step(now_s)
        digest.update(orjson.dumps(dataclasses.asdict(report)))
    digest.update(orjson.dumps(core.totals.as_json()))
    truths = [
        (t.completion_tokens, t.counted_accepted, t.drafts, t.draft_tokens, t.finish_reason)
        for t in (r.truth for r in reqs)
    ]
    return truths, digest.hexdigest()


@pytest.mark.parametrize(
    ("method", "k", "expected_truths", "expected_digest"),
    [
        (
            "mtp",
            3,
            [
                (30, 21, 11, 33, "length"),
                (5, 1, 3, 9, "abort"),
                (224, 121, 103, 309, "length"),
                (215, 139, 75, 225, "stop"),
                (363, 129, 233, 699, "stop"),
                (270, 139, 130, 390, "stop"),
                (84, 53, 30, 90, "stop"),
            ],
            "8382be2f7ec050850dd6a42e485e3f2568a9159f5daba252f17c1dc26a69c878",
        ),
        (
            "ngram",
            4,
            [
                (30, 21, 10, 36, "length"),
                (7, 3, 3, 9, "abort"),
                (224, 57, 53, 194, "length"),
                (215, 140, 71, 262, "stop"),
                (363, 43, 63, 236, "stop"),
                (270, 62, 62, 230, "stop"),
                (84, 52, 24, 91, "stop"),
            ],
            "15576e255aa20934fffa7094fecdfc082dc0ef2b21c69fef3be5469475fecff4",
        ),
        (
            "none",
            3,
            [
                (30, 0, 0, 0, "length"),
                (4, 0, 0, 0, "abort"),
                (224, 0, 0, 0, "length"),
                (215, 0, 0, 0, "stop"),
                (363, 0, 0, 0, "stop"),
                (270, 0, 0, 0, "stop"),
                (84, 0, 0, 0, "stop"),
            ],
            "1014fee8dd951e09ce676b8d76e8f04353b8330ac6ac9e3d8400be02a96b11a1",
        ),
    ],
)
def test_seeded_run_is_pinned(
    method: str, k: int, expected_truths: list[tuple[object, ...]], expected_digest: str
) -> None:
    cfg = SimConfig(seed=11, spec_method=method, num_speculative_tokens=k, max_num_seqs=3)
    truths, digest = _pinned_run(cfg)
    assert truths == expected_truths
    assert digest == expected_digest


def test_step_time_is_memory_bound_small_and_compute_bound_large() -> None:
    cfg = SimConfig(compute_s_per_token=0.0002)
    base = SimConfig()
    # batch 1, k = 3: 4 positions verified, far under the weights' time: as without a compute roof
    assert step_time_s(cfg, 1, 3, 0, 4) == step_time_s(base, 1, 3, 0, 4)
    # batch 32: 32 positions without drafts are still memory-bound, 128 with k = 3 are not
    assert step_time_s(cfg, 32, 0, 0, 32) == step_time_s(base, 32, 0, 0, 32)
    assert step_time_s(cfg, 32, 3, 0, 128) > step_time_s(base, 32, 3, 0, 128) + 0.01

    # the knee comes at a smaller batch the more positions each step verifies
    def knee(k: int) -> int:
        return next(
            b for b in range(1, 500) if step_time_s(cfg, b, k, 0, b * (1 + k)) > step_time_s(base, b, k, 0, b * (1 + k))
        )

    assert knee(0) > knee(1) > knee(3)


def _tokens_per_model_s(cfg: SimConfig, streams: int, profile: str) -> float:
    core = EngineCore(cfg)
    for i in range(streams):
        r = make(cfg, i, profile, max_tokens=120)
        core.register(r)
        core.submit(r, 0.0)
    now_s, tokens = 0.0, 0
    while core.has_work:
        now_s += core.begin_step(now_s)
        tokens += sum(len(o.token_ids) for o in core.finish_step(now_s).outputs)
    return tokens / now_s


def test_speculation_pays_at_low_load_and_loses_past_the_knee() -> None:
    """The crossover under load, with a known truth: MTP k = 3 on code beats no speculation at one stream and loses
    at 128 once verification is compute-bound; without a compute roof it never loses."""
    roof = {"compute_s_per_token": 0.0002, "max_num_seqs": 256}
    spec = SimConfig(spec_method="mtp", num_speculative_tokens=3, **roof)  # type: ignore[arg-type]
    plain = SimConfig(spec_method="none", **roof)  # type: ignore[arg-type]
    assert _tokens_per_model_s(spec, 1, "code") > 1.3 * _tokens_per_model_s(plain, 1, "code")
    assert _tokens_per_model_s(spec, 128, "code") < _tokens_per_model_s(plain, 128, "code")
    no_roof = SimConfig(spec_method="mtp", num_speculative_tokens=3, max_num_seqs=256)
    assert _tokens_per_model_s(no_roof, 128, "code") > _tokens_per_model_s(
        SimConfig(spec_method="none", max_num_seqs=256), 128, "code"
    )
