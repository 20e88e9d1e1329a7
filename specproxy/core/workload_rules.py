r"""Which workload a request belongs to: the header, else the first matching rule, else ``default``.

A rules file is JSON: ``{"rules": [{"workload": "code_agent", "path": "^/v1/chat", "model": "qwen.*",
"header": {"name": "X-Team", "value": "^ide$"}, "message": "(?i)refactor", "classify": "code"}, ...]}``. Every key
but ``workload`` is optional and all given keys must match; ``message`` is a regex searched in the last user message;
``classify`` matches the built-in classifier's verdict (``ja``, ``code`` or ``other``). At most :data:`MAX_WORKLOADS`
distinct names are tracked; later ones count as ``other`` so a client cannot blow up metric cardinality.

Bounded work per request, whatever the client sends or the rules say: every regex, the user's and the built-in
classifier's, is RE2 (``google-re2``), which matches in time linear in the text (Python's ``re`` backtracks: a user rule
``(a+)+$`` or a prompt of many newlines could hold the loop for seconds), and only the first
:data:`MAX_CLASSIFIED_CHARS` characters of the message are looked at. A rule RE2 cannot compile (backreferences,
lookaround) is refused when the rules are read, with a one-line error. RE2 syntax:
https://github.com/google/re2/wiki/Syntax (``\w``, ``\d``, ``\s`` are ASCII; ``\p{Han}`` and friends name scripts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import orjson
import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

MAX_WORKLOADS = 100
MAX_CLASSIFIED_CHARS = 32 * 1024  # of the last user message: enough to tell Japanese chat from code
DEFAULT = "default"
OVERFLOW = "other"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class Pattern(Protocol):
    """What specproxy uses of a compiled RE2 pattern."""

    def search(self, text: str) -> object | None: ...
    def findall(self, text: str) -> list[Any]: ...


def compile_re2(pattern: str) -> Pattern:
    """Compile with RE2; raises ``re2.error`` when RE2 cannot (its message says why)."""
    opts = re2.Options()
    opts.log_errors = False  # a rule that does not compile is reported once, by us, not logged by RE2 to stderr
    return cast(Pattern, re2.compile(pattern, opts))


_KANA = compile_re2(r"[\x{3040}-\x{30ff}]")
_HAN = compile_re2(r"[\x{4e00}-\x{9fff}]")
# Horizontal white space only around line anchors: with \s the engine would run across newlines at every line start.
_CODE_HINTS = compile_re2(
    r"(?m)```|^[ \t]*(def|class|import|from|func|fn|pub|public|private|const|let|var|package|#include|SELECT|CREATE)\b"
    r"|[{};][ \t]*$|=>|->|\bTraceback\b|\w+\(\S*\)"
)


class RulesError(ValueError):
    pass


def classify_text(text: str) -> str:
    """``ja`` when the text is mostly Japanese (any kana, or many han characters), ``code`` when it carries code,
    else ``other``. Looks at the first :data:`MAX_CLASSIFIED_CHARS` characters."""
    text = text[:MAX_CLASSIFIED_CHARS]
    if _KANA.search(text) or len(_HAN.findall(text)) >= 4:
        return "ja"
    if len(_CODE_HINTS.findall(text)) >= 2:
        return "code"
    return "other"


def last_user_message(body: Mapping[str, Any] | None) -> str:
    if not body:
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user":
                content = m.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list):  # content parts
                    return " ".join(
                        p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                    )
        return ""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], str):
        return prompt[-1]
    return ""


@dataclass(frozen=True, slots=True)
class Rule:
    workload: str
    path: Pattern | None = None
    model: Pattern | None = None
    header_name: str | None = None
    header_value: Pattern | None = None
    message: Pattern | None = None
    classify: str | None = None

    def matches(self, path: str, model: str | None, headers: Mapping[str, str], message: str | None) -> bool:
        if self.path is not None and not self.path.search(path):
            return False
        if self.model is not None and not (model and self.model.search(model)):
            return False
        if self.header_name is not None:
            value = headers.get(self.header_name)
            if value is None or (self.header_value is not None and not self.header_value.search(value)):
                return False
        if self.message is not None and not (message and self.message.search(message[:MAX_CLASSIFIED_CHARS])):
            return False
        return not (self.classify is not None and classify_text(message or "") != self.classify)


def _compile(where: str, key: str, value: Any) -> Pattern:
    if not isinstance(value, str):
        raise RulesError(f"{where}: '{key}' must be a string regex")
    try:
        return compile_re2(value)
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise RulesError(
            f"{where}: bad regex for '{key}': {reason} (rules are RE2, which matches in linear time: "
            "no backreferences or lookaround)"
        ) from None


def parse_rules(text: bytes | str, source: str = "rules") -> tuple[Rule, ...]:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise RulesError(f"{source}: not valid JSON: {e}") from e
    items = doc.get("rules") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise RulesError(f'{source}: expected {{"rules": [...]}}')
    rules = []
    for i, item in enumerate(items):
        where = f"{source}: rule {i + 1}"
        if not isinstance(item, dict):
            raise RulesError(f"{where}: must be an object")
        unknown = set(item) - {"workload", "path", "model", "header", "message", "classify"}
        if unknown:
            raise RulesError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        name = item.get("workload")
        if not isinstance(name, str) or not _NAME.match(name):
            raise RulesError(f"{where}: 'workload' must be 1-64 characters of letters, digits, '_', '.', '-'")
        header = item.get("header")
        h_name = h_value = None
        if header is not None:
            if not isinstance(header, dict) or not isinstance(header.get("name"), str):
                raise RulesError(f'{where}: \'header\' must be {{"name": ..., "value": regex}}')
            h_name = header["name"].lower()
            if "value" in header:
                h_value = _compile(where, "header.value", header["value"])
        classify = item.get("classify")
        if classify is not None and classify not in ("ja", "code", "other"):
            raise RulesError(f"{where}: 'classify' must be one of ja, code, other")
        rules.append(
            Rule(
                workload=name,
                path=_compile(where, "path", item["path"]) if "path" in item else None,
                model=_compile(where, "model", item["model"]) if "model" in item else None,
                header_name=h_name,
                header_value=h_value,
                message=_compile(where, "message", item["message"]) if "message" in item else None,
                classify=classify,
            )
        )
    return tuple(rules)


class WorkloadResolver:
    """Header first, then rules, then ``default``; caps distinct names at :data:`MAX_WORKLOADS`."""

    def __init__(self, rules: tuple[Rule, ...] = (), max_workloads: int = MAX_WORKLOADS) -> None:
        self.rules = rules
        self.max_workloads = max_workloads
        self._seen: set[str] = {DEFAULT, OVERFLOW}

    @property
    def needs_message(self) -> bool:
        return any(r.message is not None or r.classify is not None for r in self.rules)

    def resolve(
        self, header: str | None, path: str, model: str | None, headers: Mapping[str, str], message: str | None
    ) -> str:
        name: str | None = None
        if header:
            header = header.strip()
            name = header if _NAME.match(header) else OVERFLOW
        else:
            for rule in self.rules:
                if rule.matches(path, model, headers, message):
                    name = rule.workload
                    break
        if name is None:
            return DEFAULT
        if name in self._seen:
            return name
        if len(self._seen) - 2 >= self.max_workloads:
            return OVERFLOW
        self._seen.add(name)
        return name
