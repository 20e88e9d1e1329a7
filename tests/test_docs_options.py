"""Every command and option the README and docs/ name exists, and the README stays a front door.

Commands are read from the code blocks and the inline code of README.md and docs/*.md. Each flag belongs to the
program named before it on its command line: a ``specproxy`` command's flags must be options of that command (asked
of the CLI's own Click commands, in-process); a ``python -m MODULE`` of this repository must name the flag in its
source; another program's flags (vLLM, docker, pytest, ...) are its own business. A flag written alone must be an
option of some ``specproxy`` command, of a script of this repository that the same file runs, or one of the few other
programs' flags listed below.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from specproxy.cli import app

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = (README, *sorted((ROOT / "docs").glob("*.md")))

# Programs whose command lines the docs show with their own flags.
OTHER_PROGRAMS = frozenset({"docker", "ollama", "pip", "pytest", "ruff", "vllm", "vulture"})

# Other programs' flags that the docs name alone, in prose, by the program that takes them.
OTHER_FLAGS_BY_PROGRAM = {
    "vllm serve": (
        "--dtype",
        "--enable-per-request-metrics",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "--max-model-len",
        "--otlp-traces-endpoint",
        "--per-request-spec-decode-metrics",
        "--speculative-disable-by-batch-size",
    ),
    "SGLang": (
        "--decode-log-interval",
        "--enable-metrics",
        "--incremental-streaming-output",
        "--speculative-num-steps",
    ),
    "llama.cpp's server": ("--metrics",),
    "llama-cpp-python's server": ("--draft_model", "--draft_model_num_pred_tokens"),
    "docker run": ("--rm", "--sig-proxy"),
}
OTHER_FLAGS = frozenset(f for flags in OTHER_FLAGS_BY_PROGRAM.values() for f in flags)


FLAG = re.compile(r"--?[A-Za-z][\w-]*")
FENCE = re.compile(r"^(```|~~~)")
SPAN = re.compile(r"`([^`]+)`")
PROGRAM_PY = re.compile(r"^python3?$")


@dataclass(frozen=True)
class Line:
    path: Path
    number: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.number}"


def _cli_options() -> dict[tuple[str, ...], frozenset[str]]:
    """Each command path (``("engine", "vllm-cpu", "setup")``) and its options, --help included."""
    found: dict[tuple[str, ...], frozenset[str]] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is not None:
            own = {o for p in cmd.params if p.param_type_name == "option" for o in p.opts}  # the root's --version
            found[path] = frozenset({"--help", *own})
            for name, sub in subs.items():
                walk(sub, (*path, name))
            return
        opts = {"--help"}
        for p in cmd.params:
            if p.param_type_name == "option":
                opts.update(p.opts, p.secondary_opts)
        found[path] = frozenset(opts)

    walk(typer.main.get_command(app), ())
    return found


LANDED = _cli_options()
OPTIONS = LANDED
ANY_OPTION = frozenset().union(*OPTIONS.values())


def _command_lines(path: Path) -> list[Line]:
    """Each line of a fenced block (backslash continuations joined) and each inline code span, with its line."""
    lines: list[Line] = []
    fenced = False
    continued: Line | None = None
    prose: list[str] = []
    prose_numbers: list[int] = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(raw.lstrip()):
            fenced = not fenced
        elif not fenced:
            prose.append(raw)
            prose_numbers.append(n)
        else:
            text = raw.rstrip()
            line = Line(path, n, text) if continued is None else Line(path, continued.number, continued.text + text)
            continued = Line(path, line.number, line.text[:-1] + " ") if text.endswith("\\") else None
            if continued is None:
                lines.append(line)
    starts = list(itertools.accumulate((len(t) + 1 for t in prose), initial=0))
    for m in SPAN.finditer("\n".join(prose)):  # a span may wrap onto the next line of its paragraph
        if "\n\n" not in m.group(1):
            number = prose_numbers[bisect.bisect_right(starts, m.start()) - 1]
            lines.append(Line(path, number, m.group(1).replace("\n", " ")))
    return lines


def _segments(text: str) -> list[list[str]]:
    """The words of each simple command on a line: split at pipes, ``&&``, ``;``, ``&`` and comments; a quoted
    string that holds spaces (a command inside an option's value) is a segment of its own."""
    segments: list[list[str]] = [[]]
    quoted: list[str] | None = None
    quote = ""
    for word in text.split():
        if quoted is not None:
            if word.endswith(quote):
                quoted.append(word.rstrip(quote + ",)"))
                segments.append(quoted)
                segments.append([])
                quoted = None
                continue
            quoted.append(word)
            continue
        if word[0] in "\"'" and not word.rstrip(",)").endswith(word[0]) and len(word) > 1:
            quote = word[0]
            quoted = [word[1:]]
            continue
        if word.startswith("#"):
            break  # the rest of the line is a comment
        if word in ("|", "||", "&&", ";", "&") or word.startswith("$("):
            segments.append([])
            continue
        segments[-1].append(word.strip("\"'[],;()"))
    if quoted:
        segments.append(quoted)
    return [s for s in segments if s]


def _module_source(module: str) -> str | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    return None


def _flags_of(word: str) -> list[str]:
    """``--a=1`` gives ``--a``; ``--progress/--no-progress`` gives both; a value gives nothing."""
    return [m.group(0) for part in word.split("/") if (m := FLAG.fullmatch(part.split("=", 1)[0]))]


@dataclass
class Scope:
    """Who owns the flags that follow on a command line."""

    kind: str  # "specproxy", "module" (a script of this repository), "other" or "none" (a flag alone)
    command: tuple[str, ...] = ()  # the specproxy command's path, or the module's name
    source: str = ""  # the module's source


COMMANDS = frozenset(p[0] for p in OPTIONS if p)
REPO_PACKAGES = ("specproxy", "tests", "benchmarks")


class Checker:
    """Reads one file's command lines; flags alone are judged at the end, once the file's other programs' command
    lines and the scripts it runs are known."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.alone: list[tuple[Line, str]] = []
        self.elsewhere: set[str] = set()  # flags shown on another program's command line in this file
        self.scripts: list[str] = []  # sources of this repository's scripts the file runs

    def line(self, line: Line) -> None:
        for words in _segments(line.text):
            self._segment(line, words)

    def _segment(self, line: Line, words: list[str]) -> None:
        scope = Scope("none")
        i = 0
        while i < len(words):
            word = words[i]
            before = words[i - 1] if i else ""
            is_value = before.startswith("-") and "=" not in before and before != "--"  # --engine vllm
            name = word.rsplit("/", 1)[-1].rsplit("=", 1)[-1]  # a path, or LABEL=vllm in an option's value
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if word == "--" and scope.kind in ("specproxy", "module"):
                scope = Scope("other")  # what follows goes to the program the command starts
            elif name == "specproxy" and not is_value and (scope.kind != "other" or nxt in COMMANDS):
                i, scope = self._specproxy(line, words, i + 1)  # not "ruff check specproxy tests"
                continue
            elif PROGRAM_PY.match(name) and nxt == "-m" and i + 2 < len(words):
                i, scope = self._module(line, words, i + 2)
                continue
            elif name in OTHER_PROGRAMS and not is_value:
                scope = Scope("other")
            elif word.startswith("-"):
                for flag in _flags_of(word):
                    self._flag(line, flag, scope)
            i += 1

    def _specproxy(self, line: Line, words: list[str], i: int) -> tuple[int, Scope]:
        """The command named from ``words[i]`` on (``engine vllm-cpu setup``), and where its options start."""
        path: tuple[str, ...] = ()
        while i < len(words) and (*path, words[i]) in OPTIONS:
            path = (*path, words[i])
            i += 1
        if i < len(words) and re.fullmatch(r"[a-z][a-z0-9-]*", words[i]) and _is_group(path):
            self.problems.append(f"{line.where()}: specproxy {' '.join((*path, words[i]))}: no such command")
            return len(words), Scope("other")
        if not path:
            return i, Scope("none")  # `specproxy --version`
        return i, Scope("specproxy", command=path)

    def _module(self, line: Line, words: list[str], i: int) -> tuple[int, Scope]:
        module = words[i]
        if module == "specproxy":
            return self._specproxy(line, words, i + 1)
        source = _module_source(module)
        if source is not None:
            self.scripts.append(source)
            return i + 1, Scope("module", command=(module,), source=source)
        if module.split(".")[0] in REPO_PACKAGES:
            self.problems.append(f"{line.where()}: python -m {module}: no such module in this repository")
        return i + 1, Scope("other")

    def _flag(self, line: Line, flag: str, scope: Scope) -> None:
        if scope.kind == "other":
            self.elsewhere.add(flag)
        elif scope.kind == "specproxy":
            if flag not in OPTIONS[scope.command]:
                self.problems.append(f"{line.where()}: specproxy {' '.join(scope.command)} has no option {flag}")
        elif scope.kind == "module":
            if not _names(scope.source, flag):
                self.problems.append(f"{line.where()}: python -m {scope.command[0]} does not take {flag}")
        elif flag.startswith("--"):  # a short flag alone is too short to tell whose it is
            self.alone.append((line, flag))

    def finish(self) -> list[str]:
        for line, flag in self.alone:
            if flag in ANY_OPTION or flag in OTHER_FLAGS or flag in self.elsewhere:
                continue
            if any(_names(source, flag) for source in self.scripts):
                continue
            self.problems.append(f"{line.where()}: {flag} is no option of any specproxy command")
        return self.problems


def _is_group(path: tuple[str, ...]) -> bool:
    return any(len(p) > len(path) and p[: len(path)] == path for p in OPTIONS)


def _names(source: str, flag: str) -> bool:
    """Whether a script's source declares the flag (as a quoted string, as argparse and sys.argv checks do)."""
    return re.search(rf"[\"']{re.escape(flag)}[\"'=]", source) is not None


def _check(path: Path, shown_as: Path) -> list[str]:
    checker = Checker()
    for line in _command_lines(path):
        checker.line(Line(shown_as, line.number, line.text))
    return checker.finish()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_option_named_exists(path: Path) -> None:
    problems = _check(path, path)
    assert not problems, "\n".join(problems)


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; depth belongs in docs/"
    first_screen = "\n".join(lines[:80])
    assert "specproxy demo" in first_screen, "the demo command is not within README.md's first 80 lines"
    assert re.search(r"^#+ With your vLLM", first_screen, re.M), "'With your vLLM' is not within the first 80 lines"


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    """A stale option, an unknown command or script, a script's unknown flag and a stray flag are each reported with
    their file and line; a value that names a program, a command in an option's value and what a command passes on
    after ``--`` are not."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "Run `specproxy proxy --rotate-bytes 10`.\n\n```sh\nspecproxy nosuch --x\nspecproxy run --target U "
        '--engine vllm --nope\nspecproxy sweep --baseline "B=vllm serve M --port {port}" --slo tpot=1s\n```\n'
        "And `--made-up` alone.\n\n```sh\npython -m benchmarks.attribution_accuracy --spec-method ngram --nope\n"
        "python -m specproxy.nosuch --x\nspecproxy engine vllm-cpu serve -- --speculative-config X\n```\n",
        encoding="utf-8",
    )
    assert _check(doc, ROOT / "x.md") == [
        "x.md:4: specproxy nosuch: no such command",
        "x.md:5: specproxy run has no option --nope",
        "x.md:11: python -m benchmarks.attribution_accuracy does not take --nope",
        "x.md:12: python -m specproxy.nosuch: no such module in this repository",
        "x.md:1: specproxy proxy has no option --rotate-bytes",
        "x.md:8: --made-up is no option of any specproxy command",
    ]
