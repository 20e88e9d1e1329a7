"""``specproxy run`` / ``replay`` as a user runs them: bad input, an unreachable target, Ctrl-C, run then replay, the
options both take; and what the load generator shares with the rest (stop signals, no dependency on the proxy)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import typer
from simutil import running_sim

from specproxy import cli as cli_module
from specproxy.core.record import read_records
from specproxy.serving import stop_signals
from specproxy.sim import SimConfig

# The commands registered on the real app, as cli.py will do it.
LAUNCH = (
    "import sys; import specproxy.cli as cli; from specproxy.commands.run import register; "
    "register(cli.app); cli.main(sys.argv[1:])"
)
SIM = SimConfig(port=0, speed=50.0)


async def cli(*args: str, interrupt_when: Callable[[], bool] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LAUNCH, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    if interrupt_when is not None:
        for _ in range(600):
            if interrupt_when() or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens here once the socket is closed


async def test_unknown_workload_lists_the_known_ones() -> None:
    code, _, err = await cli("run", "--target", "http://127.0.0.1:9", "--workload", "ja_chat,nope")
    assert code == 2
    assert "unknown workload 'nope'" in err and "ja_chat" in err and "code_agent" in err
    assert "Traceback" not in err


async def test_unreadable_dataset_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "mine.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": \n')
    code, _, err = await cli("run", "--target", "http://127.0.0.1:9", "--workload", str(bad))
    assert code == 2 and f"{bad}:2" in err and "Traceback" not in err


async def test_target_down_fails_before_any_request(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "run.jsonl"
    code, _, err = await cli("run", "--target", url, "--workload", "ja_chat", "--out", str(out))
    assert code == 1
    assert f"specproxy: error: cannot reach target {url}: Connection refused" in err
    assert "Traceback" not in err
    assert not out.exists()  # nothing sent, nothing written
    code, _, err = await cli("run", "--target", url, "--workload", "ja_chat", "--wait-ready", "0.6", "--out", str(out))
    assert code == 1 and f"target {url} not ready after 0.6 s" in err


async def test_bad_options_are_one_line_usage_errors() -> None:
    for args, message in (
        (["--rate", "10", "--arrival", "bursty"], "poisson, gamma, constant"),
        (["--requests", "5", "--duration", "3"], "not both"),
        (["--shard", "3/2"], "i/N"),
        (["--concurrency", "1", "--workers", "2"], "less than the 2 processes"),
    ):
        code, _, err = await cli("run", "--target", "http://127.0.0.1:9", "--workload", "ja_chat", *args)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)


async def test_ctrl_c_stops_cleanly_keeps_records_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    async with running_sim(SIM, speed=5.0) as sim:
        code, stdout, err = await cli(
            "run", "--target", sim.url, "--workload", "code_agent", "--concurrency", "3", "--duration", "60",
            "--max-tokens", "400", "--out", str(out),
            interrupt_when=lambda: out.exists() and out.stat().st_size > 0,  # running, some requests done
        )  # fmt: skip
    assert code == 130, err
    assert "Traceback" not in err
    records = list(read_records(out))
    outcomes = {r["outcome"] for r in records}
    assert "client_cancelled" in outcomes  # the ones in flight
    assert "interrupted" in stdout and "code_agent" in stdout


async def test_run_then_replay_from_the_command_line(tmp_path: Path) -> None:
    run_out, replay_out = tmp_path / "run.jsonl", tmp_path / "replay.jsonl"
    async with running_sim(SIM) as sim:
        code, stdout, err = await cli(
            "run", "--target", sim.url, "--workload", "ja_chat,code_agent", "--rate", "40", "--requests", "12",
            "--max-tokens", "8", "--seed", "4", "--label", "MTP-n3", "--out", str(run_out), "--workers", "2",
            "--concurrency", "4", "--k", "3",
        )  # fmt: skip
        assert code == 0, err
        code, stdout2, err2 = await cli(
            "replay", str(run_out), "--target", sim.url, "--max-speed", "--concurrency-cap", "3",
            "--out", str(replay_out), "--label", "again",
        )  # fmt: skip
    assert code == 0, err2
    ran = list(read_records(run_out))
    assert len(ran) == 12 and {r["label"] for r in ran} == {"MTP-n3"}
    assert all(r["spec"]["source"] == "chunks" for r in ran)  # k given: acceptance from chunks in workers
    assert "ja_chat" in stdout and "send lag" in stdout
    replayed = list(read_records(replay_out))
    assert {r["replay_of"] for r in replayed} == {r["request_id"] for r in ran}
    assert "replay" in stdout2


def test_the_load_generator_imports_nothing_of_the_proxy() -> None:
    # Both speak to the recorder and share the wire headers (specproxy.core.headers); neither depends on the other.
    probe = (
        "import importlib, pkgutil, sys, specproxy.loadgen as lg\n"
        "for m in pkgutil.iter_modules(lg.__path__): importlib.import_module('specproxy.loadgen.' + m.name)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('specproxy.proxy'))))"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ""


async def test_stop_signals_reach_the_callback_then_the_defaults_come_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    got: list[int] = []
    try:
        with stop_signals(got.append):
            # installed (else the signals below would end the test process)
            assert all(signal.getsignal(sig) != before[sig] for sig in before)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):
                if len(got) == 2:
                    break
                await asyncio.sleep(0.01)
        assert sorted(got) == sorted([signal.SIGINT, signal.SIGTERM])
        # a second Ctrl-C during a slow shutdown ends the process again
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# declared once (specproxy.commands.options) for both commands
SHARED = (
    "--capture", "--metrics-url", "--k", "--wait-ready",
    "--api-key", "--connect-timeout", "--idle-timeout", "--progress",
)  # fmt: skip


def _options(name: str) -> dict[str, typer.core.TyperOption]:
    group = typer.main.get_command(cli_module.app)
    assert isinstance(group, typer.core.TyperGroup)
    return {p.opts[0]: p for p in group.commands[name].params if isinstance(p, typer.core.TyperOption)}


def test_run_and_replay_declare_their_shared_options_alike() -> None:
    run_opts, replay_opts, proxy_opts = _options("run"), _options("replay"), _options("proxy")

    def declared(o: typer.core.TyperOption) -> tuple[object, ...]:
        return (
            o.opts,
            o.secondary_opts,
            o.help,
            o.default,
            o.envvar,
            o.type_descriptor.annotation,
            o.required,
            o.is_flag,
        )

    for name in SHARED:
        assert declared(run_opts[name]) == declared(replay_opts[name]), name
    assert declared(proxy_opts["--k"]) == declared(run_opts["--k"])


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        cli_module.main(list(args))
    code = exited.value.code
    return code if isinstance(code, int) else 0, capsys.readouterr().err


def recording(tmp_path: Path) -> Path:
    rec = {
        "schema_version": 1,
        "request_id": "r1",
        "started_at": 1.0,
        "method": "POST",
        "path": "/v1/chat/completions",
        "workload": "ja_chat",
        "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    path = tmp_path / "recorded.jsonl"
    path.write_bytes(orjson.dumps(rec) + b"\n")
    return path


def both_commands(tmp_path: Path, url: str) -> tuple[list[str], list[str]]:
    out = ["--out", str(tmp_path / "out.jsonl")]
    return (
        ["run", "--target", url, "--workload", "ja_chat", *out],
        ["replay", str(recording(tmp_path)), "--target", url, *out],
    )


def test_run_and_replay_accept_every_shared_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    given = [
        "--capture", "full", "--metrics-url", "none", "--k", "2", "--wait-ready", "0.3", "--api-key", "secret",
        "--connect-timeout", "1", "--idle-timeout", "2", "--no-progress",
    ]  # fmt: skip
    for command in both_commands(tmp_path, url):
        code, err = invoke(capsys, *command, *given)
        assert code == 1, (command[0], err)
        assert f"specproxy: error: target {url} not ready after 0.3 s" in err, (command[0], err)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--capture", "x", "--capture must be one of none, request, full, got 'x'"),
        ("--metrics-url", "foo", "--metrics-url must be an http:// or https:// URL, got 'foo'"),
        ("--metrics-url", "http://[::1", "--metrics-url must be an http:// or https:// URL, got 'http://[::1'"),
        ("--metrics-url", "http://h:99999", "--metrics-url must be an http:// or https:// URL, got 'http://h:99999'"),
        ("--k", "0", "--k must be at least 1, got 0"),
        ("--wait-ready", "0", "--wait-ready must be positive, got 0"),
        ("--connect-timeout", "0", "--connect-timeout must be positive, got 0"),
        ("--idle-timeout", "-1", "--idle-timeout must be positive, got -1"),
    ],
)
def test_run_and_replay_check_a_shared_option_alike(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str, value: str, message: str
) -> None:
    for command in both_commands(tmp_path, "http://127.0.0.1:9"):
        code, err = invoke(capsys, *command, option, value)
        assert code == 2, (command[0], err)
        assert err == f"specproxy {command[0]}: error: Invalid value: {message}\n"
