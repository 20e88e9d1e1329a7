"""Bounded work for what clients and rules files can send: linear-time classification, capped /metrics reads."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from aiohttp import web

from specproxy.attribution.ledger import CounterLedger
from specproxy.core.prom import MetricsParseError, parse_snapshot
from specproxy.core.workload_rules import (
    MAX_CLASSIFIED_CHARS,
    RulesError,
    WorkloadResolver,
    classify_text,
    parse_rules,
)
from specproxy.recorder.scraper import Scraper

DATA = Path(__file__).parent / "data"  # real vLLM 0.32 captures (tests/data/README.md)


@pytest.mark.timeout(20)
def test_the_classifier_is_linear_in_pathological_prompts() -> None:
    # Python's re took 18 s on 20,000 newlines (quadratic): ten times that would take half an hour
    assert classify_text("\n" * 200_000) == "other"
    assert classify_text("a" * 200_000) == "other"
    assert classify_text("def f(x):\n    return {x};\n" + "\n" * 200_000) == "code"


@pytest.mark.timeout(20)
def test_a_catastrophic_user_rule_matches_in_linear_time() -> None:
    rules = parse_rules(b'{"rules": [{"workload": "evil", "message": "(a+)+$"}]}')
    resolver = WorkloadResolver(rules)
    # backtracking engines need 2^n steps here: 34 s at 29 characters with Python's re
    assert resolver.resolve(None, "/v1/chat/completions", None, {}, "a" * 60 + "b") == "default"
    assert resolver.resolve(None, "/v1/chat/completions", None, {}, "a" * 60) == "evil"


@pytest.mark.parametrize("regex", [r"(a)\1", r"(?<=a)b", r"(?=x)y"])
def test_rules_that_need_backtracking_are_refused_in_one_line(regex: str) -> None:
    text = orjson.dumps({"rules": [{"workload": "a", "message": regex}]})
    with pytest.raises(RulesError, match=r"bad regex for 'message'.*RE2") as e:
        parse_rules(text, "rules.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("rules.json: rule 1")


def test_only_the_head_of_a_message_is_classified() -> None:
    assert classify_text("ひらがな") == "ja"
    assert classify_text("x" * MAX_CLASSIFIED_CHARS + "ひらがな") == "other"
    rules = parse_rules(b'{"rules": [{"workload": "late", "message": "needle"}]}')
    resolver = WorkloadResolver(rules)
    assert resolver.resolve(None, "/", None, {}, "needle") == "late"
    assert resolver.resolve(None, "/", None, {}, "x" * MAX_CLASSIFIED_CHARS + "needle") == "default"


def test_unrelated_exposition_gives_an_empty_snapshot_and_html_an_error() -> None:
    unrelated = "".join(f'other_metric_total{{id="{i}"}} {i}\n' for i in range(50_000))
    snap = parse_snapshot("# TYPE other_metric_total counter\n" + unrelated, only=("vllm:",))
    assert not snap.values
    with pytest.raises(MetricsParseError):
        parse_snapshot("<html><body>not metrics</body></html>\n" * 10, only=("vllm:",))
    real = (DATA / "metrics-ngram-after-code.txt").read_text()
    assert parse_snapshot(real + unrelated, only=("vllm:",)).values == parse_snapshot(real, only=("vllm:",)).values


async def _serve(aiohttp_server: object, body: bytes) -> str:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)  # type: ignore[operator]
    return str(server.make_url("/metrics"))


async def _scrape(url: str, max_bytes: int) -> Scraper:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        scraper = Scraper(session, url, CounterLedger(), max_bytes=max_bytes)
        await scraper.start()
        await scraper.request()
        await scraper.close()
    return scraper


async def test_a_metrics_text_over_the_cap_is_not_read(aiohttp_server: object) -> None:
    huge = b"".join(b'unrelated_total{i="%d"} 1\n' % i for i in range(600_000))  # ~15 MB
    scraper = await _scrape(await _serve(aiohttp_server, huge), max_bytes=1024 * 1024)
    assert scraper.state.ok == 0 and scraper.state.errors >= 1 and "limit" in (scraper.state.last_error or "")
    # the engine's own text, under the cap, is read and parsed as before
    real = (DATA / "metrics-ngram-after-code.txt").read_bytes()
    scraper = await _scrape(await _serve(aiohttp_server, real), max_bytes=1024 * 1024)
    assert scraper.state.ok >= 1 and scraper.state.errors == 0 and scraper.state.engine == "vllm"
