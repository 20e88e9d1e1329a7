"""Helpers for the deployment tests: the metric names a PromQL expression reads, compose's variable interpolation,
the deployment files, and ``specproxy`` commands started as processes on port 0 with their URLs read from stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DATA = Path(__file__).parent / "data"

# PromQL words that look like identifiers and are not metric names (binary operators, modifiers, literals).
_KEYWORDS = frozenset(
    {"and", "or", "unless", "atan2", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"inf", "nan"}
)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"((?:\\.|[^"\\])*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.])[A-Za-z_:][A-Za-z0-9_:]*")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not function calls, keywords, label names in a
    grouping clause or a matcher, durations, numbers or Grafana variables; plus ``{__name__="..."}`` selectors."""
    names = {m.group(1) for m in _NAME_MATCHER.finditer(expr)}
    s = _GRAFANA_VAR.sub(" ", expr)
    s = _STRING.sub('""', s)  # label values, label_replace arguments: never names
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers (strings are gone, so no '}' is left inside one)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges and subqueries: durations
    s = _GROUPING.sub(" ", s)  # by (workload, le), on (instance), group_left (x)
    for m in _IDENT.finditer(s):
        name = m.group(0)
        if s[m.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation: rate(, sum(, histogram_quantile(
        if name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def grafana_query_names(query: str) -> set[str]:
    """A Grafana Prometheus variable query: ``label_values(metric, label)`` names its metric; otherwise PromQL."""
    m = re.fullmatch(r"\s*label_values\(\s*(.*),\s*\w+\s*\)\s*", query)
    if m:
        return promql_metric_names(m.group(1))
    return promql_metric_names(query)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's interpolation (``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``$$``) applied to every string."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        got = env.get(name)
        if op == ":-":
            return got if got else default
        if op == "-":
            return got if got is not None else default
        return got or ""

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-)([^}]*))?\}", one, value)


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return interpolate(raw, env or {})  # type: ignore[no-any-return]


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    out: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    return out


def rules_exprs() -> tuple[list[str], set[str]]:
    """Every rule expression in docker/prometheus/rules.yml, and the names its recording rules define."""
    doc = yaml.safe_load((DOCKER / "prometheus" / "rules.yml").read_text())
    exprs, recorded = [], set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            exprs.append(rule["expr"])
            if "record" in rule:
                recorded.add(rule["record"])
    return exprs, recorded


@contextmanager
def specproxy_process(
    args: list[str], prefix: str, *, timeout_s: float = 20
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``specproxy ARGS`` as its own process; yields the URL it prints on stderr (``PREFIX http://...``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "specproxy", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        assert line.startswith(prefix + " http://"), (args, line, proc.poll())
        yield line.split()[len(prefix.split())], proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def listen_any(args: list[str]) -> list[str]:
    """The same arguments with ``--listen`` moved to a free loopback port."""
    out = list(args)
    i = out.index("--listen")
    out[i + 1] = "127.0.0.1:0"
    return out


def replace_option(args: list[str], option: str, value: str) -> list[str]:
    out = list(args)
    i = out.index(option)
    out[i + 1] = value
    return out
