"""The end of a matrix (specproxy.matrix.report): configurations grouped in order of first appearance, a table per
group over its own baseline with the configurations not measured named, advice only where something speculated,
then what failed."""

from __future__ import annotations

from specproxy.core.record import Record
from specproxy.matrix.report import Failure, analyse, failure_lines, groups_of, matrix_text
from specproxy.matrix.spec import Configuration, MatrixSpec
from tests.analysisutil import make_record


def _c(label: str, *groups: str) -> Configuration:
    return Configuration(label=label, command=None, url="http://h", groups=groups or ("",))


SPEC = MatrixSpec(
    configurations=(_c("base", "fp16", "fp8"), _c("mtp", "fp16"), _c("fp8-mtp", "fp8"), _c("never", "fp16")),
    workloads=("chat",),
    requests=6,
)


def _records() -> dict[str, list[Record]]:
    return {
        "base": [make_record(f"b{i}", label="base", plain_steps=20, step_s=0.02 + 0.001 * i) for i in range(6)],
        "mtp": [
            make_record(f"m{i}", label="mtp", k=3, accepted=[2, 1, 3, 0, 2], step_s=0.025 + 0.001 * i) for i in range(6)
        ],
    }


def test_groups_keep_the_order_of_first_appearance_and_ungrouped_ones_form_one() -> None:
    assert groups_of(SPEC) == {"fp16": ["base", "mtp", "never"], "fp8": ["base", "fp8-mtp"]}
    plain = MatrixSpec(configurations=(_c("a"), _c("b")), workloads=("chat",), requests=1)
    assert groups_of(plain) == {"": ["a", "b"]}


def test_each_group_is_compared_over_its_baseline_and_names_what_is_missing() -> None:
    groups = analyse(SPEC, _records())
    assert [(g.name, g.comparison.baseline, g.missing, g.advice is not None) for g in groups] == [
        ("fp16", "base", ("never",), True),
        ("fp8", "base", ("fp8-mtp",), False),  # nothing speculated in it: no advice
    ]


def test_a_group_without_records_is_left_out() -> None:
    assert analyse(SPEC, {"mtp": _records()["mtp"], "base": []})[0].name == "fp16"
    assert analyse(SPEC, {}) == []


def test_failures_are_said_with_their_log_and_last_lines() -> None:
    fails = [Failure("a", "exit 1", ("x", "y"), "out/a.log"), Failure("b", "no health", (), "")]
    assert failure_lines(fails) == ["a: failed: exit 1 (log: out/a.log)", "  | x", "  | y", "b: failed: no health"]


def test_the_text_heads_with_the_counts_and_ends_with_the_failures_and_the_folder() -> None:
    groups = analyse(SPEC, _records())
    text = matrix_text(SPEC, groups, [Failure("fp8-mtp", "exit 1", (), "")], measured=2, skipped=0, results="out/")
    lines = text.splitlines()
    assert lines[0].startswith(
        "specproxy matrix: 4 configurations (2 measured now, 0 from earlier runs, 1 failed); 6 requests per workload "
        "x 5 repeats, warm-up 2, concurrency 1"
    )
    assert "== fp16 ==" in lines and "== fp8 ==" in lines
    assert "not in this table (not measured): never; speedups are over base" in lines
    assert lines[-3:] == ["fp8-mtp: failed: exit 1", "", "records, logs and manifest: out/"]
    empty = matrix_text(SPEC, [], [], measured=0, skipped=0, results="out/")
    assert "no configuration was measured" in empty.splitlines()
