"""``specproxy proxy --config FILE``: any option from a YAML file, the command line winning; a bad file is one line
naming the file and the option, exit 2, and never shows a value (a config file is where secrets may be kept). And
``--help``: the core options first, then each addon's under its heading. Through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specproxy.proxy.addons import REGISTRY
from tests.proxyutil import proxy_process
from tests.simutil import running_sim

SECRET = "s3cret-value"


def _proxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", "proxy", *args], capture_output=True, text=True, timeout=60
    )


def test_help_shows_the_core_options_first_then_each_addons_group() -> None:
    p = _proxy("--help")
    assert p.returncode == 0, p.stderr
    headings = [line for line in p.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["Options:", *(f"{a.group}:" for a in REGISTRY if a.options)]
    core, _, addons = p.stdout.partition(f"\n{REGISTRY[0].group}:")
    assert "--upstream" in core and "--config" in core and "--shadow" not in core and "--otlp-endpoint" not in core
    assert "--shadow-share" in addons.partition("Shadow candidates:")[2]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "cannot read it"),
        ("- upstream\n- listen\n", "expected a mapping of option names to values, got a list"),
        ("upstream: http://127.0.0.1:9\nnot-an-option: 1\n", "not-an-option: no such option"),
        (f"shadow-share: {SECRET}\n", "shadow-share: expected a number"),
        (f"workers: '{SECRET}'\n", "workers: expected a whole number"),
        (f"fail-closed: {SECRET}\n", "fail-closed: expected true or false"),
        (f"label: [{SECRET}]\n", "label: expected one value"),
        (f"otlp-header: {{a: {SECRET}}}\n", "otlp-header: expected one value"),
        (f"label: [{SECRET}\n", "not YAML at line 2"),
        ("config: other.yaml\n", "config: no such option"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_file_and_the_option(
    tmp_path: Path, text: str | None, says: str
) -> None:
    path = tmp_path / "proxy.yaml"
    if text is not None:
        path.write_text(text)
    p = _proxy("--config", str(path), "--record", "-")
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"specproxy proxy: error: --config {path}: "), p.stderr
    assert says in p.stderr and SECRET not in p.stderr, p.stderr


def test_a_config_files_values_reach_the_options_checks(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("upstream: http://127.0.0.1:9\nshadow-workload: code\n")  # one value for a repeatable option
    p = _proxy("--config", str(path), "--record", "-")
    assert p.returncode == 2 and "--shadow-workload and --shadow-credentials-file need --shadow" in p.stderr, p.stderr


async def _status(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/specproxy/status") as r:
        assert r.status == 200
        doc: dict[str, Any] = json.loads(await r.read())
        return doc


async def test_options_come_from_the_file_and_the_command_line_wins(tmp_path: Path) -> None:
    """Core and addon options, with dashes or underscores, a list or one value for a repeatable option; an OTLP
    header that holds a secret is no warning there (no other user can read the file, unlike the command line)."""
    async with running_sim() as sim, running_sim() as cand:
        path = tmp_path / "proxy.yaml"
        path.write_text(
            f"shadow: [cand={cand.url}]\n"
            "shadow_share: 0.5\n"
            "advise-every: 0\n"
            "slo: ttft=2s\n"
            "workers: 0\n"
            "otlp-endpoint: http://127.0.0.1:9\n"
            f"otlp-header: [api-key={SECRET}]\n"
        )
        path.chmod(0o600)
        async with proxy_process(sim.url, tmp_path / "r.jsonl", "--config", str(path), "--shadow-share", "1") as (
            url,
            proc,
        ):
            st = await _status(url)
            assert st["shadow"]["share"] == 1.0 and list(st["shadow"]["candidates"]) == ["cand"]
            assert "advice" not in st
            assert st["slo"]["targets"] and "otlp" in st
            assert st["bookkeeping"]["relays"] == 1 and st["bookkeeping"]["pid"] == proc.pid  # type: ignore[attr-defined]
