"""Reading a matrix file (YAML, or JSON, which YAML reads too) and the example matrices shipped with the package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from specproxy.matrix.spec import MatrixError, MatrixSpec, parse_matrix

MAX_FILE_BYTES = 1024 * 1024


def read_document(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise MatrixError(f"{source}: not valid YAML or JSON{where}: {problem}") from None


def load_matrix(path: Path) -> MatrixSpec:
    """Raises MatrixError with the file's name in front."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise MatrixError(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB; is it a matrix file?")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MatrixError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise MatrixError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise MatrixError(f"{path}: cannot read: {e.strerror or e}") from None
    return parse_text(text, str(path))


def parse_text(text: str, source: str) -> MatrixSpec:
    doc = read_document(text, source)
    try:
        return parse_matrix(doc)
    except MatrixError as e:
        raise MatrixError(f"{source}: {e}") from None


def _examples() -> Any:
    return resources.files("specproxy.matrix").joinpath("examples")


def example_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in _examples().iterdir() if p.name.endswith(".yaml"))


def example_text(name: str) -> str:
    """Raises MatrixError for an unknown name."""
    if name not in example_names():
        raise MatrixError(f"no example matrix {name!r}; examples: {', '.join(example_names())}")
    return str(_examples().joinpath(f"{name}.yaml").read_text(encoding="utf-8"))
