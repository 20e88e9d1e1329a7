"""What a record keeps of a request body: secrets replaced, depth bounded. Pure: a body in, a body to record out.

Headers are never recorded; this module owns the body. :func:`capture_body` takes what the proxy or the load
generator captured (parsed JSON, or the text of a body that is not JSON) and returns what may be written:

- JSON: every value under a secret-looking key (:func:`is_secret_key`: a word of the name is one of
  :data:`SECRET_WORDS`, in any case, at any depth) is replaced by :data:`REDACTED`, except the request fields listed in
  :data:`KEPT_FIELDS` (counts and settings replay needs). Every other string keeps its text, with credential-shaped
  substrings (:data:`CREDENTIAL_PATTERNS`: ``sk-...``, ``Bearer ...``, JWTs, private keys ...) replaced.
- Text (a body that is not JSON): a form or query string has the values of secret keys replaced; any other text has
  ``"key": value``, ``key=value``, ``key: value`` and multipart fields with secret names replaced; both then lose
  their credential-shaped substrings. Text is cut to :data:`TEXT_CAPTURE_CHARS`.
- A body nested deeper than :data:`MAX_DEPTH` is not captured: the record keeps :data:`TOO_DEEP` instead. The walk
  is depth-bounded, so no body can exhaust the interpreter's recursion limit, and the record stays serialisable
  (orjson refuses to write more than 254 levels).

docs/records.md ("What a captured body keeps") explains the choices to users.

This is the whole policy a secret meets on its way to disk (key words, credential patterns, JSON, forms, free text,
depth), kept together so that one reading shows every rule and no path around them.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from typing import Any
from urllib.parse import unquote_plus

REDACTED = "[redacted]"
MAX_DEPTH = 128  # real request bodies (tool schemas included) nest a few dozen levels at most
TOO_DEEP = f"[not captured: body_too_deep, nested deeper than {MAX_DEPTH} levels]"


MAX_CONTAINERS = 20_000  # objects and arrays in one body: real requests (tool schemas included) have hundreds
TOO_MANY = f"[not captured: body_too_large, more than {MAX_CONTAINERS} objects and arrays]"


def too_large(size: int, limit: int) -> str:
    """The placeholder a record keeps for a body over the capture limit (relayed, never parsed)."""
    return f"[not captured: body_too_large, {size} bytes over the {limit}-byte limit]"


# A body that is not JSON cannot be replayed (replay sends JSON objects): it is kept for a reader, cut to this many
# characters (an audio upload, a multipart form can be megabytes), which also bounds the cost of its redaction.
TEXT_CAPTURE_CHARS = 64 * 1024
# ... and checked for JSON-like nesting (a JSON body too deep for the parser arrives here as text) over as many
# leading characters: the check is a Python loop over brackets.
TEXT_DEPTH_SCAN = TEXT_CAPTURE_CHARS

# A key holds a secret when one of its *words* is one of these, in any case. Words, not substrings: `author`,
# `keyword`, `monkey`, `tokenizer` are not secrets, and `tokens` (`max_tokens`, `completion_tokens`: the counts every
# record is about) is not one either. A key is split into words at every character that is not a letter or a digit
# (snake_case, kebab-case, dotted, bracketed), at a change from lower to upper case (camelCase: `apiKey`), at the
# end of a run of capitals before a capitalised word (`APIKey`) and between letters and digits (`key2`). "salt" and
# "pwd" go beyond the obvious: vLLM's `cache_salt` "should be random, protected from access by 3rd parties" (its
# request schema), and `pwd` and `pass` are common short names for a password.
SECRET_WORDS = frozenset(
    {
        "key",
        "keys",
        "token",
        "secret",
        "secrets",
        "password",
        "passwords",
        "passwd",
        "pwd",
        "pass",
        "passphrase",
        "auth",
        "oauth",
        "authn",
        "authz",
        "authorization",
        "authentication",
        "authenticate",
        "bearer",
        "credential",
        "credentials",
        "creds",
        "cookie",
        "cookies",
        "session",
        "sessions",
        "salt",
        "jwt",
    }
)
# One word that glues a secret to what qualifies it, as lower-case or upper-case names do (`apikey`, `accesstoken`,
# `clientsecret`, `dbpassword`, `JSESSIONID`): a word ending in one of these is a secret, whatever comes before ...
_GLUED_ENDINGS: tuple[str, ...] = (
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "credential",
    "credentials",
    "token",
    "apikey",
    "apikeys",
    "sessionid",
)
# ... and so is one where `key`, `keys` or `tokens` follows a word that makes it a credential (`privatekey`,
# `passkey`, `accesstokens`; not `monkey`, `hotkey` or `maxtokens`), glued or as the next word (`refresh_tokens`).
_QUALIFIERS = (
    "access",
    "api",
    "app",
    "auth",
    "bearer",
    "client",
    "csrf",
    "encryption",
    "license",
    "master",
    "oauth",
    "pass",
    "private",
    "refresh",
    "secret",
    "session",
    "signing",
    "ssh",
    "xsrf",
)
_GLUED_ENDINGS += tuple(q + noun for q in _QUALIFIERS for noun in ("key", "keys", "tokens"))
_TOKENS_AFTER = frozenset({*_QUALIFIERS, "id"})
# `token` before one of these words is a token of text, not a credential: `eos_token_id`, `stop_token_ids`,
# `token_count`, `token_budget`.
_TEXT_TOKEN_NEXT = frozenset(
    {"id", "ids", "str", "strs", "count", "counts", "budget", "limit", "length", "len", "index", "indices", "usage"}
)
_WORD_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

# Request fields that contain a secret word but hold counts or settings: replay sends them back, so they stay.
# Matched by words, only `prompt_cache_key` among them would be redacted; the others are listed all the same, so
# that a secret word added later cannot take a field replay needs.
# Exact names (case matters, as in the schemas). Sources: OpenAI's chat, completions, responses and usage objects;
# vLLM's ChatCompletionRequest / CompletionRequest sampling and extra parameters, its tokenize, detokenize and
# token-in endpoints; Anthropic's messages request (which vLLM also serves); SGLang's and TGI's native parameters.
# `top_k`, `logit_bias`, `user`, `metadata` ... need no entry: their names contain no secret word.
KEPT_FIELDS = frozenset(
    {
        # OpenAI requests
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "prompt_cache_key",  # a cache-bucketing setting, not a credential
        # OpenAI usage objects, when a body carries one (e.g. a stored conversation)
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
        "input_tokens_details",
        "output_tokens_details",
        # vLLM sampling and extra parameters
        "min_tokens",
        "stop_token_ids",
        "allowed_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "add_special_tokens",
        "return_tokens_as_token_ids",
        "return_token_ids",
        # vLLM tokenize / detokenize / token-in generation
        "tokens",
        "token_ids",
        "prompt_token_ids",
        "return_token_strs",
        # Anthropic messages: thinking {"type": "enabled", "budget_tokens": N}
        "budget_tokens",
        # SGLang and TGI native sampling parameters
        "max_new_tokens",
        "min_new_tokens",
    }
)

# JSON Schema keywords whose object maps property *names* to schemas (tools' parameters, response_format): a
# property called "token" or "author" is a name, not a secret, and its schema must survive for replay. A value
# there that is not a schema (a string, a number) is still redacted.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def key_words(name: str) -> list[str]:
    """The words of a key, lower-cased: ``"X-API-Key"``, ``"x_api_key"`` and ``"xApiKey"`` are ``x``, ``api``,
    ``key``."""
    return [w.lower() for w in _WORD_RE.findall(name)]


def is_secret_key(name: str) -> bool:
    """Whether a value under this key is withheld from records: see :data:`SECRET_WORDS`."""
    if name in KEPT_FIELDS:
        return False
    # bodies repeat the same few keys ("role", "content") thousands of times; only short ones are kept in the cache
    return _secret_words(name) if len(name) <= 64 else _secret_words.__wrapped__(name)


@functools.lru_cache(maxsize=4096)
def _secret_words(name: str) -> bool:
    words = key_words(name)
    for i, w in enumerate(words):
        after = words[i + 1] if i + 1 < len(words) else ""
        if w == "token" and after in _TEXT_TOKEN_NEXT:
            continue
        if w in SECRET_WORDS or w.endswith(_GLUED_ENDINGS):
            return True
        if after == "tokens" and w in _TOKENS_AFTER:
            return True
    return False


# -- credential-shaped text ----------------------------------------------------------------------------------------
# Each pattern matches a credential by its own shape, so it is safe in any text, prompts included: a format with a
# fixed prefix and a long random part, or a scheme that announces one. Opaque random strings without such a mark (a
# bare 40-character AWS secret) cannot be told from text and are caught by their key instead. Every pattern starts
# with a literal, so the regex engine skips ahead to it (one fast pass per pattern); the
# word-boundary checks come after the literal for that reason. Group "s", when there, is the part replaced.
CREDENTIAL_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"-----BEGIN[A-Z ]{0,40}PRIVATE KEY-----[\s\S]*?(?:-----END[A-Z ]{0,40}PRIVATE KEY-----|\Z)",  # RFC 7468
        # RFC 6750 bearer token: 8 or more token characters, one a digit (prose "bearer instruments" has none)
        r"earer(?<=[Bb]earer)(?<![A-Za-z0-9_][Bb]earer)\s+(?P<s>(?=[A-Za-z0-9._~+/-]*[0-9])[A-Za-z0-9._~+/-]{8,}=*)",
        r"BEARER(?<![A-Za-z0-9_]BEARER)\s+(?P<s>(?=[A-Za-z0-9._~+/-]*[0-9])[A-Za-z0-9._~+/-]{8,}=*)",
        # RFC 7617: kept unless it decodes to user:password (see _replace)
        r"Basic(?<![A-Za-z0-9_]Basic)\s+(?P<s>[A-Za-z0-9+/]{4,}={0,2})",
        # OpenAI, Anthropic (sk-ant-), DeepSeek and most OpenAI-compatible services; one digit, as random keys have
        r"sk-(?<![A-Za-z0-9_]sk-)(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{16,}",
        r"gh[pousr]_(?<![A-Za-z0-9_]gh._)[A-Za-z0-9]{30,}",  # GitHub
        r"github_pat_[A-Za-z0-9_]{22,}",
        r"A(?:KIA|SIA)(?<![A-Za-z0-9_]A[KS]IA)[0-9A-Z]{16}(?![A-Za-z0-9])",  # AWS access key id
        r"AIza[0-9A-Za-z_-]{35}",  # Google API key
        r"xox[abposr]-(?<![A-Za-z0-9_]xox.-)[A-Za-z0-9-]{10,}",  # Slack
        r"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z0-9]{30,}",  # Hugging Face
        r"sk_(?<![A-Za-z0-9_]sk_)(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe secret keys
        r"rk_(?<![A-Za-z0-9_]rk_)(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe restricted keys
        r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*",  # JWT (RFC 7519)
        r"://(?P<s>[^/\s:@]{1,256}:[^/\s@]{1,256})@",  # user:password@ in a URL (RFC 3986 userinfo)
    )
)
_MIN_CREDENTIAL = 12  # no pattern matches fewer characters: shorter strings are skipped without a pass


def _replace(m: re.Match[str]) -> str:
    if "s" not in m.re.groupindex:
        return REDACTED
    secret = m.group("s")
    if m.group(0).startswith("Basic"):
        try:
            decoded = base64.b64decode(secret, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return m.group(0)  # prose: "Basic understanding" is not base64 of user:password
        if ":" not in decoded:
            return m.group(0)
    start, end = m.span("s")
    return m.group(0)[: start - m.start()] + REDACTED + m.group(0)[end - m.start() :]


def redact_values(text: str) -> str:
    """``text`` with every credential-shaped substring replaced."""
    if len(text) < _MIN_CREDENTIAL:
        return text
    for pattern in CREDENTIAL_PATTERNS:
        text = pattern.sub(_replace, text)
    return text


# -- JSON ----------------------------------------------------------------------------------------------------------
class BodyTooDeep(ValueError):
    pass


class BodyTooLarge(ValueError):
    pass


_PLAIN = frozenset({int, float, bool})


def redact_json(value: Any, *, _depth: int = 0, _names: bool = False, _left: list[int] | None = None) -> Any:
    """A copy of parsed JSON with secrets replaced. Raises :class:`BodyTooDeep` beyond :data:`MAX_DEPTH` levels of
    objects and arrays: the recursion is bounded by it, never by the interpreter's limit; and
    :class:`BodyTooLarge` beyond :data:`MAX_CONTAINERS` objects and arrays, so the walk's time is bounded too."""
    if isinstance(value, str):
        return redact_values(value)
    if not isinstance(value, dict | list):
        return value
    if _depth >= MAX_DEPTH:
        raise BodyTooDeep(f"nested deeper than {MAX_DEPTH} levels")
    if _left is None:
        _left = [MAX_CONTAINERS]
    _left[0] -= 1
    if _left[0] < 0:
        raise BodyTooLarge(f"more than {MAX_CONTAINERS} objects and arrays")
    if isinstance(value, list):
        # numbers, booleans and nulls come back as they are, without a call each: a body of many tiny elements
        # (up to --capture-max-bytes) must not cost a Python call per element
        return [v if v is None or type(v) in _PLAIN else redact_json(v, _depth=_depth + 1, _left=_left) for v in value]
    out: dict[Any, Any] = {}
    for k, v in value.items():
        name = str(k)
        if _names and isinstance(v, dict | bool):  # a schema under a property name: a name, not a secret
            out[k] = redact_json(v, _depth=_depth + 1, _left=_left)
        elif is_secret_key(name) and v is not None and not isinstance(v, bool):
            out[k] = REDACTED  # null and true/false carry no secret and keep their meaning
        else:
            out[k] = redact_json(v, _depth=_depth + 1, _names=name in _SCHEMA_MAPS and isinstance(v, dict), _left=_left)
    return out


# -- text ----------------------------------------------------------------------------------------------------------
_FORM_RE = re.compile(r"\??[^\s=&]+=[^\s&]*(?:&[^\s=&]*(?:=[^\s&]*)?)*")
_KEY = r"[A-Za-z0-9_.\[\]-]{1,200}"
_QUOTED_KEY_RE = re.compile(r'"(?P<k>(?:[^"\\\r\n]|\\.){1,200})"\s*:\s*')
_SCALAR_RE = re.compile(r'"(?:[^"\\]|\\.)*"?|[^,\]}\s]*')
_MULTIPART_RE = re.compile(
    r'(?P<head>\bname="(?P<k>[^"\r\n]{1,200})"[^\r\n]*\r?\n(?:[^\r\n]+\r?\n)*?\r?\n)(?P<v>[^\r\n]*)'
)
_COLON_RE = re.compile(rf"(?<![A-Za-z0-9_.\[\]-])(?P<k>{_KEY})(?P<sep>[ \t]*:[ \t]*)(?P<v>[^\r\n]+)")
_EQUALS_RE = re.compile(
    rf"(?<![A-Za-z0-9_.\[\]-])(?P<k>{_KEY})(?P<sep>[ \t]*=[ \t]*)(?P<v>\"[^\"\r\n]*\"?|'[^'\r\n]*'?|[^\s&;,]+)"
)
_JSON_TOKEN_RE = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def _keyed(m: re.Match[str]) -> str:
    key = m.group("k")
    if not is_secret_key(key):
        return m.group(0)
    v = m.group("v")
    if v in ("true", "false", "null"):
        return m.group(0)
    start = m.start("v") - m.start(0)
    return m.group(0)[:start] + REDACTED


def _redact_quoted_pairs(text: str) -> str:
    """``"key": value`` pairs of JSON that did not parse (cut short, or invalid): a secret key's value is replaced
    whole, an object or array up to its closing bracket (or the end of the text)."""
    out: list[str] = []
    pos = 0
    while (m := _QUOTED_KEY_RE.search(text, pos)) is not None:
        start = m.end()
        if not is_secret_key(m.group("k")):
            out.append(text[pos:start])
            pos = start
            continue
        end = _json_value_end(text, start)
        value = text[start:end]
        out.append(text[pos:start] + (value if value in ("true", "false", "null") else f'"{REDACTED}"'))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _json_value_end(text: str, start: int) -> int:
    if text[start : start + 1] not in ("[", "{"):
        m = _SCALAR_RE.match(text, start)
        return m.end() if m is not None else start
    depth = 0
    for t in _JSON_TOKEN_RE.finditer(text, start):
        c = t.group(0)
        if c == "[" or c == "{":
            depth += 1
        elif c == "]" or c == "}":
            depth -= 1
            if depth == 0:
                return t.end()
    return len(text)


def redact_form(text: str) -> str:
    """A form or query string (``a=1&api_key=x``) with the values of secret keys, or credential-shaped values,
    replaced; everything else byte for byte."""
    parts = []
    for part in text.split("&"):
        key, eq, value = part.partition("=")
        name, plain = unquote_plus(key), unquote_plus(value)
        if eq and (
            (is_secret_key(name.lstrip("?")) and plain not in ("true", "false")) or redact_values(plain) != plain
        ):
            part = f"{key}={REDACTED}"
        parts.append(part)
    return "&".join(parts)


def redact_text(text: str) -> str:
    """A body that is not JSON: a form or query string by its keys, other text by ``key: value`` patterns; both by
    credential shapes."""
    if _FORM_RE.fullmatch(text.strip()):
        return redact_form(text)
    text = _redact_quoted_pairs(text)
    text = _MULTIPART_RE.sub(_keyed, text)
    text = _COLON_RE.sub(_keyed, text)
    text = _EQUALS_RE.sub(_keyed, text)
    return redact_values(text)


def text_too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether text that looks like JSON opens more than ``limit`` arrays or objects within its first
    :data:`TEXT_DEPTH_SCAN` characters (strings skipped). Iterative, and bounded by the scan."""
    head = text[:TEXT_DEPTH_SCAN]
    if head.lstrip()[:1] not in ("[", "{"):
        return False
    depth = 0
    for m in _JSON_TOKEN_RE.finditer(head):
        c = m.group(0)
        if c == "[" or c == "{":
            depth += 1
            if depth > limit:
                return True
        elif c == "]" or c == "}":
            depth -= 1
    return False


def capture_text(text: str) -> str:
    """A body that is not JSON, as a record keeps it: redacted, and cut to :data:`TEXT_CAPTURE_CHARS`."""
    if text_too_deep(text):
        return TOO_DEEP
    if len(text) <= TEXT_CAPTURE_CHARS:
        return redact_text(text)
    # redact a little more than is kept, so that a secret straddling the cut is seen whole and replaced
    kept = redact_text(text[: TEXT_CAPTURE_CHARS + 4096])[:TEXT_CAPTURE_CHARS]
    return f"{kept}[not captured: {len(text) - TEXT_CAPTURE_CHARS} more characters]"


def capture_body(body: Any) -> Any:
    """What a record keeps of a request body: see the module's docstring. Never raises for any JSON value or text."""
    if isinstance(body, str):
        return capture_text(body)
    try:
        return redact_json(body)
    except BodyTooDeep:
        return TOO_DEEP
    except BodyTooLarge:
        return TOO_MANY
