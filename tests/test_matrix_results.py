"""A matrix's results folder (specproxy.matrix.results): a record file appears whole or not at all, a failed
configuration's records are kept aside, the manifest survives a rerun, and a configuration is skipped only when
measured with the same fingerprint and its records are there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specproxy.matrix.results import MANIFEST, MANIFEST_KIND, Entry, Results, config_fingerprint
from specproxy.matrix.spec import Configuration


def _config(**env: str) -> Configuration:
    return Configuration(label="a", command=("serve", "--k", "3"), url=None, env=env)


def test_the_fingerprint_is_the_configuration_as_written_and_the_plan() -> None:
    fp = config_fingerprint(_config(A="1", B="${TOKEN}"), "plan1")
    assert len(fp) == 16
    assert config_fingerprint(Configuration(label="a", command=("serve", "--k", "3"), url=None,
                                            env={"B": "${TOKEN}", "A": "1"}), "plan1") == fp  # fmt: skip
    assert config_fingerprint(_config(A="1", B="${TOKEN}"), "plan2") != fp
    assert config_fingerprint(_config(A="2", B="${TOKEN}"), "plan1") != fp


def test_records_are_renamed_whole_once_measured(tmp_path: Path) -> None:
    r = Results(tmp_path / "out")
    r.open()
    part = r.begin("a")
    assert part == tmp_path / "out" / "a.jsonl.part"
    part.write_text("{}\n")
    assert not r.measured("a", "fp")
    r.finish("a", Entry(status="measured", fingerprint="fp", records=1))
    assert not part.exists() and r.records_path("a").read_text() == "{}\n"
    assert r.measured("a", "fp") and not r.measured("a", "other")


def test_a_failed_configurations_records_are_kept_aside(tmp_path: Path) -> None:
    r = Results(tmp_path)
    r.open()
    r.begin("a").write_text("{}\n")
    r.finish("a", Entry(status="failed", fingerprint="fp", error="exit 1", log_tail=("boom",)))
    assert r.failed_path("a").read_text() == "{}\n" and not r.records_path("a").exists()
    assert not r.measured("a", "fp")
    # a new attempt starts from nothing
    r.records_path("a").write_text("old")
    r.begin("a")
    assert not r.failed_path("a").exists() and not r.records_path("a").exists()


def test_the_manifest_survives_a_rerun_and_the_record_file_must_be_there(tmp_path: Path) -> None:
    r = Results(tmp_path)
    r.open()
    r.begin("a").write_text("{}\n")
    r.finish("a", Entry(status="measured", fingerprint="fp", records=1, seconds=2.5, finished_at=3.0))
    r.finish("b", Entry(status="failed", fingerprint="fq", error="x", log_tail=("l1", "l2")))
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["kind"] == MANIFEST_KIND and list(doc["configurations"]) == ["a", "b"]
    assert not (tmp_path / (MANIFEST + ".tmp")).exists()
    again = Results(tmp_path)
    again.open()
    assert again.entries == r.entries
    assert again.measured("a", "fp")
    again.records_path("a").unlink()
    assert not again.measured("a", "fp")


def test_write_keeps_the_given_order(tmp_path: Path) -> None:
    r = Results(tmp_path)
    r.entries = {"a": Entry("measured", "1"), "b": Entry("measured", "2")}
    r.write(order=["b", "gone", "a"])
    assert list(json.loads((tmp_path / MANIFEST).read_text())["configurations"]) == ["b", "a"]


def test_a_folder_with_another_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match="is not a specproxy matrix manifest"):
        Results(tmp_path).open()
