"""The package's shape: no import circles, and layers import downwards only.

The import graph counts every import, at module level or inside a function (a lazy import that dodges a circle is
still a circle). How large a function may grow is ruff's to check (C901 and PLR0915 in pyproject.toml); how a module
is split is left to its ideas.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "specproxy"
# Layers that must not import these (the pure core imports no layer; attribution is imported by the recorder and the
# proxy, never the reverse; the load generator is a client and needs nothing of the proxy).
FORBIDDEN = {
    "specproxy.core": ("specproxy.",),  # anything outside core, checked below with the exception of itself
    "specproxy.attribution": ("specproxy.recorder", "specproxy.proxy", "specproxy.loadgen", "specproxy.commands"),
    "specproxy.analysis": ("specproxy.recorder", "specproxy.proxy", "specproxy.loadgen", "specproxy.commands"),
    "specproxy.loadgen": ("specproxy.proxy", "specproxy.commands"),
    "specproxy.sim": ("specproxy.recorder", "specproxy.proxy", "specproxy.loadgen", "specproxy.commands"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` needs the submodule, not what pkg/__init__ defines
                names = [f"{node.module}.{a.name}" for a in node.names]
                if not all(n in mods for n in names):
                    names.append(node.module)
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            graph[m].update(n for n in names if n in mods and n != m)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_layers_import_downwards_only() -> None:
    bad = []
    for m, targets in _graph().items():
        for layer, forbidden in FORBIDDEN.items():
            if m == layer or m.startswith(layer + "."):
                bad += [(m, t) for t in targets if t.startswith(forbidden) and not t.startswith(layer)]
    assert bad == []
