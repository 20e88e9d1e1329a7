"""The command line as a user meets it: help, version, and bad input as one line and exit 2, never a traceback."""

from __future__ import annotations

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
    assert p.returncode == 0 and p.stdout.strip().startswith(f"specproxy {__version__} (")


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
        (("proxy", "--upstream", "http://x", "--workers", "-1"), "--workers must be between 0 and 256, got -1"),
        (("sim", "--spec-method", "magic"), "spec_method"),
        (("sim", "--engines", "0"), "engines"),
        (("run", "--target", "http://127.0.0.1:9", "--workload", "klingon_poetry"), "ja_chat"),
        # the summary reads the records back: a device (an endless read) or a folder is no record file
        (("run", "--target", "http://127.0.0.1:9", "--workload", "ja_chat", "--out", "/dev/full"), "regular file"),
        (("run", "--target", "http://127.0.0.1:9", "--workload", "ja_chat", "--out", "/tmp"), "regular file"),
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


def main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The entry point in this process: exit code, stdout, stderr."""
    from specproxy import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    out, err = capsys.readouterr()
    code = exited.value.code
    return code if isinstance(code, int) else 0, out, err


@pytest.mark.parametrize(
    ("kind", "args", "code", "line"),
    [
        ("option parsing", ("run",), 2, "specproxy run: error: Missing option '--target'."),
        (
            "a bad value found in the command body",
            ("replay", "x.jsonl", "--target", "http://127.0.0.1:9", "--capture", "x"),
            2,
            "specproxy replay: error: Invalid value: --capture must be one of none, request, full, got 'x'",
        ),
        (
            "a clean failure before the event loop",
            ("proxy", "--upstream", "http://127.0.0.1:9", "--rules", "/nonexistent/rules.json"),
            2,
            "specproxy: error: cannot read rules file /nonexistent/rules.json: No such file or directory",
        ),
        (
            "an analysis command (no event loop)",
            ("compare", "/nonexistent.jsonl"),
            2,
            "specproxy: error: /nonexistent.jsonl: no such record file or directory",
        ),
        (
            "a failure inside the event loop",
            ("run", "--workload", "ja_chat", "--target", "http://127.0.0.1:{closed}", "--out", "{tmp}/o.jsonl"),
            1,
            "specproxy: error: cannot reach target http://127.0.0.1:{closed}: Connection refused",
        ),
        ("a server that cannot listen", ("sim", "--listen", "127.0.0.1:{busy}"), 1, "specproxy: error: cannot listen"),
    ],
)
def test_one_boundary_reports_every_kind_of_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str, args: tuple[str, ...], code: int, line: str
) -> None:
    with socket.socket() as gone, socket.socket() as busy:
        gone.bind(("127.0.0.1", 0))
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        where = {"closed": gone.getsockname()[1], "busy": busy.getsockname()[1], "tmp": tmp_path}
        gone.close()  # nothing listens on its port any more
        got, _, err = main(capsys, *(a.format(**where) for a in args))
    assert got == code, (kind, err)
    errors = [x for x in err.splitlines() if ": error: " in x or "Traceback" in x]
    assert len(errors) == 1 and errors[0].startswith(line.format(**where)), (kind, err)


def test_nested_boundaries_report_once_at_the_outermost(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exited, error_boundary(), error_boundary():
        raise CommandError("the target went away", 1)
    assert exited.value.exit_code == 1
    assert capsys.readouterr().err == "specproxy: error: the target went away\n"
    with pytest.raises(typer.Exit) as exited, error_boundary():
        raise Interrupted
    assert exited.value.exit_code == 130
    assert capsys.readouterr().err == "specproxy: interrupted\n"
    with pytest.raises(typer.Exit) as exited, error_boundary():
        raise typer.Exit(3)  # a command's own exit code passes through untouched
    assert exited.value.exit_code == 3 and capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("report", "/nonexistent.jsonl"), "specproxy: error: /nonexistent.jsonl: no such record file or directory"),
        (("replay", "/nonexistent.jsonl", "--target", "http://127.0.0.1:9"), "specproxy: error: /nonexistent.jsonl:"),
        (("run", "--target", "http://127.0.0.1:9", "--workload", "nope"), "specproxy: error: unknown workload 'nope'"),
        (("sim", "--spec-method", "magic"), "specproxy: error: spec_method must be one of"),
        (("proxy", "--upstream", "http://127.0.0.1:9", "--rules", "/nonexistent/r.json"), "specproxy: error: cannot"),
    ],
)
def test_commands_report_failures_without_the_entry_point(args: tuple[str, ...], line: str) -> None:
    # Registered on a bare app and invoked by typer alone: each command's body runs inside the boundary itself.
    from typer.testing import CliRunner

    from specproxy.commands import analysis, proxy, run, sim

    app = typer.Typer()
    for module in (analysis, proxy, run, sim):
        module.register(app)
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(line), result.stderr
