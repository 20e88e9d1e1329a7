"""Which records are the same request in two runs (specproxy.analysis.figures.pairing): the same workload and body,
the model aside; or the request a replay or a shadow re-sent."""

from __future__ import annotations

from typing import Any

from specproxy.analysis.figures.pairing import body_key, replay_key
from specproxy.core.record import Record
from tests.analysisutil import make_record


def _rec(body: Any, workload: str = "chat", **kw: Any) -> Record:
    r = make_record("r1", workload=workload, replay_of=kw.pop("replay_of", None))
    r["request"] = body
    for k, v in kw.items():
        r[k] = v  # type: ignore[literal-required]
    return r


BODY = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_the_same_body_pairs_whatever_the_model_and_the_key_order() -> None:
    key = body_key(_rec(BODY))
    assert key is not None and key.startswith("chat:")
    reordered = {"max_tokens": 8, "messages": [{"content": "hi", "role": "user"}], "model": "b"}
    assert body_key(_rec(reordered)) == key
    assert body_key(_rec({k: v for k, v in BODY.items() if k != "model"})) == key


def test_another_body_or_workload_does_not_pair() -> None:
    key = body_key(_rec(BODY))
    assert body_key(_rec({**BODY, "max_tokens": 9})) != key
    assert body_key(_rec(BODY, workload="code")) != key


def test_no_body_or_one_that_is_not_json_is_unpaired() -> None:
    assert body_key(_rec(None)) is None
    assert body_key(_rec({"x": {1, 2}})) is None
    assert body_key(_rec("plain text")) is not None  # a text body still is a body


def test_a_replay_pairs_by_what_it_re_sent_a_shadow_by_its_live_request_the_rest_by_their_own_id() -> None:
    assert replay_key(_rec(None, replay_of="orig")) == "orig"
    assert replay_key(_rec(None, shadow_of="live")) == "live"
    assert replay_key(_rec(None, request_id="own")) == "own"
