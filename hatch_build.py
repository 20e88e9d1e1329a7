"""The wheel's build hook: the per-event modules (``specproxy/compiled.py``, ``MODULES``) compiled to C by mypyc.

When mypyc (from the build requirements), setuptools and a working C compiler are there, the wheel holds each of those
modules compiled beside its ``.py`` file, and is tagged for this Python and platform. When any is missing, or the
compile fails, or ``SPECPROXY_PURE`` is set (to anything but empty or ``0``), the wheel is the pure-Python one and
the build says why in one line. Editable installs are always pure Python (the sources are what runs).

The compile runs in a child process, in a temporary copy of the package: mypy reads the package there with its own
configuration (no site-packages, missing imports as ``Any``), so the result does not depend on what else the build
environment holds, and setuptools (which compiles the C) never reads this project's ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = "specproxy"

MYPY_CONFIG = """\
[mypy]
python_version = {major}.{minor}
ignore_missing_imports = True
no_site_packages = True
follow_imports = silent
"""

# Run in the temporary copy: mypyc writes its C and the compiled modules there (build_ext --inplace).
COMPILE = """\
import sys
from setuptools import setup
from mypyc.build import mypycify

files = sys.argv[1:]
setup(
    name="specproxy-compiled",
    ext_modules=mypycify(["--config-file", "mypy.ini", *files], opt_level="3", multi_file=True),
    script_args=["build_ext", "--inplace", "--parallel", "{jobs}"],
)
"""


def _say(line: str) -> None:
    print(f"specproxy build: {line}", file=sys.stderr, flush=True)


def _missing() -> str | None:
    """Why no compile can be tried here, or None."""
    for name in ("mypyc", "setuptools"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc} not found)"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "Python's C headers are not installed (Python.h)"
    return None


def compile_modules(root: Path, modules: tuple[str, ...], work: Path) -> list[tuple[Path, str]]:
    """Compile ``modules`` of the package under ``root`` in ``work``: (each file built, its path in the wheel).
    Raises RuntimeError with the compiler's or mypyc's last line when the compile fails."""
    src = work / "src"
    shutil.copytree(root / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    (src / "mypy.ini").write_text(MYPY_CONFIG.format(major=sys.version_info[0], minor=sys.version_info[1]))
    (src / "compile.py").write_text(COMPILE.replace("{jobs}", str(max(1, os.cpu_count() or 1))))
    files = [m.replace(".", "/") + ".py" for m in modules]
    p = subprocess.run([sys.executable, "compile.py", *files], cwd=src, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        raise RuntimeError((errors or lines or [f"exit status {p.returncode}"])[-1].strip())
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    built = sorted(f for f in src.rglob(f"*{suffix}") if "build" not in f.relative_to(src).parts)
    wanted = {m.replace(".", "/") + suffix for m in modules}
    if not wanted <= {f.relative_to(src).as_posix() for f in built}:
        raise RuntimeError("mypyc ran but not every module was compiled")
    return [(f, f.relative_to(src).as_posix()) for f in built]


class CompiledModules(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        info = runpy.run_path(str(Path(self.root, PACKAGE, "compiled.py")))
        if info["pure_requested"](os.environ):
            _say(f"the pure-Python wheel ({info['PURE_ENV']} is set)")
            return
        why = _missing()
        if why is not None:
            _say(f"the pure-Python wheel ({why}; it works the same, with more CPU per event)")
            return
        self._work = tempfile.mkdtemp(prefix="specproxy-mypyc-")
        t0 = time.monotonic()
        try:
            built = compile_modules(Path(self.root), tuple(info["MODULES"]), Path(self._work))
        except (RuntimeError, OSError) as e:
            _say(f"the pure-Python wheel (the compile failed: {e})")
            return
        for path, in_wheel in built:
            build_data["force_include"][str(path)] = in_wheel
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        _say(f"{len(info['MODULES'])} per-event modules compiled with mypyc in {time.monotonic() - t0:.0f} s")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        work = getattr(self, "_work", None)
        if work:
            shutil.rmtree(work, ignore_errors=True)
