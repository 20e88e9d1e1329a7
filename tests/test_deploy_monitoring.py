"""The compose stack, Prometheus and Grafana files, checked without a container engine.

- compose.yaml against the compose specification's JSON schema (tests/data/compose-spec.json);
- prometheus.yml and rules.yml with promtool (check config, check rules, the unit tests in rules.test.yml), and every
  dashboard expression parsed by promtool as a rule;
- every metric name the dashboard and the rules read exists in a scrape of a running proxy (after traffic) and a
  running simulator, started here as the compose file starts them: renaming a metric fails this test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specproxy.cli import main as cli_main
from tests.deployutil import (
    DATA,
    DOCKER,
    dashboard_exprs,
    grafana_query_names,
    listen_any,
    load_compose,
    promql_metric_names,
    replace_option,
    rules_exprs,
    specproxy_process,
)

INSTALL_HINT = "promtool not installed (Debian: apt-get install prometheus; as root with CI set, this test installs it)"


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool's path; as root with CI or SPECPROXY_INSTALL_PROMTOOL set, Debian's package is installed first (as the
    HTML test does for Chromium), so a clean CI machine runs these checks instead of skipping them."""
    found = shutil.which("promtool")
    wanted = os.environ.get("CI") or os.environ.get("SPECPROXY_INSTALL_PROMTOOL")
    if found is None and wanted and shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], env=env, check=True, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"],
            env=env,
            check=True,
            capture_output=True,
            timeout=900,
        )
        found = shutil.which("promtool")
    if found is None:
        pytest.skip(INSTALL_HINT)
    return found


needs_promtool = pytest.mark.usefixtures("promtool")
DASHBOARD = DOCKER / "grafana" / "dashboards" / "specproxy.json"


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


# --- compose -------------------------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((DATA / "compose-spec.json").read_text())
    validator = jsonschema.Draft201909Validator(schema)
    for env in ({}, {"SPEC_K": "3", "ENGINE_URL": "http://gpu-box:8000"}):
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(load_compose(env))
        ]
        assert errors == []
    broken = load_compose()
    broken["services"]["specproxy"]["healthcheck"] = {"test": ["CMD", "specproxy", "health"], "intervall": "5s"}
    assert list(validator.iter_errors(broken)), "the schema must reject an unknown key"


def test_compose_stack_hangs_together() -> None:
    compose = load_compose()
    services = compose["services"]
    # Exactly one engine per profile answers to the name "engine", which the proxy and Prometheus use.
    engines = {
        n: s["profiles"]
        for n, s in services.items()
        if "engine" in s.get("networks", {}).get("default", {}).get("aliases", [])
    }
    assert engines == {"vllm": ["gpu"], "sim": ["cpu"]}
    assert "profiles" not in services["specproxy"] and "profiles" not in services["prometheus"]
    assert (
        services["specproxy"]["command"][services["specproxy"]["command"].index("--upstream") + 1]
        == "http://engine:8000"
    )
    # Prometheus scrapes names that exist in the stack, at the paths the proxy and the engine serve.
    prom = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    names = set(services) | {
        a for s in services.values() for a in s.get("networks", {}).get("default", {}).get("aliases", [])
    }
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["specproxy"]["metrics_path"] == "/specproxy/metrics"
    for job in jobs.values():
        for target in job["static_configs"][0]["targets"]:
            host, _port = target.split(":")
            assert host in names, target
    # Bind mounts exist; Grafana's home dashboard and datasource uid are the ones shipped.
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DOCKER / src).exists(), src
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/" + DASHBOARD.name
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"][0]
    uids = {t["datasource"]["uid"] for p in _dashboard()["panels"] for t in p.get("targets", [])}
    assert uids == {ds["uid"]}
    # vLLM runs Qwen3.5-2B with MTP; k follows SPEC_K in both engines.
    for env, k in (({}, 1), ({"SPEC_K": "3"}, 3)):
        s = load_compose(env)["services"]
        vcmd = s["vllm"]["command"]
        assert vcmd[0] == "Qwen/Qwen3.5-2B"
        assert json.loads(vcmd[vcmd.index("--speculative-config") + 1]) == {
            "method": "mtp",
            "num_speculative_tokens": k,
        }
        scmd = s["sim"]["command"]
        assert scmd[scmd.index("--num-speculative-tokens") + 1] == str(k)


def test_dashboard_layout() -> None:
    """Unique panel ids, panels inside Grafana's 24 columns and not overlapping, every target with a datasource."""
    dash = _dashboard()
    assert dash["uid"] == "specproxy"
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]
        if p["type"] != "row":
            assert p["targets"] and all(t["datasource"]["uid"] for t in p["targets"]), p["title"]


# --- promtool ------------------------------------------------------------------------------------------------------


def _promtool(*args: str, cwd: Path = DOCKER / "prometheus") -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    assert path is not None
    return subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_checks_config_rules_and_their_unit_tests() -> None:
    for args in (
        ("check", "config", "prometheus.yml"),
        ("check", "rules", "rules.yml"),
        ("test", "rules", "rules.test.yml"),
    ):
        got = _promtool(*args)
        assert got.returncode == 0, (args, got.stdout, got.stderr)


@needs_promtool
def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    exprs = dashboard_exprs(_dashboard())
    assert len(exprs) >= 20
    rules = [
        {"record": f"dashboard:expr{i}", "expr": e.replace("$__rate_interval", "1m").replace("$workload", ".*")}
        for i, e in enumerate(exprs)
    ]
    (tmp_path / "dash.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    got = _promtool("check", "rules", "dash.yml", cwd=tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    # and it would have said so: one unbalanced parenthesis
    rules[0]["expr"] += ")"
    (tmp_path / "dash.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert _promtool("check", "rules", "dash.yml", cwd=tmp_path).returncode != 0


# --- metric names against real scrapes ------------------------------------------------------------------------------


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _sample_names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Sample names of a proxy and a simulator started with the compose file's own arguments (and the proxy shadowing
    to the simulator itself), after the compose file's load generator has sent traffic through the proxy
    (shortened) and one body was refused (413)."""
    tmp = tmp_path_factory.mktemp("stack")
    services = load_compose({"SIM_SPEED": "50", "LOAD_RATE": "8", "LOAD_DURATION": "3"})["services"]
    sim_args = listen_any(services["sim"]["command"])
    with specproxy_process(sim_args, "specproxy sim:") as (sim_url, _):
        proxy_args = listen_any(services["specproxy"]["command"])
        proxy_args = replace_option(proxy_args, "--upstream", sim_url)
        proxy_args = replace_option(proxy_args, "--record", str(tmp / "records.jsonl"))
        proxy_args += ["--max-body", "64KB"]
        # the shadow panels' metrics exist with --shadow only (an opt-in): the simulator is its own candidate here
        proxy_args += ["--shadow", f"self={sim_url}", "--shadow-share", "1", "--shadow-max-inflight", "64"]
        proxy_args += ["--advise-every", "0.5"]  # the live advice within the scrape's wait, not after a minute
        # the per-band check (an alert reads it); 24 requests make at least one band of 5 whatever their overlap
        proxy_args += ["--speculative-config", '{"num_speculative_tokens": 3}']
        with specproxy_process(proxy_args, "specproxy proxy:") as (proxy_url, _):
            run_args = replace_option(services["loadgen"]["command"], "--target", proxy_url)
            run_args = replace_option(run_args, "--out", str(tmp / "loadgen.jsonl"))
            with pytest.raises(SystemExit) as ran:  # the command line in this process: one interpreter less to start
                cli_main(run_args)
            assert ran.value.code in (0, None)
            big = urllib.request.Request(proxy_url + "/v1/chat/completions", data=b"x" * 100_000, method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(big, timeout=10)
            assert refused.value.code == 413
            # Records finish a little after their responses (attribution): scrape until every name read is there,
            # for at most 10 s; what is still missing then fails the test below, by name.
            _, recorded = rules_exprs()
            wanted = set(_used_names()) - recorded
            deadline = time.monotonic() + 10
            while True:
                names = _sample_names(_get(proxy_url + "/specproxy/metrics")) | _sample_names(
                    _get(sim_url + "/metrics")
                )
                if wanted <= names or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    yield names


def _used_names() -> dict[str, set[str]]:
    """Where each metric name is read: the dashboard's panels and variable, the rules' expressions."""
    used: dict[str, set[str]] = {}
    dash = _dashboard()
    for e in dashboard_exprs(dash):
        for n in promql_metric_names(e):
            used.setdefault(n, set()).add("dashboard")
    for var in dash["templating"]["list"]:
        for n in grafana_query_names(var["query"]["query"]):
            used.setdefault(n, set()).add("dashboard variable")
    exprs, _ = rules_exprs()
    for e in exprs:
        for n in promql_metric_names(e):
            used.setdefault(n, set()).add("rules")
    return used


@pytest.mark.slow
def test_every_metric_the_dashboard_and_alerts_read_is_exported(scraped: set[str]) -> None:
    used = _used_names()
    _, recorded = rules_exprs()
    missing = {n: sorted(w) for n, w in used.items() if n not in scraped and n not in recorded}
    assert missing == {}
    # The check has teeth: the names really come from both processes, and a renamed metric would be missing.
    assert {"specproxy_spec_zero_acceptance", "vllm:spec_decode_num_draft_tokens_total"} <= set(used)
    assert "specproxy_ttft_second_bucket" not in scraped
    # What the brief of the dashboard asks for is there.
    for name in (
        "specproxy_spec_accepted_tokens_total",
        "specproxy_spec_drafts_total",
        "specproxy_ttft_seconds_bucket",
        "specproxy_inter_token_latency_seconds_bucket",
        "specproxy_inter_step_latency_seconds_bucket",
        "specproxy_generated_tokens_total",
        "specproxy_proxy_overhead_seconds_bucket",
        "specproxy_records_dropped_total",
    ):
        assert name in used, name


def test_recording_rules_used_by_the_dashboard_are_defined() -> None:
    _, recorded = rules_exprs()
    used = {
        n
        for e in dashboard_exprs(_dashboard())
        for n in promql_metric_names(e)
        if ":" in n and not n.startswith("vllm:")
    }
    assert used and used <= recorded


# --- the PromQL name parser ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('rate(http_requests_total{job="api", path=~"/v1/.*"}[5m])', {"http_requests_total"}),
        (
            "histogram_quantile(0.99, sum by (workload, le)"
            ' (rate(specproxy_ttft_seconds_bucket{workload=~"$workload"}[$__rate_interval])))',
            {"specproxy_ttft_seconds_bucket"},
        ),
        ("sum(rate(a_total[5m])) by (instance) / on (instance) group_left (node) b_info", {"a_total", "b_info"}),
        ("x > bool 0 and y unless z or w offset 1h", {"x", "y", "z", "w"}),
        (
            "vllm:spec_decode_num_drafts_total + ignoring(engine) vllm:num_requests_running",
            {"vllm:spec_decode_num_drafts_total", "vllm:num_requests_running"},
        ),
        ('{__name__="odd_name", job="x"} * 1e3 + 0x1F - Inf + NaN', {"odd_name"}),
        ('label_replace(up, "dst", "$1 rate(fake[1m])", "src", "(.*)")', {"up"}),
        ("avg_over_time(workload:acc:ratio[1d:5m] offset 1h) @ start()", {"workload:acc:ratio"}),
        ('topk(5, count_values("le", q_bucket)) atan2 scalar(s_gauge)', {"q_bucket", "s_gauge"}),
        ("sum without (le) (m1) * on() group_right m2", {"m1", "m2"}),
        ('  -  metric_with_space_before_brace {a="}"}', {"metric_with_space_before_brace"}),
        ("${__rate_interval} [[var]] 5", set()),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_grafana_variable_query_names() -> None:
    assert grafana_query_names("label_values(specproxy_requests_total, workload)") == {"specproxy_requests_total"}
    assert grafana_query_names('label_values(up{job="x"}, instance)') == {"up"}
    assert grafana_query_names("query_result(sum by (w) (m_total))") == {"m_total"}
