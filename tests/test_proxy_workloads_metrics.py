"""Workload resolution (header, rules, default, cap), the proxy's own metrics and status, and the zero-acceptance
alarm (a speculative head that drafts but never gets accepted, as a bad quantization did in the wild)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specproxy.core.workload_rules import (
    MAX_WORKLOADS,
    RulesError,
    WorkloadResolver,
    classify_text,
    parse_rules,
)
from specproxy.sim.config import DEFAULT_PROFILES
from tests.proxyutil import running_proxy
from tests.simutil import CODE_PROMPT, JA_PROMPT, chat_body, running_sim

RULES = b"""{"rules": [
  {"workload": "ide", "header": {"name": "X-Client", "value": "^ide-"}},
  {"workload": "big_model", "model": "^qwen.*27b", "path": "^/v1/chat"},
  {"workload": "refactor", "message": "(?i)refactor"},
  {"workload": "ja_chat", "classify": "ja"},
  {"workload": "code_agent", "classify": "code"}
]}"""


def test_classifier() -> None:
    assert classify_text("こんにちは、元気？") == "ja"
    assert classify_text(CODE_PROMPT) == "code"
    assert classify_text("What is the capital of France?") == "other"


def test_rules_first_match_and_header_wins() -> None:
    r = WorkloadResolver(parse_rules(RULES))
    assert r.needs_message
    assert r.resolve(None, "/v1/chat/completions", "m", {"x-client": "ide-vscode"}, "refactor") == "ide"
    assert r.resolve(None, "/v1/chat/completions", "qwen3.5-27b", {}, "hi") == "big_model"
    assert r.resolve(None, "/v1/completions", "qwen3.5-27b", {}, "hi") == "default"
    assert r.resolve(None, "/v1/chat/completions", "m", {}, "Please REFACTOR this") == "refactor"
    assert r.resolve(None, "/v1/chat/completions", "m", {}, JA_PROMPT) == "ja_chat"
    assert r.resolve(None, "/v1/chat/completions", "m", {}, CODE_PROMPT) == "code_agent"
    assert r.resolve("mine", "/v1/chat/completions", "m", {}, CODE_PROMPT) == "mine"  # the header wins
    assert r.resolve("bad name!", "/x", None, {}, None) == "other"


def test_workload_cap() -> None:
    r = WorkloadResolver()
    names = {r.resolve(f"w{i}", "/", None, {}, None) for i in range(MAX_WORKLOADS + 20)}
    assert len(names) == MAX_WORKLOADS + 1 and "other" in names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"{", "not valid JSON"),
        (b'{"rules": [{"path": "x"}]}', "'workload'"),
        (b'{"rules": [{"workload": "a", "path": "("}]}', "bad regex"),
        (b'{"rules": [{"workload": "a", "colour": "x"}]}', "unknown key"),
        (b'{"rules": [{"workload": "a", "classify": "klingon"}]}', "classify"),
    ],
)
def test_bad_rules_are_clear(text: bytes, message: str) -> None:
    with pytest.raises(RulesError, match=message):
        parse_rules(text, "rules.json")


async def test_proxy_rules_metrics_and_status(tmp_path: Path) -> None:
    async with (
        running_sim(speed=50.0) as sim,
        running_proxy(sim.url, tmp_path, rules=parse_rules(RULES)) as px,
        aiohttp.ClientSession() as s,
    ):
        for prompt in (JA_PROMPT, CODE_PROMPT, JA_PROMPT):
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(prompt, max_tokens=32)) as r:
                await r.read()
        async with s.post(px.url + "/v1/chat/completions", json=chat_body(), headers={"X-Sim-Fault": "status=500"}):
            pass
        await px.flush()
        assert sorted(r["workload"] for r in px.records()) == ["code_agent", "code_agent", "ja_chat", "ja_chat"]
        async with s.get(px.url + "/specproxy/metrics") as r:
            text = await r.text()
        samples = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(text)
            for x in fam.samples
        }
        assert samples[("specproxy_requests_total", (("outcome", "ok"), ("workload", "ja_chat")))] == 2
        assert samples[("specproxy_requests_total", (("outcome", "upstream_error"), ("workload", "code_agent")))] == 1
        assert samples[("specproxy_generated_tokens_total", (("workload", "ja_chat"),))] > 0
        assert samples[("specproxy_spec_draft_tokens_total", (("workload", "code_agent"),))] > 0
        assert samples[("specproxy_ttft_seconds_count", (("workload", "ja_chat"),))] == 2
        assert (
            samples[("specproxy_inter_token_latency_seconds_count", (("workload", "ja_chat"),))]
            > samples[("specproxy_inter_step_latency_seconds_count", (("workload", "ja_chat"),))]
        )  # speculation: more tokens than steps
        assert samples[("specproxy_records_written_total", ())] == 4
        assert samples[("specproxy_in_flight_requests", ())] == 0
        async with s.get(px.url + "/specproxy/status") as r:
            status = await r.json()
        assert status["workloads"]["code_agent"]["acceptance_rate"] > status["workloads"]["ja_chat"]["acceptance_rate"]
        assert status["engine"]["kind"] == "vllm" and status["engine"]["k_learned"] == 3


async def test_zero_acceptance_is_flagged(tmp_path: Path) -> None:
    broken = {name: replace(p, accept=(0.0,)) for name, p in DEFAULT_PROFILES.items()}
    async with (
        running_sim(speed=50.0, profiles=broken) as sim,
        running_proxy(sim.url, tmp_path) as px,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(3):
            async with s.post(px.url + "/v1/chat/completions", json=chat_body(max_tokens=64)) as r:
                await r.read()
        await px.flush()
        for _ in range(50):
            async with s.get(px.url + "/specproxy/status") as r:
                status = await r.json()
            if status["workloads"].get("default", {}).get("zero_acceptance"):
                break
            await asyncio.sleep(0.02)
        assert status["workloads"]["default"]["zero_acceptance"] is True
        assert status["workloads"]["default"]["draft_tokens"] >= 100
        async with s.get(px.url + "/specproxy/metrics") as r:
            assert 'specproxy_spec_zero_acceptance{workload="default"} 1.0' in await r.text()
        assert all("spec_zero_acceptance" in r["flags"] for r in px.records())
