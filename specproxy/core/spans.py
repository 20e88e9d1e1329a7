"""What kind of text a response is writing at each step: an incremental classifier fed each event's delta text.

Span types (:data:`SPAN_TYPES`): ``prose``; ``code`` (inside a fenced block opened by a line that starts with three
backticks, an indented block after a blank line, or an inline code span); ``json`` (an object opened by ``{`` as a
line's first character, until its braces close, and tool-call arguments); ``math`` (``$$ ... $$``, ``\\[ ... \\]``,
``\\( ... \\)``, and ``$...$`` when the ``$`` is followed by neither a space nor a digit, so ``$5`` stays prose);
``cjk`` (Japanese, Chinese, Korean characters); ``whitespace`` (white space and markdown markup alone: line breaks,
indentation, ``#``, ``*``, ``-``, ``|``, ``>``).

:meth:`SpanClassifier.feed` takes one delta and returns the type of most of its characters (an empty delta keeps
the previous type: the step sits where the text was). The state is a handful of small integers, whatever the text:
nothing is buffered, no pattern backtracks. A delta that cannot change the state (no line break, backtick, dollar,
backslash, brace or tab, not at a line's start, not in JSON) takes a fast path of a search and a str method.
Character counts per type do not depend on how the text was split, for deltas up to :data:`MAX_SCAN` characters
(tests/test_core_spans.py feeds text whole, a character at a time and split at random points). Pure.
"""

from __future__ import annotations

import re

SPAN_TYPES: tuple[str, ...] = ("prose", "code", "json", "math", "cjk", "whitespace")
PROSE, CODE, JSON, MATH, CJK, WHITESPACE = range(6)

_MARKUP = " \t\r\n#*-_|>=~+`"  # white space and markdown markup: whitespace where nothing else is
_SPECIAL = re.compile(r"[\n`$\\{\t]")
# Hiragana, katakana, CJK ideographs (and extension A), Hangul syllables and jamo, CJK punctuation and full-width forms
_CJK = re.compile(
    r"[\u1100-\u11ff\u3000-\u303f\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]"
)

# math modes
_NO_MATH, _DOLLAR, _DOUBLE_DOLLAR, _BRACKET, _PAREN = range(5)
# A delta longer than this (no engine streams one; a hostile or broken one might) is classified by its beginning: the
# per-character walk costs the bookkeeper, which serves every stream, time in proportion to its length
MAX_SCAN = 4096
_MAX_DEPTH = 64  # JSON nesting counted up to this; deeper braces count as this deep (state stays bounded)
_INDENT = 4
_PRIORITY = (CODE, JSON, MATH, CJK, PROSE)


class SpanClassifier:
    """One response's text, fed delta by delta (:meth:`feed`)."""

    __slots__ = (
        "_bt",
        "_depth",
        "_esc",
        "_fence",
        "_head",
        "_in_code_span",
        "_indent",
        "_indented",
        "_last",
        "_math",
        "_pending",
        "_prev_blank",
        "_string",
    )

    def __init__(self) -> None:
        self._fence = False  # inside a fenced code block
        self._in_code_span = False  # inside an inline code span (not `_inline`: compiled, that is a C keyword)
        self._indented = False  # this line is indented code
        self._head = True  # only white space so far on this line
        self._indent = 0  # leading spaces of this line (capped)
        self._bt = 0  # backticks at the start of this line (after its indentation)
        self._prev_blank = True  # the previous line was blank or code: an indented line starts a code block
        self._depth = 0  # JSON nesting
        self._string = False  # inside a JSON string
        self._esc = False  # after a backslash inside a JSON string
        self._math = _NO_MATH
        self._pending = ""  # "$" or "\\" whose meaning the next character decides
        self._last = PROSE

    def feed(self, text: str, tool: bool = False) -> int:
        """The span type (an index into :data:`SPAN_TYPES`) of one delta; ``tool``: it is tool-call arguments."""
        if tool:
            self._last = JSON
            return JSON
        if not text:
            return self._last
        if not self._head and not self._pending and not self._depth and _SPECIAL.search(text) is None:
            if self._fence or self._indented or self._in_code_span:
                kind = CODE
            elif self._math:
                kind = MATH
            elif text.isascii():
                kind = WHITESPACE if not text.strip(_MARKUP) else PROSE
            else:
                kind = _plain_kind(text)
            self._last = kind
            return kind
        counts = self.counts(text if len(text) <= MAX_SCAN else text[:MAX_SCAN])
        best = max(_PRIORITY, key=counts.__getitem__)  # a tie goes to the rarer kind: "$$" opens math
        kind = best if counts[best] else WHITESPACE
        self._last = kind
        return kind

    def counts(self, text: str) -> list[int]:
        """Characters of ``text`` per span type, the state moved past it; white space and markup in plain text count
        as whitespace, in code, JSON or math as those."""
        counts = [0] * 6
        for ch in text:
            counts[self._char(ch)] += 1
        return counts

    def _char(self, ch: str) -> int:
        if ch == "\n":
            return self._newline()
        pending, self._pending = self._pending, ""
        if self._head:
            if ch == " " and not self._bt:
                self._indent = min(self._indent + 1, _INDENT)
                return self._mode_type(WHITESPACE)
            if ch == "\t" and not self._bt:
                self._indent = _INDENT
                return self._mode_type(WHITESPACE)
            if ch == "`" and not self._in_code_span and not self._depth and not self._math:
                self._bt += 1
                if self._bt == 3:
                    self._fence = not self._fence
                    self._head = False
                    self._bt = 0
                return CODE
            self._head = False
            if self._bt:  # one or two backticks opened or closed inline code
                if self._bt % 2:
                    self._in_code_span = not self._in_code_span
                self._bt = 0
            elif (
                not self._fence
                and not self._depth
                and not self._math
                and not self._in_code_span
                and self._indent >= _INDENT
                and self._prev_blank
                and ch not in "-*+0123456789"
            ):
                self._indented = True
            elif ch == "{" and not (self._fence or self._math or self._in_code_span or self._indented or self._depth):
                self._depth = 1
                self._string = False
                return JSON
        if self._fence or self._indented:
            return CODE
        if self._in_code_span:
            if ch == "`":
                self._in_code_span = False
            return CODE
        if self._depth:
            return self._json_char(ch)
        if self._math:
            return self._math_char(ch, pending)
        # plain text
        if pending == "$":
            if ch == "$":
                self._math = _DOUBLE_DOLLAR
                return MATH
            if not ch.isspace() and not ch.isdigit():
                self._math = _DOLLAR
                return MATH
        elif pending == "\\" and ch in "[(":
            self._math = _BRACKET if ch == "[" else _PAREN
            return MATH
        if ch == "`":
            self._in_code_span = True
            return CODE
        if ch == "$" or ch == "\\":
            self._pending = ch
            return PROSE
        if ch in _MARKUP:
            return WHITESPACE
        if ch >= "\u1100" and _CJK.match(ch):
            return CJK
        return PROSE

    def _newline(self) -> int:
        kind = self._mode_type(WHITESPACE)
        blank = self._head and not self._bt
        self._pending = ""
        if self._math == _DOLLAR:
            self._math = _NO_MATH  # inline math ends with its line
        self._in_code_span = False
        if self._depth and blank:
            self._depth = 0  # a blank line ends what looked like JSON
        self._prev_blank = blank or self._indented or self._fence
        self._indented = False
        self._head = True
        self._indent = 0
        self._bt = 0
        return kind

    def _mode_type(self, plain: int) -> int:
        if self._fence or self._indented or self._in_code_span:
            return CODE
        if self._depth:
            return JSON
        if self._math:
            return MATH
        return plain

    def _json_char(self, ch: str) -> int:
        if self._string:
            if self._esc:
                self._esc = False
            elif ch == "\\":
                self._esc = True
            elif ch == '"':
                self._string = False
        elif ch == '"':
            self._string = True
        elif ch in "{[":
            self._depth = min(self._depth + 1, _MAX_DEPTH)
        elif ch in "}]":
            self._depth -= 1
        return JSON

    def _math_char(self, ch: str, pending: str) -> int:
        mode = self._math
        if mode == _DOLLAR and ch == "$":
            self._math = _NO_MATH
        elif mode == _DOUBLE_DOLLAR and ch == "$":
            if pending == "$":
                self._math = _NO_MATH
            else:
                self._pending = "$"
        elif mode in (_BRACKET, _PAREN):
            if pending == "\\" and ch == ("]" if mode == _BRACKET else ")"):
                self._math = _NO_MATH
            elif ch == "\\" and pending != "\\":
                self._pending = "\\"
        return MATH


def _plain_kind(text: str) -> int:
    """Plain text that is not all ASCII: cjk when CJK characters outnumber the other characters that are not white
    space or markup."""
    cjk = len(_CJK.findall(text))
    other = sum(1 for ch in text if ch not in _MARKUP) - cjk
    if not cjk and other <= 0:
        return WHITESPACE
    return CJK if cjk >= other else PROSE  # a tie is cjk, as in SpanClassifier.feed
