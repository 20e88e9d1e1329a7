"""Which build of the per-event modules is loaded: compiled to C by mypyc, or pure Python.

The wheel's build hook (``hatch_build.py``) compiles :data:`MODULES` when mypyc and a working C compiler are there,
and ships their ``.py`` files beside the compiled ones either way. With :data:`PURE_ENV` set (to anything but empty or
``0``), the package loads those ``.py`` files instead (:func:`prefer_source`, called by ``specproxy/__init__.py``), so
one install runs either build: ``specproxy bench --floors`` measures both side by side that way. Stdlib only: the
build hook reads this file before anything is installed.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: every command imports this module first
    import importlib.machinery
    from collections.abc import Mapping, Sequence
    from types import ModuleType

PURE_ENV = "SPECPROXY_PURE"

# What runs once per relayed read or streamed event: the relay's read, stamp and write (the upstream connection, its
# chunked-body reader, the client sink), and the bookkeeper's per-event update (the event channel's frames, a
# request's trace, its timeline: SSE framing, the chunk's JSON in each wire dialect, token counts, spans of text).
# Compiled classes cannot be subclassed or have methods replaced from interpreted code: every dialect is here since
# they share a base class, and the relay's event link (proxy/link.py) is not, since tests replace its methods.
MODULES = (
    "specproxy.proxy.upstream",
    "specproxy.proxy.llbody",
    "specproxy.proxy.relay",
    "specproxy.proxy.events",
    "specproxy.recorder.trace",
    "specproxy.core.timeline",
    "specproxy.core.sse",
    "specproxy.core.openai_stream",
    "specproxy.core.dialects.base",
    "specproxy.core.dialects.native",
    "specproxy.core.dialects.anthropic",
    "specproxy.core.dialects.ollama",
    "specproxy.core.dialects.responses",
    "specproxy.core.tokens",
    "specproxy.core.spans",
)


def pure_requested(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(PURE_ENV, "").strip() not in ("", "0")


class _SourceFirst:
    """Finds each of :data:`MODULES` as its ``.py`` file, ahead of a compiled module of the same name (a finder of
    ``sys.meta_path``; not derived from ``importlib.abc``, whose import costs every command 20 ms)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES or not path:
            return None
        import importlib.util

        source = os.path.join(path[0], fullname.rsplit(".", 1)[1] + ".py")
        return importlib.util.spec_from_file_location(fullname, source) if os.path.exists(source) else None


def prefer_source() -> None:
    """Load the pure-Python per-event modules even where compiled ones are installed (before any is imported)."""
    if not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


def compiled_modules() -> list[str]:
    """Those of :data:`MODULES` that load (or loaded) as compiled extension modules."""
    import importlib.machinery
    import importlib.util

    out = []
    for name in MODULES:
        mod = sys.modules.get(name)
        origin = getattr(mod, "__file__", None) if mod is not None else None
        if mod is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            out.append(name)
    return out


def build() -> str:
    """``compiled`` (every per-event module), ``partly compiled (N of M modules)``, or ``pure-Python``."""
    n = len(compiled_modules())
    if n == len(MODULES):
        return "compiled"
    return f"partly compiled ({n} of {len(MODULES)} modules)" if n else "pure-Python"
