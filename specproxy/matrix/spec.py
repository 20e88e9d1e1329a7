"""A matrix file's content: the configurations to measure and the one plan every configuration is measured with.
Pure: a parsed document (dicts and lists) in, a checked :class:`MatrixSpec` out, or a :class:`MatrixError` whose
message is one line naming the place in the file (``configurations[2].command: ...``).

Placeholders are filled when a configuration is started (:func:`expand`): ``{port}`` (a free loopback port chosen
for it), ``{host}`` (127.0.0.1), ``{label}``, ``{results}`` (the results folder), ``{cache}`` (its ``cache``
folder, created before the first start: for the caches, temporary files and sockets a server would otherwise leave
in the home folder or /tmp), ``{python}`` (the interpreter running specproxy) and ``${NAME}`` from the environment
(an unset name is an error, never an empty string). Other braces stay as they are, so a JSON argument such as
``--speculative-config '{"method": "mtp"}'`` needs no escaping.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
DEFAULT_HEALTH = "/health"
DEFAULT_START_TIMEOUT_S = 600.0
DEFAULT_STOP_TIMEOUT_S = 10.0
MAX_REQUESTS = 100_000  # per workload and repeat: a bound on one matrix's work, not a figure anyone should reach
_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,63}")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PLACEHOLDERS = ("port", "host", "label", "results", "cache", "python")
_TOP_KEYS = {
    "version",
    "results",
    "workloads",
    "requests",
    "warmup",
    "repeats",
    "concurrency",
    "max_tokens",
    "seed",
    "model",
    "endpoint",
    "start_timeout",
    "stop_timeout",
    "env",
    "configurations",
}
_CONFIG_KEYS = {"label", "group", "command", "url", "env", "health", "start_timeout", "model", "k", "metrics"}


class MatrixError(ValueError):
    """The matrix file is wrong; the message is one line naming the place."""


@dataclass(frozen=True, slots=True)
class Configuration:
    """One server configuration: started from ``command`` (then ``url`` defaults to ``http://{host}:{port}``) or
    already running at ``url``. ``groups`` are the comparison tables it appears in (each with its own baseline)."""

    label: str
    command: tuple[str, ...] | None
    url: str | None
    env: Mapping[str, str] = field(default_factory=dict)
    health: str = DEFAULT_HEALTH
    health_given: bool = False
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    groups: tuple[str, ...] = ("",)
    model: str | None = None
    k: int | None = None
    metrics: str | None = "/metrics"  # a path on the server, or None: do not scrape


@dataclass(frozen=True, slots=True)
class MatrixSpec:
    configurations: tuple[Configuration, ...]
    workloads: tuple[str, ...]
    requests: int  # per workload and repeat
    warmup: int = 2
    repeats: int = 5
    concurrency: int = 1
    max_tokens: int | None = None
    seed: int = 0
    endpoint: str = "chat"
    results: str | None = None
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S


def _fail(where: str, what: str) -> MatrixError:
    return MatrixError(f"{where}: {what}" if where else what)


def _int(doc: Mapping[str, Any], key: str, default: int | None, least: int, where: str) -> int | None:
    v = doc.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise _fail(f"{where}{key}", f"must be an integer of at least {least}, got {v!r}")
    if v > MAX_REQUESTS:
        raise _fail(f"{where}{key}", f"must be at most {MAX_REQUESTS}, got {v}")
    return v


def _seconds(doc: Mapping[str, Any], key: str, default: float, where: str) -> float:
    v = doc.get(key, default)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= 86400:
        raise _fail(f"{where}{key}", f"must be a number of seconds in (0, 86400], got {v!r}")
    return float(v)


def _str(doc: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    v = doc.get(key, default)
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise _fail(f"{where}{key}", f"must be a non-empty string, got {v!r}")
    return v


def _env(v: Any, where: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _fail(where, f"must be a mapping of NAME: value, got {type(v).__name__}")
    out: dict[str, str] = {}
    for name, value in v.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise _fail(where, f"{name!r} is not an environment variable name")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise _fail(f"{where}.{name}", f"must be a string or a number, got {type(value).__name__}")
        out[name] = str(value)
    return out


def _command(v: Any, where: str) -> tuple[str, ...]:
    if isinstance(v, str):
        try:
            args = shlex.split(v)
        except ValueError as e:
            raise _fail(where, f"cannot split the command line: {e}") from None
    elif isinstance(v, list) and all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in v):
        args = [str(a) for a in v]
    else:
        raise _fail(where, "must be a command line (a string) or a list of arguments")
    if not args:
        raise _fail(where, "is empty")
    return tuple(args)


def _groups(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ("",)
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not items or not all(isinstance(g, str) and g.strip() for g in items):
        raise _fail(where, "must be a group name or a list of group names")
    return tuple(dict.fromkeys(items))


def _configuration(doc: Any, i: int, top: Mapping[str, Any]) -> Configuration:
    where = f"configurations[{i}]"
    if not isinstance(doc, dict):
        raise _fail(where, "must be a mapping with a label and a command or url")
    unknown = sorted(set(doc) - _CONFIG_KEYS)
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_CONFIG_KEYS))})")
    label = doc.get("label")
    if not isinstance(label, str) or not _LABEL_RE.fullmatch(label):
        raise _fail(
            f"{where}.label",
            f"must be 1-64 letters, digits or _.+=- starting with a letter or digit (a file name), got {label!r}",
        )
    where = f"configurations[{i}] ({label})"
    has_cmd, has_url = doc.get("command") is not None, doc.get("url") is not None
    if not has_cmd and not has_url:
        raise _fail(where, "needs a command (to start the server) or a url (of one already running)")
    command = _command(doc["command"], f"{where}.command") if has_cmd else None
    url = _str(doc, "url", f"{where}.")
    if url is not None and not re.match(r"https?://", url):
        raise _fail(f"{where}.url", f"must start with http:// or https://, got {url!r}")
    health = _str(doc, "health", f"{where}.", DEFAULT_HEALTH) or DEFAULT_HEALTH
    if not health.startswith("/") and not re.match(r"https?://", health):
        raise _fail(f"{where}.health", f"must be a path starting with / or a URL, got {health!r}")
    metrics: str | None = "/metrics"
    if "metrics" in doc:
        m = doc["metrics"]
        if m is None or m is False or m == "none":
            metrics = None
        elif isinstance(m, str) and (m.startswith("/") or re.match(r"https?://", m)):
            metrics = m
        else:
            raise _fail(f"{where}.metrics", f"must be a path, a URL or none, got {m!r}")
    k = doc.get("k")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64):
        raise _fail(f"{where}.k", f"must be an integer in 1..64, got {k!r}")
    return Configuration(
        label=label,
        command=command,
        url=url,
        env={**_env(top.get("env"), "env"), **_env(doc.get("env"), f"{where}.env")},
        health=health,
        health_given="health" in doc,
        start_timeout_s=_seconds(
            doc, "start_timeout", _seconds(top, "start_timeout", DEFAULT_START_TIMEOUT_S, ""), f"{where}."
        ),
        groups=_groups(doc.get("group"), f"{where}.group"),
        model=_str(doc, "model", f"{where}.", _str(top, "model", "")),
        k=k,
        metrics=metrics,
    )


def parse_matrix(doc: Any) -> MatrixSpec:
    """Check a parsed matrix document. Raises MatrixError."""
    if not isinstance(doc, dict):
        raise _fail("", "a matrix file must be a mapping with 'workloads' and 'configurations'")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _fail("", f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    version = doc.get("version", VERSION)
    if version != VERSION:
        raise _fail("version", f"this specproxy reads matrix files of version {VERSION}, got {version!r}")
    wl = doc.get("workloads")
    if isinstance(wl, str):
        wl = [w.strip() for w in wl.split(",") if w.strip()]
    if not isinstance(wl, list) or not wl or not all(isinstance(w, str) and w.strip() for w in wl):
        raise _fail("workloads", "must be a list of built-in workload names or workload files")
    if len(set(wl)) != len(wl):
        raise _fail("workloads", "names a workload more than once")
    configs = doc.get("configurations")
    if not isinstance(configs, list) or not configs:
        raise _fail("configurations", "must be a list of at least one configuration")
    parsed = tuple(_configuration(c, i, doc) for i, c in enumerate(configs))
    seen: dict[str, int] = {}
    for i, c in enumerate(parsed):
        low = c.label.lower()  # one record file per label, also on case-insensitive file systems
        if low in seen:
            raise _fail(
                f"configurations[{i}].label", f"{c.label!r} is already the label of configurations[{seen[low]}]"
            )
        seen[low] = i
    endpoint = _str(doc, "endpoint", "", "chat") or "chat"
    if endpoint not in ("chat", "completions"):
        raise _fail("endpoint", f"must be chat or completions, got {endpoint!r}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _fail("seed", f"must be an integer, got {seed!r}")
    return MatrixSpec(
        configurations=parsed,
        workloads=tuple(wl),
        requests=_int(doc, "requests", 10, 1, "") or 10,
        warmup=_int(doc, "warmup", 2, 0, "") or 0,
        repeats=_int(doc, "repeats", 5, 1, "") or 1,
        concurrency=_int(doc, "concurrency", 1, 1, "") or 1,
        max_tokens=_int(doc, "max_tokens", None, 1, ""),
        seed=seed,
        endpoint=endpoint,
        results=_str(doc, "results", ""),
        stop_timeout_s=_seconds(doc, "stop_timeout", DEFAULT_STOP_TIMEOUT_S, ""),
    )


def expand(text: str, values: Mapping[str, str], environ: Mapping[str, str], where: str) -> str:
    """``{name}`` placeholders from ``values`` and ``${NAME}`` from ``environ``. Raises MatrixError for an unset
    variable."""

    def env(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in environ:
            raise _fail(where, f"${{{name}}} is not set in the environment")
        return environ[name]

    out = _ENV_RE.sub(env, text)
    for name in _PLACEHOLDERS:
        if name in values:
            out = out.replace("{" + name + "}", values[name])
    return out


def expand_all(args: Sequence[str], values: Mapping[str, str], environ: Mapping[str, str], where: str) -> list[str]:
    return [expand(a, values, environ, where) for a in args]
