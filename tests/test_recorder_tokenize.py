"""``--tokenizer server`` (specproxy.recorder.tokenize): which timelines are recounted by the engine's /tokenize,
what is read from its answer, and every failure leaving the local counts, said once. The engine is a fake session
object (the HTTP call itself is reached end to end)."""

from __future__ import annotations

import dataclasses
import logging
from types import TracebackType
from typing import Any

import aiohttp
import pytest

from specproxy.core.timeline import TimelineResult, timeline_for
from specproxy.recorder.tokenize import ServerTokenizer

URL = "http://engine/tokenize"


def _timeline(texts: tuple[str, ...] = ("Hello", " big", " world")) -> TimelineResult:
    tl = timeline_for(0, path="/v1/chat/completions", content_type="text/event-stream", keep_text=True)
    for i, s in enumerate(texts):
        tl.feed((i + 1) * 10_000_000, f'data: {{"choices":[{{"index":0,"delta":{{"content":"{s}"}}}}]}}\n\n'.encode())
    tl.feed(50_000_000, b"data: [DONE]\n\n")
    return tl.result(60_000_000)


class FakeResponse:
    def __init__(self, status: int, answer: Any) -> None:
        self.status = status
        self._answer = answer

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        return None

    async def json(self, content_type: str | None = "application/json") -> Any:
        if isinstance(self._answer, Exception):
            raise self._answer
        return self._answer


class FakeSession:
    """Answers every POST with ``status`` and ``answer`` (or raises ``answer`` when it is an exception)."""

    def __init__(self, status: int = 200, answer: Any = None, fail: Exception | None = None) -> None:
        self.status, self.answer, self.fail = status, answer, fail
        self.posts: list[tuple[str, dict[str, Any]]] = []

    def post(self, url: str, *, json: dict[str, Any], headers: dict[str, str], timeout: object) -> FakeResponse:
        self.posts.append((url, json))
        if self.fail is not None:
            raise self.fail
        return FakeResponse(self.status, self.answer)


def _tok(session: FakeSession) -> ServerTokenizer:
    return ServerTokenizer(session, URL)  # type: ignore[arg-type]


async def test_the_engines_count_replaces_the_local_one_and_scales_the_chunks() -> None:
    session = FakeSession(answer={"count": 6, "max_model_len": 4096, "tokens": [1] * 6})
    tl, failed = await _tok(session).recount(_timeline(), "m")
    assert not failed
    assert session.posts == [(URL, {"prompt": "Hello big world", "add_special_tokens": False, "model": "m"})]
    assert (tl.completion_tokens, tl.token_source, sum(n for _, n in tl.chunks)) == (6, "server_tokenize", 6)


async def test_without_a_count_the_tokens_are_counted_and_without_a_model_none_is_sent() -> None:
    session = FakeSession(answer={"tokens": [5, 6, 7, 8]})
    tl, failed = await _tok(session).recount(_timeline(), None)
    assert (tl.completion_tokens, failed) == (4, False)
    assert "model" not in session.posts[0][1]


@pytest.mark.parametrize("source", ["usage", "token_ids", "none"])
async def test_exact_or_empty_counts_are_not_recounted(source: str) -> None:
    session = FakeSession(answer={"count": 99})
    tl = dataclasses.replace(_timeline(), token_source=source)  # type: ignore[arg-type]
    assert await _tok(session).recount(tl, "m") == (tl, False)
    no_text = dataclasses.replace(_timeline(), response_text=None)
    assert await _tok(session).recount(no_text, "m") == (no_text, False)
    assert session.posts == []


async def test_a_cut_text_is_not_counted_and_says_it_failed() -> None:
    session = FakeSession(answer={"count": 99})
    tl = dataclasses.replace(_timeline(), text_complete=False)
    assert await _tok(session).recount(tl, "m") == (tl, True)
    assert session.posts == []


@pytest.mark.parametrize(
    "session",
    [
        FakeSession(status=500, answer={"count": 9}),
        FakeSession(answer={"count": -1}),
        FakeSession(answer={"count": True}),
        FakeSession(answer={"count": "6"}),
        FakeSession(answer=[6]),
        FakeSession(answer=ValueError("not JSON")),
        FakeSession(fail=aiohttp.ClientConnectionError("refused")),
        FakeSession(fail=TimeoutError()),
    ],
)
async def test_a_failed_call_leaves_the_local_counts(session: FakeSession) -> None:
    tl = _timeline()
    assert await _tok(session).recount(tl, "m") == (tl, True)


async def test_the_failure_is_said_once_without_the_engines_address(caplog: pytest.LogCaptureFixture) -> None:
    tok = _tok(FakeSession(fail=aiohttp.ClientConnectionError(f"cannot connect to {URL}")))
    with caplog.at_level(logging.WARNING, logger="specproxy.recorder"):
        for _ in range(3):
            await tok.recount(_timeline(), "m")
    assert len(caplog.records) == 1
    assert "ClientConnectionError" in caplog.text and "engine/tokenize" not in caplog.text
