"""The Kubernetes manifests in docker/k8s/: built-in kinds against the Kubernetes JSON schemas (kubernetes-validate,
strict: unknown fields fail), the ServiceMonitor against its structure as the prometheus-operator CRD defines it
(checked here field by field: the CRD's schema is not vendored), the PrometheusRule against the compose stack's
rules, the load Job's arguments against the real command line, and the wiring between them."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tests.deployutil import DOCKER, load_yaml_docs

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (pip install '.[test]')")

K8S = DOCKER / "k8s"


def _docs() -> list[dict[str, Any]]:
    return [d for f in sorted(K8S.glob("*.yaml")) for d in load_yaml_docs(f)]


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in _docs() if d["kind"] == kind]


def test_builtin_kinds_validate_against_the_kubernetes_schemas() -> None:
    version = kv.latest_version()
    checked = []
    for doc in _docs():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # ServiceMonitor, PrometheusRule: custom resources, checked below
        kv.validate(doc, version, strict=True)
        checked.append(doc["kind"])
    assert sorted(checked) == ["Deployment", "Job", "PersistentVolumeClaim", "Service", "Service"]
    # The validator bites: a misspelt field in the pod template is refused.
    bad = copy.deepcopy(_by_kind("Deployment")[0])
    bad["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["httpGett"] = {"path": "/", "port": 8080}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, version, strict=True)


_DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
_ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels", "relabelings"}


def test_servicemonitor_structure() -> None:
    """The fields used, as monitoring.coreos.com/v1 ServiceMonitor defines them: spec.selector a label selector,
    spec.endpoints[] with a port name, an absolute path and a Prometheus duration (the CRD's own pattern)."""
    (sm,) = _by_kind("ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", sm["metadata"]["name"])
    assert set(sm["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert set(sm["spec"]["selector"]) <= {"matchLabels", "matchExpressions"}
    assert sm["spec"]["endpoints"]
    for ep in sm["spec"]["endpoints"]:
        assert set(ep) <= _ENDPOINT_KEYS, ep
        assert isinstance(ep["port"], str) and ep["path"].startswith("/")
        assert _DURATION.fullmatch(ep["interval"])


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_wiring_sidecar_service_monitor_and_job() -> None:
    (deploy,) = _by_kind("Deployment")
    pod = deploy["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {"vllm", "specproxy"}
    ports = {p["name"]: (name, p["containerPort"]) for name, c in containers.items() for p in c.get("ports", [])}
    # One proxy per engine: the sidecar relays to the engine in its own pod.
    args = containers["specproxy"]["args"]
    assert args[0] == "proxy"
    assert args[args.index("--upstream") + 1] == f"http://127.0.0.1:{ports['engine'][1]}"
    assert args[args.index("--listen") + 1].endswith(f":{ports['proxy'][1]}")
    # The clients' Service points at the sidecar, never at the engine.
    services = {s["metadata"]["name"]: s for s in _by_kind("Service")}
    client_svc = services["vllm"]
    assert _matches(client_svc["spec"]["selector"], pod["metadata"]["labels"])
    assert [ports[p["targetPort"]][0] for p in client_svc["spec"]["ports"]] == ["specproxy"]
    # The ServiceMonitor finds both services and scrapes the proxy's and the engine's metrics by port name.
    (sm,) = _by_kind("ServiceMonitor")
    selected = [
        s for s in services.values() if _matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    port_names = {p["name"]: p["targetPort"] for s in selected for p in s["spec"]["ports"]}
    scraped = {ports[port_names[ep["port"]]][0]: ep["path"] for ep in sm["spec"]["endpoints"]}
    assert scraped == {"specproxy": "/specproxy/metrics", "vllm": "/metrics"}
    # vLLM keeps serving while the proxy drains, and both fit the grace period.
    drain = 8.0 if "--drain-timeout" not in args else float(args[args.index("--drain-timeout") + 1])
    sleep = float(containers["vllm"]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert drain < sleep < pod["spec"]["terminationGracePeriodSeconds"]
    # The load generator: one shard per completion index, one run id, the clients' Service as target.
    (job,) = _by_kind("Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    (run,) = spec["template"]["spec"]["containers"]
    rargs = run["args"]
    env = {e["name"]: e for e in run["env"]}
    shard_var = rargs[rargs.index("--shard") + 1].split("/")[0]
    assert shard_var == "$(SHARD)" and "job-completion-index" in env["SHARD"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert rargs[rargs.index("--shard") + 1].endswith(f"/{spec['completions']}")
    assert "--run-id" in rargs
    assert rargs[rargs.index("--target") + 1] == f"http://vllm:{client_svc['spec']['ports'][0]['port']}"
    claim = spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    (pvc,) = _by_kind("PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim and "ReadWriteMany" in pvc["spec"]["accessModes"]


def test_prometheusrule_carries_the_same_rules_as_the_compose_stack() -> None:
    (rule,) = _by_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["spec"] == load_yaml_docs(DOCKER / "prometheus" / "rules.yml")[0]


def test_job_arguments_are_accepted_by_the_real_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Every option of the Job's `specproxy run` parses: with the target swapped for a closed port, the run stops
    at the reachability check (exit 1), not at option parsing (exit 2)."""
    import socket

    from specproxy.cli import main

    (job,) = _by_kind("Job")
    args = list(job["spec"]["template"]["spec"]["containers"][0]["args"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connections are refused
        for opt, value in (("--target", closed), ("--wait-ready", "0.5"), ("--out", "/dev/null")):
            args[args.index(opt) + 1] = value
        args = [a.replace("$(SHARD)", "3") for a in args]
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main(args)
    err = capsys.readouterr().err
    assert done.value.code == 1, err
    assert "not ready" in err or "cannot reach" in err, err
