"""Which workload a request belongs to: the header, else the first matching rule, else ``default``.

A rules file is JSON: ``{"rules": [{"workload": "code_agent", "path": "^/v1/chat", "model": "qwen.*",
"header": {"name": "X-Team", "value": "^ide$"}, "message": "(?i)refactor", "classify": "code"}, ...]}``. Every key
but ``workload`` is optional and all given keys must match; ``message`` is a regex searched in the last user message;
``classify`` matches the built-in classifier's verdict (``ja``, ``code`` or ``other``). At most :data:`MAX_WORKLOADS`
distinct names are tracked; later ones count as ``other`` so a client cannot blow up metric cardinality.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

MAX_WORKLOADS = 100
DEFAULT = "default"
OVERFLOW = "other"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HAN = re.compile(r"[\u4e00-\u9fff]")
_CODE_HINTS = re.compile(
    r"```|^\s*(def|class|import|from|func|fn|pub|public|private|const|let|var|package|#include|SELECT|CREATE)\b"
    r"|[{};]\s*$|=>|->|\bTraceback\b|\w+\(\S*\)",
    re.MULTILINE,
)


class RulesError(ValueError):
    pass


def classify_text(text: str) -> str:
    """``ja`` when the text is mostly Japanese (any kana, or many han characters), ``code`` when it carries code,
    else ``other``."""
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
    path: re.Pattern[str] | None = None
    model: re.Pattern[str] | None = None
    header_name: str | None = None
    header_value: re.Pattern[str] | None = None
    message: re.Pattern[str] | None = None
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
        if self.message is not None and not (message and self.message.search(message)):
            return False
        return not (self.classify is not None and classify_text(message or "") != self.classify)


def _compile(where: str, key: str, value: Any) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise RulesError(f"{where}: '{key}' must be a string regex")
    try:
        return re.compile(value)
    except re.error as e:
        raise RulesError(f"{where}: bad regex for '{key}': {e}") from e


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
