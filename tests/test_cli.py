"""The command line as a user meets it: help, version, and bad input as one line and exit 2, never a traceback."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import typer

from specproxy import __version__
from specproxy.commands.common import CommandError, Interrupted, error_boundary

SCRATCH = tempfile.mkdtemp(prefix="specproxy-cli-")  # commands run here, so nothing lands in the checkout


def run(*args: str, cwd: str | Path = SCRATCH) -> subprocess.CompletedProcess[str]:
    """The real command line, in ``cwd`` (outside the checkout by default), with no standard input."""
    return subprocess.run(
        [sys.executable, "-m", "specproxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def test_help_lists_every_command() -> None:
    p = run("--help")
    assert p.returncode == 0
    for cmd in ("demo", "sim", "proxy", "run", "replay", "report", "compare", "advise", "roofline"):
        assert f"  {cmd} " in p.stdout, cmd


def test_version() -> None:
    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"specproxy {__version__}"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("frobnicate",), "No such command"),
        (("proxy",), "--upstream"),
        (("proxy", "--upstream", "localhost:8000"), "http://"),
        (("proxy", "--upstream", "http://x", "--capture", "everything"), "--capture"),
        (("proxy", "--upstream", "http://x", "--listen", "1.2.3.4:70000"), "port"),
        (("proxy", "--upstream", "http://x", "--rules", "/nonexistent/rules.json"), "rules"),
        (("proxy", "--upstream", "http://x", "--max-body", "lots"), "size"),
        (("sim", "--spec-method", "magic"), "spec_method"),
        (("sim", "--engines", "0"), "engines"),
        (("run", "--target", "http://127.0.0.1:9", "--workload", "klingon_poetry"), "ja_chat"),
        (("report", "/nonexistent.jsonl"), "/nonexistent.jsonl"),
        (("compare",), "Missing"),
        (("roofline", "--params", "big", "--bytes-per-param", "1", "--bandwidth", "1TB/s"), "params"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], needle: str) -> None:
    p = run(*args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert needle in p.stderr


def test_bad_rules_file_content(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text('{"rules": [{"workload": "x", "message": "(unclosed"}]}')
    p = run("proxy", "--upstream", "http://127.0.0.1:9", "--rules", str(rules), "--record", "-")
    assert p.returncode == 2 and "bad regex" in p.stderr and p.stderr.count("\n") == 1


def test_target_down_is_a_clear_error_before_the_run(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = run("run", "--target", f"http://127.0.0.1:{port}", "--workload", "ja_chat", "--out", str(tmp_path / "o.jsonl"))
    assert p.returncode == 1
    assert "cannot reach target" in p.stderr and "Traceback" not in p.stderr


