"""``specproxy matrix`` over the simulator: the table, the same requests for every configuration, failed
configurations reported with their log while the others are measured, reruns that skip what is measured, and no
process left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from specproxy.cli import main
from specproxy.core.record import Record, read_records
from specproxy.exitcodes import EXIT_FAILURE
from specproxy.matrix.load import example_names, example_text, load_matrix, parse_text
from specproxy.matrix.progress import Tracker
from specproxy.matrix.server import group_members
from specproxy.matrix.session import run_matrix
from specproxy.matrix.spec import MatrixError
from tests.simutil import FAST, running_sim

HERE = Path(__file__).parent
SIM = "{python} -m specproxy sim --listen 127.0.0.1:{port} --speed 20 --seed 1"
FEW = {  # two prompts: fewer than the requests per workload, which must not change the count
    "format_version": 1,
    "name": "few",
    "description": "two short prompts",
    "max_tokens": 24,
    "items": [
        {"id": "a", "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]},
        {"id": "b", "messages": [{"role": "user", "content": "こんにちは。今日はいい天気ですね。"}]},
    ],
}


# Long enough for the stubborn server to start its child, write their PIDs and print its line on a busy host (Python
# itself takes a while to start there), which the test then checks; short enough not to stretch the test much.
STUBBORN_TIMEOUT_S = 5


def _matrix(tmp: Path) -> Path:
    (tmp / "few.json").write_text(orjson.dumps(FEW).decode())
    stubborn = f"{sys.executable} {HERE / 'matrix_stubborn.py'} {{results}}/stubborn.pids"
    text = f"""
workloads: [code_agent, few.json]
requests: 3
warmup: 1
repeats: 2
max_tokens: 24
seed: 5
start_timeout: 30
stop_timeout: 1
configurations:
  - {{label: Base, command: "{SIM} --spec-method none"}}
  - label: exits
    command: ["{{python}}", "-c", "import sys; print('cannot load the weights'); sys.exit(3)"]
  - {{label: MTP-n3, command: "{SIM} --spec-method mtp -k 3"}}
  - {{label: stubborn, command: "{stubborn}", start_timeout: {STUBBORN_TIMEOUT_S}}}
"""
    path = tmp / "m.yaml"
    path.write_text(text)
    return path


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _sent(records: list[Record]) -> list[tuple[Any, ...]]:
    """Each measured request as sent, in sending order, the model name aside."""
    ordered = sorted(records, key=lambda r: (r["repeat"], r["started_at"] or 0.0))
    out = []
    for r in ordered:
        body = dict(r["request"])
        body.pop("model")
        out.append((r["repeat"], r["workload"], orjson.dumps(body, option=orjson.OPT_SORT_KEYS)))
    return out


@pytest.mark.slow
async def test_matrix_measures_each_configuration_alike_and_survives_failures(tmp_path: Path) -> None:
    path = _matrix(tmp_path)
    spec = load_matrix(path)
    out = await run_matrix(spec, path, handle_signals=False)
    folder = tmp_path / "m-results"
    assert out.folder == folder and out.exit_code == EXIT_FAILURE  # two configurations failed
    by = {r.label: r for r in out.results}
    assert [by[x].status for x in ("Base", "exits", "MTP-n3", "stubborn")] == [
        "measured",
        "failed",
        "measured",
        "failed",
    ]

    # The table: both workloads, both measured configurations, the baseline chosen, the advice.
    rows = {(r.workload, r.label): r for g in out.groups for r in g.comparison.rows}
    assert set(rows) == {(w, c) for w in ("code_agent", "few") for c in ("Base", "MTP-n3")}
    assert rows[("code_agent", "Base")].is_baseline and rows[("code_agent", "MTP-n3")].acceptance_rate
    assert "code_agent" in out.text and "MTP-n3" in out.text and "recommended k" in out.text

    # Failures: one line each, with the log's last lines, in the summary and the manifest.
    assert "not in this table (not measured): exits, stubborn; speedups are over Base" in out.text
    assert "exits: failed: exited with code 3 before it was healthy" in out.text
    assert "  | cannot load the weights" in out.text
    assert f"stubborn: failed: not healthy after {STUBBORN_TIMEOUT_S} s" in out.text
    assert "  | loading the model (forever)" in out.text
    manifest = orjson.loads((folder / "manifest.json").read_bytes())["configurations"]
    assert manifest["Base"]["status"] == "measured" and manifest["exits"]["status"] == "failed"
    assert "cannot load the weights" in manifest["exits"]["log_tail"]

    # The same requests in the same order: same bodies, 3 per workload per repeat whatever the file holds.
    base = list(read_records(folder / "Base.jsonl"))
    mtp = list(read_records(folder / "MTP-n3.jsonl"))
    assert _sent(base) == _sent(mtp)
    for recs in (base, mtp):
        assert all(r["outcome"] == "ok" for r in recs)
        counts = {(rep, w): sum(1 for r in recs if (r["repeat"], r["workload"]) == (rep, w))
                  for rep in (0, 1) for w in ("code_agent", "few")}  # fmt: skip
        assert set(counts.values()) == {3}
    few = [r["request"]["messages"][-1]["content"] for r in base if r["workload"] == "few" and r["repeat"] == 0]
    assert len(set(few)) == 2  # both prompts, one of them twice

    # No process left: the servers' process groups are empty, the child that ignored SIGTERM included.
    for r in out.results:
        if r.pid is not None:
            assert group_members(r.pid) == [], r.label
    pids = [int(p) for p in (folder / "stubborn.pids").read_text().split()]
    assert len(pids) == 2 and not any(_alive(p) for p in pids)

    # A rerun measures only what is not measured: the two failures again, never the measured two.
    mtimes = {x: (folder / f"{x}.jsonl").stat().st_mtime_ns for x in ("Base", "MTP-n3")}
    again = await run_matrix(spec, path, handle_signals=False)
    assert {r.label: r.status for r in again.results} == {
        "Base": "skipped", "exits": "failed", "MTP-n3": "skipped", "stubborn": "failed"
    }  # fmt: skip
    assert {x: (folder / f"{x}.jsonl").stat().st_mtime_ns for x in ("Base", "MTP-n3")} == mtimes
    assert "2 from earlier runs" in again.text and "MTP-n3" in again.text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workloads: [ja_chat]\nconfigurations: [{label: A}]\n", "configurations[0] (A): needs a command"),
        ("workloads: [ja_chat]\nconfigurations: [{label: 'a b', url: 'http://x'}]\n", "configurations[0].label"),
        ("workloads: []\nconfigurations: [{label: A, url: 'http://x'}]\n", "workloads: must be a list"),
        ("workloads: [ja_chat]\nrepeats: 0\nconfigurations: [{label: A, url: 'http://x'}]\n", "repeats: must be"),
        ("workloads: [ja_chat]\nconfigurations: [{label: A, url: 'ftp://x'}]\n", "url: must start with http"),
        ("workloads: [ja_chat]\nconfigurations: [{label: A, url: 'http://x', colour: 1}]\n", "unknown key 'colour'"),
        (
            "workloads: [ja_chat]\nconfigurations:\n - {label: A, url: 'http://x'}\n - {label: a, url: 'http://y'}\n",
            "already the label",
        ),
        ("workloads: [ja_chat]\nconfigurations: [{label: A, command: 'x \"unclosed'}]\n", "cannot split"),
        ("workloads: [ja_chat\n", "not valid YAML or JSON at line"),
        ("[1, 2]", "must be a mapping"),
    ],
)
def test_bad_matrix_files_name_the_place(text: str, message: str) -> None:
    with pytest.raises(MatrixError, match=None) as e:
        parse_text(text, "m.yaml")
    assert message in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("m.yaml: ")


def test_examples_parse_and_json_is_accepted() -> None:
    assert {"sim", "cpu-smollm2", "gpu-qwen3.5-2b"} <= set(example_names())
    gpu = parse_text(example_text("gpu-qwen3.5-2b"), "gpu")
    assert len(gpu.configurations) == 12 and {g for c in gpu.configurations for g in c.groups} == {"FP16", "FP8", "AWQ"}
    assert any('"method": "mtp"' in a for a in gpu.configurations[1].command or ())
    cpu = parse_text(example_text("cpu-smollm2"), "cpu")
    assert [c.label for c in cpu.configurations] == ["Base", "ngram-n1", "ngram-n3", "ngram-n5", "draft-n3"]
    doc = {"workloads": ["ja_chat"], "configurations": [{"label": "A", "url": "http://127.0.0.1:8000"}]}
    assert parse_text(orjson.dumps(doc).decode(), "m.json").configurations[0].url == "http://127.0.0.1:8000"


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line in this process (the quick checks); ``test_bad_file_from_the_real_command_line`` runs it."""
    with pytest.raises(SystemExit) as e:
        main(["matrix", *args])
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def test_command_line_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECPROXY_VLLM_PYTHON", raising=False)
    code, example, _ = _main(capsys, "--example", "cpu-smollm2")
    assert code == 0 and "ngram" in example
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text(example)
    code, _, err = _main(capsys, str(cpu), "--no-progress")
    assert code == 2 and err.count("\n") == 1 and "${SPECPROXY_VLLM_PYTHON} is not set" in err
    assert not (tmp_path / "cpu-results" / "Base.log").exists()
    code, _, err = _main(capsys, "--example", "nope")
    assert code == 2 and "examples: " in err and err.count("\n") == 1
    code, _, err = _main(capsys, str(tmp_path / "missing.yaml"))
    assert code == 2 and "no such file" in err
    code, _, err = _main(capsys)
    assert code == 2 and "missing the matrix file" in err


def test_bad_file_from_the_real_command_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads: [ja_chat]\nconfigurations: [{label: A}]\n")
    p = subprocess.run(
        [sys.executable, "-m", "specproxy", "matrix", str(bad)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "needs a command" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_progress_estimates_time_left_from_starts_and_requests_seen() -> None:
    now = [0.0]
    t = Tracker(configs=3, requests_per_config=10, clock=lambda: now[0])
    t.next_config("Base")
    t.phase("starting")
    assert t.seconds_left() is None and "estimating time left" in t.line()
    now[0] = 20.0
    t.started()  # 20 s to become healthy
    t.phase("ja_chat repeat 1/2")
    now[0] = 25.0
    t.add_done(2)
    t.measured_done(3)  # 5 requests in 5 s
    # 5 requests left here (5 s), then two configurations of 20 s start + 10 requests (10 s) each
    assert t.seconds_left() == pytest.approx(5 + 2 * 30)
    assert t.line() == "[1/3] Base: ja_chat repeat 1/2, 5/10 requests; about 65 s left"
    now[0] = 30.0
    t.measured_done(8)
    t.next_config("MTP-n1")  # 10 requests in 10 s of sending so far
    now[0] = 35.0  # 5 s into a start that took 20 s last time
    assert t.seconds_left() == pytest.approx(15 + 10 + 30)


async def test_a_running_server_is_measured_and_left_running(tmp_path: Path) -> None:
    async with running_sim(FAST, spec_method="mtp", num_speculative_tokens=2) as sim:
        path = tmp_path / "m.json"
        doc = {
            "workloads": ["ja_chat"], "requests": 2, "repeats": 1, "warmup": 0, "max_tokens": 16,
            "configurations": [{"label": "remote", "url": sim.url, "health": sim.url + "/v1/models"}],
        }  # fmt: skip
        path.write_text(orjson.dumps(doc).decode())
        out = await run_matrix(load_matrix(path), path, handle_signals=False)
        assert out.exit_code == 0 and [r.status for r in out.results] == ["measured"] and out.results[0].pid is None
        async with aiohttp.ClientSession() as s, s.get(sim.url + "/health") as resp:
            assert resp.status == 200  # not ours to stop
    recs = list(read_records(tmp_path / "m-results" / "remote.jsonl"))
    assert len(recs) == 2 and all(r["spec"] and r["spec"]["draft_tokens"] for r in recs)


@pytest.mark.slow
def test_ctrl_c_stops_the_server_being_measured(tmp_path: Path) -> None:
    sim = "{python} -m specproxy sim --listen 127.0.0.1:{port} --spec-method none"
    doc = {
        "workloads": ["code_agent"], "requests": 500, "repeats": 1, "warmup": 0,
        "configurations": [{"label": "Base", "command": ["sh", "-c", f"echo $$ > {{results}}/pid; exec {sim}"]}],
    }  # fmt: skip
    path = tmp_path / "m.json"
    path.write_text(orjson.dumps(doc).decode())
    p = subprocess.Popen(
        [sys.executable, "-m", "specproxy", "matrix", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert p.stderr is not None
        for line in p.stderr:  # one progress line per phase: wait until requests are being sent
            if "repeat 1/1" in line:
                break
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130
    assert "interrupted" in out and "Base: failed: interrupted" in out
    pid = int((tmp_path / "m-results" / "pid").read_text())
    assert group_members(pid) == [] and not _alive(pid)


async def test_one_at_a_time_each_requests_counters_are_its_own(tmp_path: Path) -> None:
    """At concurrency 1 a request that lasts about one scrape interval (GPU speeds) would share nearly every
    interval with the one before or after it, and with ngram (drafts on some steps only) its hidden drafts would be
    modelled. The matrix waits for each request's closing scrape before the next: every record's counters are exact
    and equal the engine's own count for that request."""
    async with (
        running_sim(spec_method="ngram", speed=15.0, seed=3) as sim,
        aiohttp.ClientSession() as s,
    ):
        path = tmp_path / "m.json"
        doc = {
            "workloads": ["code_agent", "ja_chat"], "requests": 4, "repeats": 1, "warmup": 1, "max_tokens": 96,
            "configurations": [{"label": "ngram", "url": sim.url, "health": sim.url + "/v1/models"}],
        }  # fmt: skip
        path.write_text(orjson.dumps(doc).decode())
        out = await run_matrix(load_matrix(path), path, handle_signals=False)
        assert out.exit_code == 0
        recs = list(read_records(tmp_path / "m-results" / "ngram.jsonl"))
        assert len(recs) == 8
        for rec in recs:
            counters = rec["spec"]["estimates"]["counters"]
            assert counters is not None and counters["exact"], rec["flags"]
            async with s.get(f"{sim.url}/sim/requests/{rec['upstream_id']}") as resp:
                truth = await resp.json()
            assert counters["accepted"] == truth["counted_accepted"]
            assert counters["draft_tokens"] == truth["draft_tokens"]
            assert "counters_unsettled" not in rec["flags"]
