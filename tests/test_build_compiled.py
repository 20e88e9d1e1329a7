"""The two builds of the per-event modules: compiled by mypyc where a C compiler is there, else pure Python.

The wheel built without a C compiler, or with ``SPECPROXY_PURE=1``, is the pure-Python one and works; the build in
use is named by ``specproxy --version``; ``SPECPROXY_PURE=1`` loads the ``.py`` files even where compiled ones are
installed (``specproxy bench --floors`` runs both builds side by side that way).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specproxy.compiled import MODULES, PURE_ENV, build, pure_requested

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    return {**env, **extra}


def test_every_module_named_for_the_compile_exists_as_a_python_file() -> None:
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert (Path(spec.origin).parent / (name.rsplit(".", 1)[1] + ".py")).exists(), name


def test_the_pure_switch_reads_empty_and_zero_as_off() -> None:
    assert not pure_requested({}) and not pure_requested({PURE_ENV: ""}) and not pure_requested({PURE_ENV: "0"})
    assert pure_requested({PURE_ENV: "1"}) and pure_requested({PURE_ENV: "yes"})


def test_the_version_names_the_build_and_the_pure_switch_loads_the_python_files() -> None:
    assert build() in ("compiled", "pure-Python") or build().startswith("partly compiled")
    p = subprocess.run([sys.executable, "-m", "specproxy", "--version"], capture_output=True, text=True, env=_env())
    assert p.returncode == 0 and p.stdout.strip().endswith(f"({build()})"), p.stdout
    pure = _env(**{PURE_ENV: "1"})
    p = subprocess.run([sys.executable, "-m", "specproxy", "--version"], capture_output=True, text=True, env=pure)
    assert p.returncode == 0 and p.stdout.strip().endswith("(pure-Python)"), p.stdout
    check = "import importlib, specproxy.compiled as c;print(*(importlib.import_module(m).__file__ for m in c.MODULES))"
    p = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=pure)
    assert p.returncode == 0 and all(f.endswith(".py") for f in p.stdout.split()), p.stdout + p.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "why"),
    [({"CC": "/nonexistent/cc"}, "no C compiler (/nonexistent/cc not found)"), ({PURE_ENV: "1"}, "is set")],
    ids=["no-compiler", "forced"],
)
def test_a_wheel_built_without_the_compile_is_pure_python_and_works(
    tmp_path: Path, env: dict[str, str], why: str
) -> None:
    pytest.importorskip("hatchling", reason="the wheel's build backend (the test extra installs it)")
    out = tmp_path / "dist"
    p = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("specproxy build:")]
    assert len(said) == 1 and "the pure-Python wheel" in said[0] and why in said[0], p.stderr
    (wheel,) = out.glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert not [n for n in names if n.endswith((".so", ".pyd"))]
        z.extractall(tmp_path / "site")
    run = (
        "import specproxy.compiled as c, specproxy.core.sse as s;"
        "assert s.__file__.startswith(sys.argv[1]), s.__file__;"
        "(ev,) = s.SSEDecoder().feed(b'data: {}\\n\\n'); print(c.build(), ev.data)"
    )
    p = subprocess.run(
        [sys.executable, "-P", "-c", "import sys;" + run, str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=str(tmp_path / "site")),
        cwd=tmp_path,
    )
    assert p.returncode == 0 and p.stdout.split() == ["pure-Python", "{}"], p.stdout + p.stderr
