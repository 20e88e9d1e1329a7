"""Report outputs escape client-controlled strings (model, path, workload, label) for their format: markdown cells
stay cells and carry no HTML, a terminal is sent no control sequence, a spreadsheet runs no formula, HTML stays
text."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from specproxy.analysis.tables import Table, render_csv, render_md, render_text
from specproxy.commands.analysis import register
from specproxy.core.record import Record, as_record
from tests.analysisutil import make_record, write_run

MODEL = '<img src=x onerror="alert(1)">'
WORKLOAD = "chat|x`y`[z](http://e.example)\\|w\r\n## injected"
LABEL = '=HYPERLINK("http://e.example","x")'
PATH = "/v1/\x1b[2J\x1b]0;owned\x07\u202eexe.txt"


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def hostile_run(tmp_path: Path) -> Path:
    recs: list[Record] = []
    for i in range(3):
        r = make_record(f"r{i}", accepted=[1, 2, 0], k=3, workload=WORKLOAD, label=LABEL, started_at=1e9 + i)
        recs.append(as_record({**r, "model": MODEL, "path": PATH}))
    return write_run(tmp_path / "hostile.jsonl", recs)


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line))


def _check_markdown(md: str) -> None:
    assert "<img" not in md
    assert "\n## injected" not in md and "\x1b" not in md and "\r" not in md  # one line per row, no ESC
    assert not re.search(r"(?<!\\)(?:\\\\)*\]\(", md)  # no link or image: its brackets are escaped
    for table in md.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        if rows:  # every row of a table has as many cell separators as its header
            assert {_unescaped_pipes(r) for r in rows} == {_unescaped_pipes(rows[0])}, table


def test_markdown_cells_are_escaped() -> None:
    t = Table(f"{WORKLOAD} title", ("model", "n"), ((MODEL, "1"), (WORKLOAD, "2"), ("a\\|b", "3")), ("l", "r"), (PATH,))
    md = render_md([t])
    _check_markdown(md)
    assert "&lt;img" in md
    assert "| a\\\\\\|b | 3 |" in md  # a backslash before a pipe cannot end the cell


def test_terminal_text_carries_no_control_sequence() -> None:
    t = Table(PATH, ("path", "n"), ((PATH, "1"), (WORKLOAD, "2")), ("l", "r"), (PATH,))
    text = render_text([t])
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text)
    assert "\\x1b[2J" in text and "\\u202e" in text
    assert "\n## injected" not in text


def test_csv_cells_do_not_run_as_formulas() -> None:
    text = render_csv(["label", "model", "value"], [[LABEL, "+1+1", -1.5], ["@SUM(A1)", "-x", 2]])
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[1] == ["'" + LABEL, "'+1+1", "-1.5"]  # numbers stay numbers, negative ones too
    assert rows[2] == ["'@SUM(A1)", "'-x", "2"]


def test_report_compare_and_advise_escape_every_format(tmp_path: Path) -> None:
    run = hostile_run(tmp_path)
    by = ["--by", "workload,label,model,path"]
    code, md, err = invoke("report", str(run), *by, "-f", "md")
    assert code == 0, err
    _check_markdown(md)
    assert "&lt;img" in md and "chat\\|x\\`y\\`\\[z\\]" in md
    code, text, err = invoke("report", str(run), *by)
    assert code == 0, err
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2J" in text
    code, table_csv, err = invoke("report", str(run), *by, "-f", "csv")
    assert code == 0, err
    (row,) = csv.DictReader(io.StringIO(table_csv))
    assert row["label"] == "'" + LABEL and row["model"] == MODEL
    # quoted by the csv module (click's runner reads \r\n as \n)
    assert row["workload"] == WORKLOAD.replace("\r\n", "\n")
    code, html, err = invoke("report", str(run), *by, "-f", "html")
    assert code == 0, err
    assert "<img" not in html and "&lt;img" in html
    for args in (("compare", str(run)), ("advise", str(run))):
        code, md, err = invoke(*args, "-f", "md")
        assert code == 0, err
        _check_markdown(md)
        code, text, err = invoke(*args)
        assert code == 0, err
        assert "\r\n## injected" not in text and "\n## injected" not in text
