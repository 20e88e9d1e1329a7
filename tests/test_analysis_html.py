"""The HTML report: self-contained (nothing fetched), every chart present, and drawn in a real headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specproxy.commands.analysis import register
from specproxy.core.record import Record
from tests.analysisutil import baseline_records, profile_records, write_run

CHARTS = ("tok_s", "acceptance", "per_position", "tokens_per_step", "ttft", "itl", "step", "timeline")
INSTALL_HINT = (
    "headless Chromium not found: install the Debian packages chromium and chromium-driver, "
    "or run as root with CI or SPECPROXY_INSTALL_CHROMIUM set to have this test install them"
)


def records() -> list[Record]:
    out: list[Record] = []
    for wl, profile in (("chat", (0.4, 0.33, 0.3)), ("code", (0.8, 0.75, 0.72))):
        out += baseline_records(requests=6, workload=wl, label="Base-FP16", gap_s=0.3)
        out += profile_records(profile, 3, requests=6, workload=wl, label="MTP-FP16-n3", gap_s=0.3)
    return out


def write_report(tmp_path: Path) -> Path:
    run = write_run(tmp_path / "runs.jsonl", records())
    out = tmp_path / "report.html"
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["report", str(run), "--format", "html", "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def test_html_is_self_contained_with_every_chart(tmp_path: Path) -> None:
    html = write_report(tmp_path).read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert re.findall(r'<svg data-chart="([a-z_]+)"', html) == list(CHARTS)
    for name in CHARTS:
        svg = html.split(f'<svg data-chart="{name}"', 1)[1].split("</svg>", 1)[0]
        assert 'class="mark"' in svg, name
        assert "no data" not in svg, name
    # Nothing to fetch: the only URL is the SVG namespace, which is a name, not a request.
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", html)
    assert "Speculative decoding" in html and "MTP-FP16-n3" in html


def test_empty_charts_say_no_data(tmp_path: Path) -> None:
    run = write_run(tmp_path / "base.jsonl", baseline_records(requests=2))
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["report", str(run), "-f", "html"])
    assert result.exit_code == 0
    per_position = result.stdout.split('<svg data-chart="per_position"', 1)[1].split("</svg>", 1)[0]
    assert "no data" in per_position and 'class="mark"' not in per_position


def find_chromium() -> str | None:
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    found = find_chromium()
    wanted = os.environ.get("CI") or os.environ.get("SPECPROXY_INSTALL_CHROMIUM")
    if found is None and wanted and shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], env=env, check=True, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"],
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
        found = find_chromium()
    if found is None:
        pytest.skip(INSTALL_HINT)
    return found


@pytest.mark.chromium
@pytest.mark.timeout(1200)  # the first run may install Chromium
def test_charts_are_drawn_in_headless_chromium(chromium: str, tmp_path: Path) -> None:
    page = write_report(tmp_path)
    profile = tmp_path / "chromium-profile"
    # HOME too: Chromium writes caches and key stores under it.
    env = {**os.environ, "HOME": str(tmp_path)}
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()], env=env, capture_output=True, text=True, timeout=90
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-measured="1"' in dom.stdout, "the page's measuring script did not run"
    drawn = dict(re.findall(r'<svg data-chart="([a-z_]+)"[^>]*?data-drawn="(\d+)"', dom.stdout))
    sizes = dict(re.findall(r'<svg data-chart="([a-z_]+)"[^>]*?data-size="(\d+x\d+)"', dom.stdout))
    assert set(drawn) == set(CHARTS)
    for name in CHARTS:
        assert int(drawn[name]) >= 1, f"chart {name} drew nothing"
        width, height = (int(v) for v in sizes[name].split("x"))
        assert width > 100 and height > 100, f"chart {name} has size {sizes[name]}"
    # Two configurations x two workloads: four bars, per-position curves with a point per position.
    assert int(drawn["tok_s"]) == 4
    assert int(drawn["per_position"]) == 2 * (1 + 3)

    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", "--window-size=1400,2000", page.as_uri()],
        env=env,
        capture_output=True,
        timeout=90,
    )
    assert shot.exists() and shot.stat().st_size > 10_000


def test_a_series_keeps_its_colour_in_every_chart(tmp_path: Path) -> None:
    """Base-FP16 has no speculation, so the acceptance chart leaves it out: MTP-FP16-n3 keeps the colour it has in
    the tok/s chart all the same, and every legend name has one colour across the page."""
    html = write_report(tmp_path).read_text()
    seen: dict[str, set[str]] = {}
    for name in CHARTS:
        svg = html.split(f'<svg data-chart="{name}"', 1)[1].split("</svg>", 1)[0]
        for fill, label in re.findall(r'<rect x="[^"]+" y="[^"]+" width="10" height="10" fill="([^"]+)"/>'
                                      r'\s*<text[^>]*>([^<]+)</text>', svg):  # fmt: skip
            seen.setdefault(label, set()).add(fill)
    assert "MTP-FP16-n3" in seen and "Base-FP16" in seen, seen
    assert all(len(fills) == 1 for fills in seen.values()), seen
    assert len({next(iter(f)) for f in seen.values()}) == len(seen), seen  # and no two series share one
