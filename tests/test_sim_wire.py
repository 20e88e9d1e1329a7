"""The simulator's wire format (specproxy.sim.wire): request validation with vLLM's errors, the per-request
metrics arithmetic, and events and bodies that match the real vLLM captures in tests/data/ byte for byte or key for
key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from specproxy.sim.config import SimConfig
from specproxy.sim.records import RequestTruth
from specproxy.sim.wire import ApiError, StreamFormatter, full_body, parse_request, request_metrics

DATA = Path(__file__).parent / "data"
CFG = SimConfig(max_model_len=4096)


def _parse(body: Any, kind: str = "chat", profile: str | None = "other") -> Any:
    return parse_request(kind, orjson.dumps(body), CFG, profile)


def _refused(body: Any, kind: str = "chat", raw: bytes | None = None) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse_request(kind, raw if raw is not None else orjson.dumps(body), CFG, "other")
    return e.value


BAD_CONTENT = "message content must be a string or a list of content parts"
OPTIONS_NEED_STREAM = "Stream options can only be defined when `stream=True`."
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_a_chat_request_is_read_with_its_options() -> None:
    p = _parse({**CHAT, "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}})
    assert (p.kind, p.stream, p.include_usage, p.continuous_usage, p.max_tokens, p.profile) == (
        "chat", True, True, False, 7, "other",
    )  # fmt: skip
    assert _parse(CHAT).max_tokens == CFG.default_max_tokens
    assert _parse({**CHAT, "max_completion_tokens": 3, "max_tokens": 9}).max_tokens == 3


def test_the_content_key_depends_on_what_was_asked_not_on_how_it_is_delivered() -> None:
    plain = _parse(CHAT)
    streamed = _parse({**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": 1}})
    assert plain.content_key == streamed.content_key and streamed.continuous_usage
    assert _parse({"messages": [{"role": "user", "content": "ho"}]}).content_key != plain.content_key
    assert _parse(CHAT, profile="code").content_key != plain.content_key


def test_completion_prompts_as_text_a_one_string_list_or_token_ids() -> None:
    assert _parse({"prompt": ["x y"]}, "completion").content_key == _parse({"prompt": "x y"}, "completion").content_key
    ids = _parse({"prompt": [5, 6, 7]}, "completion")
    assert (ids.prompt_tokens, ids.prefix_keys) == (3, ())


@pytest.mark.parametrize(
    ("body", "status", "message", "param"),
    [
        ([1], 400, "request body must be a JSON object", None),
        ({**CHAT, "model": "other"}, 404, "The model `other` does not exist.", "model"),
        ({"messages": []}, 400, "Field required: messages must be a non-empty list", None),
        ({"messages": [{"content": "x"}]}, 400, "each message must be an object with a string role", None),
        ({"messages": [{"role": "user", "content": 3}]}, 400, BAD_CONTENT, None),
        ({**CHAT, "max_tokens": 0}, 400, "max_tokens must be at least 1, got 0.", "max_tokens"),
        ({**CHAT, "max_tokens": True}, 400, "max_tokens must be at least 1, got True.", "max_tokens"),
        ({**CHAT, "n": 2}, 400, "n must be 1 on this server, got 2.", "n"),
        ({**CHAT, "stream": "yes"}, 400, "stream must be a boolean", "stream"),
        ({**CHAT, "stream_options": []}, 400, "stream_options must be an object", "stream_options"),
        ({**CHAT, "stream_options": {"include_usage": True}}, 400, OPTIONS_NEED_STREAM, "stream_options"),
    ],
)  # fmt: skip
def test_bad_requests_get_vllms_errors(body: Any, status: int, message: str, param: str | None) -> None:
    e = _refused(body)
    assert (e.status, e.message, e.param) == (status, message, param)
    kind = "BadRequestError" if status == 400 else "NotFoundError"
    assert orjson.loads(e.body()) == {"error": {"message": message, "type": kind, "param": param, "code": status}}


def test_other_refusals() -> None:
    assert _refused(None, raw=b"{").message.startswith("JSON decode error")
    assert (
        _refused({"prompt": 5}, "completion").message
        == "Field required: prompt must be a string or a list of token ids"
    )
    too_long = _refused({"prompt": [1] * 100, "max_tokens": 4000}, "completion")
    assert too_long.message == (
        "This model's maximum context length is 4096 tokens. However, you requested 4100 tokens (100 in the "
        "messages, 4000 in the completion)."
    )
    with pytest.raises(ApiError, match="unknown X-Sim-Profile 'nope'"):
        parse_request("chat", orjson.dumps(CHAT), CFG, " nope ")


def test_request_metrics_follow_vllms_definitions() -> None:
    t = RequestTruth(
        id="r", kind="chat", profile="chat", engine=0, prompt_tokens=10, max_tokens=8, natural_tokens=8,
        started_at_s=1.0, completion_tokens=5, counted_accepted=3, drafts=2, draft_tokens=6,
        per_step_accepted=[3, 0], per_step_drafted=[3, 3], submitted_at_s=1.0, admitted_at_s=1.5,
        first_token_at_s=2.0, finished_at_s=4.0,
    )  # fmt: skip
    m = request_metrics(t, "detailed", 3)
    assert m["queue_time_ms"] == pytest.approx(500.0)
    assert m["time_to_first_token_ms"] == pytest.approx(500.0)  # from the step that scheduled it
    assert m["generation_time_ms"] == pytest.approx(2000.0)
    assert m["mean_itl_ms"] == pytest.approx(500.0)  # 2 s over 4 gaps
    assert m["tokens_per_second"] == pytest.approx(5 / 2.5)
    spec = m["speculative_decoding"]
    assert spec == {
        "mean_acceptance_length": pytest.approx(2.5), "draft_acceptance_rate": pytest.approx(0.5),
        "acceptance_histogram": [1, 0, 0, 1], "num_spec_steps": 2, "num_accepted_draft_tokens": 3,
        "num_draft_tokens": 6, "num_spec_tokens": 3, "per_step_accepted": [3, 0], "per_step_drafted": [3, 3],
    }  # fmt: skip
    assert "per_step_accepted" not in request_metrics(t, "summary", 3)["speculative_decoding"]
    assert "speculative_decoding" not in request_metrics(t, "detailed", 0)


def test_stream_events_are_vllms_bytes() -> None:
    events = [e + b"\n\n" for e in (DATA / "chat-stream-ngram-k3-chat.sse").read_bytes().split(b"\n\n") if e]
    first = json.loads(events[0][6:])
    last_delta = json.loads(events[-3][6:])
    fmt = StreamFormatter(
        kind="chat", response_id=first["id"], created=first["created"], model=first["model"],
        prompt_tokens=first["usage"]["prompt_tokens"], continuous_usage=True, return_token_ids=False,
        system_fingerprint=json.loads(events[-2][6:])["system_fingerprint"],
    )  # fmt: skip
    n = last_delta["usage"]["completion_tokens"]
    assert fmt.role_event() == events[0]
    assert fmt.delta_event(json.loads(events[1][6:])["choices"][0]["delta"]["content"], [1], None, 1) == events[1]
    text = last_delta["choices"][0]["delta"]["content"]
    assert fmt.delta_event(text, [1], last_delta["choices"][0]["finish_reason"], n) == events[-3]
    assert fmt.usage_event(n, None) == events[-2]
    assert events[-1] == b"data: [DONE]\n\n"


def _keys(v: Any) -> Any:
    if isinstance(v, dict):
        return [(k, _keys(x)) for k, x in v.items()]
    if isinstance(v, list):
        return [_keys(x) for x in v]
    return None


def test_the_non_streamed_body_has_vllms_fields_in_vllms_order() -> None:
    cap = json.loads((DATA / "chat-nonstream-ngram-k3.json").read_text())
    choice = cap["choices"][0]
    fmt = StreamFormatter(
        kind="chat", response_id=cap["id"], created=cap["created"], model=cap["model"],
        prompt_tokens=cap["usage"]["prompt_tokens"], continuous_usage=False, return_token_ids=False,
        system_fingerprint=cap["system_fingerprint"],
    )  # fmt: skip
    ids = [0] * cap["usage"]["completion_tokens"]
    body = orjson.loads(full_body(fmt, choice["message"]["content"], ids, choice["finish_reason"], cap["metrics"]))
    assert body == cap
    assert _keys(body) == _keys(cap)
