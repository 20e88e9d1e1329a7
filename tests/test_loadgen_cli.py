"""``specproxy run`` / ``replay`` as a user runs them: bad input, an unreachable target, Ctrl-C, run then replay."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from simutil import running_sim

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
