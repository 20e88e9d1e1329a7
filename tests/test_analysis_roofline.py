"""`specproxy roofline`: the bandwidth ceiling of decode, checked against the published examples."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from specproxy.analysis.roofline.model import parse_bytes, parse_count, roofline
from specproxy.commands import analysis
from specproxy.commands import roofline as roofline_cmd
from tests.analysisutil import make_record, write_run


def invoke(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    analysis.register(app)  # two commands: typer then keeps the command names
    roofline_cmd.register(app)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_published_examples() -> None:
    # Dense 27B at 0.56 byte/param on 1.7 TB/s: the weights alone allow 112 tok/s.
    dense = roofline(27e9, 0.56, 1.7e12)
    assert dense.ceiling_tok_s == pytest.approx(112.4, abs=0.1)
    # The ~85 tok/s ceiling quoted for it means ~20 GB read per token: 0.56 byte/param plus ~4.9 GB of other reads.
    quoted = roofline(27e9, 0.56, 1.7e12, extra_bytes_per_token=20e9 - 27e9 * 0.56)
    assert quoted.ceiling_tok_s == pytest.approx(85.0)
    assert quoted.fraction(71) == pytest.approx(0.835, abs=0.001)
    # MoE, 3B active at 1 byte/param on 1.275 TB/s: 425 tok/s; 177 measured is 42%.
    moe = roofline(35e9, 1.0, 1.275e12, active_params=3e9)
    assert moe.ceiling_tok_s == pytest.approx(425.0)
    assert round(moe.fraction(177) * 100) == 42


@pytest.mark.parametrize(
    ("text", "value"), [("27B", 27e9), ("3e9", 3e9), ("350M", 350e6), ("1.5T", 1.5e12), ("27000000000", 27e9)]
)
def test_parse_count(text: str, value: float) -> None:
    assert parse_count(text) == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.7TB/s", 1.7e12), ("1700GB/s", 1.7e12), ("1.7e12", 1.7e12), ("900GiB/s", 900 * 2**30), ("1.7 TB/s", 1.7e12)],
)
def test_parse_bandwidth(text: str, value: float) -> None:
    assert parse_bytes(text, rate=True) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "27X", "-3B", "0", ""])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_count(text)
    with pytest.raises(ValueError):
        parse_bytes(text, rate=True)


def test_roofline_validation() -> None:
    with pytest.raises(ValueError, match="active params cannot exceed"):
        roofline(3e9, 1.0, 1e12, active_params=27e9)
    with pytest.raises(ValueError, match="bytes per param"):
        roofline(3e9, 0.0, 1e12)


def test_roofline_cli(tmp_path: Path) -> None:
    args = ["roofline", "--params", "35B", "--active-params", "3B", "--bytes-per-param", "1", "--bandwidth"]
    code, out, err = invoke(*args, "1.275TB/s", "--measured", "177")
    assert code == 0, err
    assert "425.0" in out and "177.0" in out and "42%" in out

    # A run's median decode tok/s, and the bytes per token it recorded when it did.
    recs = [make_record(f"r{i}", plain_steps=10, step_s=0.01, label="Base") for i in range(3)]
    recs[0]["read_bytes_per_token"] = recs[1]["read_bytes_per_token"] = recs[2]["read_bytes_per_token"] = 5.1e9
    run = write_run(tmp_path / "r.jsonl", recs)
    code, out, err = invoke(*args, "1.275TB/s", "--run", str(run), "-f", "json")
    assert code == 0, err
    doc = orjson.loads(out)
    assert doc["ceiling_tok_s"] == pytest.approx(425.0)
    row = doc["rows"][0]
    assert row["measurement"] == "chat / Base" and row["bytes_source"] == "measured"
    assert row["ceiling_tok_s"] == pytest.approx(250.0)
    assert row["fraction_of_ceiling"] == pytest.approx(100.0 / 250.0)

    code, _, err = invoke(*args, "warp9")
    assert code == 2 and err.startswith("specproxy: error: --bandwidth: 'warp9' is not a bandwidth")
    code, _, err = invoke(
        "roofline", "--params", "3B", "--bytes-per-param", "1", "--bandwidth", "1TB/s", "--run", str(tmp_path / "nope")
    )
    assert code == 2 and "no such record file" in err
