"""The proxy's addons (specproxy/proxy/addons): a feature is one class that declares its options and hears the
bookkeeper's events, added to the command line and the bookkeeper by one entry in a registry.

A small addon defined here (it counts requests and records) goes through the real command line and a real
bookkeeper fed relay events, as a new feature would; the registry's own addons are checked for clashes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import aiohttp
import orjson
import pytest
import typer
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from typer.testing import CliRunner

from specproxy.commands import proxy as proxy_command
from specproxy.core.record import Record
from specproxy.proxy.addons import REGISTRY
from specproxy.proxy.addons.base import Addon, Context, Option, OptionError
from specproxy.proxy.bookkeeper import Bookkeeper
from specproxy.proxy.config import ProxyConfig
from specproxy.proxy.events import BEGIN, CHUNK, FINISH, HEAD, begin_payload, frame
from specproxy.recorder.config import RecorderConfig
from specproxy.recorder.trace import RequestMeta


class Tally(Addon):
    """What a new feature looks like: its options, their check, its events, its status section and metrics."""

    name = "tally"
    group = "Tally"
    options = (Option("--tally-label", str | None, None, "Count requests and records under this label."),)

    def __init__(self, label: str) -> None:
        self.label = label
        self.requests = 0
        self.records = 0

    @classmethod
    def configure(cls, values: dict[str, Any], ctx: Context) -> str | None:
        label: str | None = values["tally_label"]
        if label is not None and not label.strip():
            raise OptionError("--tally-label cannot be empty")
        return label

    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self | None:
        label = cls.settings(cfg)
        return cls(label) if isinstance(label, str) else None

    @classmethod
    def collector(cls, running: Self | None) -> Collector:
        return _TallyCollector(running)

    def request(self, meta: RequestMeta) -> bool:
        self.requests += 1
        return False

    def observe(self, rec: Record) -> None:
        self.records += 1

    def status(self) -> dict[str, Any]:
        return {"label": self.label, "requests": self.requests, "records": self.records}


class _TallyCollector(Collector):
    def __init__(self, tally: Tally | None) -> None:
        self.tally = tally

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("specproxy_tally_records", "Records the tally counted.")
        if self.tally is not None:
            family.add_metric([], self.tally.records)
        yield family


WITH_TALLY = (*REGISTRY, Tally)


def _app() -> typer.Typer:
    app = typer.Typer(rich_markup_mode=None)  # as specproxy's own
    proxy_command.register(app, addons=WITH_TALLY)

    @app.command("other")
    def other() -> None:  # a second command, so that "proxy" is a subcommand as in the real application
        """Nothing."""

    return app


def test_a_new_addon_gets_its_options_under_its_own_heading() -> None:
    result = CliRunner().invoke(_app(), ["proxy", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    headings = [line for line in result.output.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["Options:", *(f"{a.group}:" for a in WITH_TALLY if a.options)]
    tally = result.output.split("Tally:")[1]
    assert "--tally-label" in tally and "Count requests and records under this label." in tally


@pytest.mark.parametrize("where", ["command line", "config file"])
def test_a_new_addons_check_is_one_line_and_exit_2(where: str, tmp_path: Path) -> None:
    args = ["proxy", "--upstream", "http://127.0.0.1:9", "--record", "-"]
    if where == "command line":
        args += ["--tally-label", " "]
    else:
        (tmp_path / "c.yaml").write_text("tally_label: ' '\n")
        args += ["--config", str(tmp_path / "c.yaml")]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.endswith("error: Invalid value: --tally-label cannot be empty\n"), result.stderr


def test_the_registrys_addons_and_the_core_options_never_share_a_name() -> None:
    names = [a.name for a in REGISTRY]
    assert len(set(names)) == len(names)
    flags = [o.flag for a in REGISTRY for o in a.options]
    assert len(set(flags)) == len(flags)
    app = typer.Typer()
    proxy_command.register(app)
    command = typer.main.get_command(app)
    core = [opt for p in command.params if getattr(p, "rich_help_panel", None) is None for opt in p.opts]
    assert not set(core) & set(flags)
    assert all(a.group and a.group != "Options" for a in REGISTRY if a.options)


async def test_the_bookkeeper_runs_an_addon_on_its_events(tmp_path: Path) -> None:
    """Relay events in, as a relay sends them: the addon hears the inference request and its record, and its
    section and family are in the proxy's own status and metrics."""
    cfg = Tally.with_settings(
        ProxyConfig(upstream="http://127.0.0.1:9", recorder=RecorderConfig(record_path=str(tmp_path / "r.jsonl"))),
        "here",
    )
    async with aiohttp.ClientSession() as session:
        keeper = Bookkeeper.create(cfg, session, addons=WITH_TALLY)
        await keeper.start()
        try:
            conn = keeper.connect(lambda _: None)
            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            doc = {"rid": "req1", "size": len(body), "p": "/v1/chat/completions", "m": "POST", "wh": None, "h": {},
                   "at": time.time()}  # fmt: skip
            reply = orjson.dumps({"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 2}})  # fmt: skip
            t = time.perf_counter_ns()
            conn.received(frame(BEGIN, 1, t, begin_payload(doc, body)))
            conn.received(frame(HEAD, 1, t + 1000, orjson.dumps([200, "application/json", None])))
            conn.received(frame(CHUNK, 1, t + 2000, reply))
            conn.received(frame(FINISH, 1, t + 3000, orjson.dumps(["ok", None, 0, 0, 0, False, None])))
            tally = next(a for a in keeper.addons if isinstance(a, Tally))
            deadline = asyncio.get_running_loop().time() + 30
            while tally.records < 1:
                assert asyncio.get_running_loop().time() < deadline, "the record never reached the addon"
                await asyncio.sleep(0.01)
            assert keeper.status()["tally"] == {"label": "here", "requests": 1, "records": 1}
            _, _, metrics = keeper.answer("/specproxy/metrics")
            assert b"specproxy_tally_records_total 1.0" in metrics
        finally:
            await keeper.close()


async def test_an_addon_that_is_off_has_no_section_but_keeps_its_metric_families(tmp_path: Path) -> None:
    cfg = ProxyConfig(upstream="http://127.0.0.1:9", recorder=RecorderConfig(record_path=str(tmp_path / "r.jsonl")))
    async with aiohttp.ClientSession() as session:
        keeper = Bookkeeper.create(cfg, session, addons=WITH_TALLY)
        assert not any(isinstance(a, Tally) for a in keeper.addons)
        assert "tally" not in keeper.status()
        _, _, metrics = keeper.answer("/specproxy/metrics")
        assert b"# TYPE specproxy_tally_records_total counter" in metrics
        await keeper.close()
