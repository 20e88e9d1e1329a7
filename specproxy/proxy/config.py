"""The proxy's configuration, parsed from the command line, and the upstream's credentials, which never are."""

from __future__ import annotations

import base64
import os
import re
import stat
from dataclasses import dataclass, field

from specproxy.core.workload_rules import Rule
from specproxy.recorder.config import OtlpConfig
from specproxy.recorder.recorder import RecorderConfig


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    upstream: str  # base URL, e.g. http://127.0.0.1:8000
    host: str = "127.0.0.1"
    port: int = 8080
    recorder: RecorderConfig = field(default_factory=RecorderConfig)
    rules: tuple[Rule, ...] = ()
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0  # no byte from upstream for this long: give up (no total timeout)
    max_body_bytes: int = 64 * 1024 * 1024
    max_connections: int = 0  # 0 = unlimited (aiohttp's default of 100 would cap concurrency)
    # On stop, in-flight streams get this long to finish before they are cut: shorter than docker stop's 10 s and
    # Kubernetes' 30 s grace, so the cut streams' records are written before the SIGKILL.
    drain_timeout_s: float = 8.0
    fail_closed: bool = False
    client_header_timeout_s: float = 60.0  # a whole request head, from connect or from its first byte (nginx's 60 s)
    client_body_timeout_s: float = 60.0  # between two reads of a request body (nginx's client_body_timeout)
    # Events a relay holds for its bookkeeper before it sheds chunk events and large bodies (twice this: new
    # requests go unrecorded, counted as lost). --bookkeeping-buffer.
    bookkeeping_buffer_bytes: int = 8 * 1024 * 1024
    otlp: OtlpConfig | None = None  # --otlp-endpoint: a span per inference request, from the bookkeeper
    addons: dict[str, object] = field(default_factory=dict)  # each addon's settings by its name (proxy/addons)
    workers: int = 0  # relay processes (0: one process, the bookkeeper on the relay's loop)
    fast_lane: bool = True  # plain POSTs read by the relay's own front door (proxy/frontdoor.py); --no-fast-lane
    # The Authorization field for the upstream, for requests that bring none (SPECPROXY_UPSTREAM_CREDENTIALS or
    # --upstream-credentials-file; None: the user:password of the upstream's URL, if any). Never shown: not in repr.
    upstream_authorization: str | None = field(default=None, repr=False)


# -- the upstream's credentials ------------------------------------------------------------------------------------
# The command line is every local user's to read (/proc/PID/cmdline, ps): credentials come from the environment
# (/proc/PID/environ is the process owner's and root's only) or from a file, never from argv. docs/deploy.md,
# "Credentials for the upstream", is the user's side of this.
CREDENTIALS_ENV = "SPECPROXY_UPSTREAM_CREDENTIALS"
MAX_CREDENTIALS_BYTES = 16 * 1024  # a header line's worth; a larger file is not a credential

# RFC 9110 5.6.2 token: the auth-scheme of "Bearer abc", "Basic dXNlcjpwdw==", "ApiKey x"
_SCHEME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_LINE_RE = re.compile(r"authorization[ \t]*:[ \t]*", re.IGNORECASE)
_KNOWN_SCHEME_RE = re.compile(r"[ \t]*(?:bearer|basic)[ \t]+[^ \t]", re.IGNORECASE)


class CredentialsError(ValueError):
    """Credentials that cannot be used: a one-line message that never holds any part of them."""


def authorization_value(text: str, source: str) -> str:
    """The Authorization field value for credentials written one of these ways (``source`` names where they came
    from, in errors):

    - ``Authorization: SCHEME CREDENTIALS``: a header line, its value as written (any scheme);
    - ``Bearer TOKEN`` or ``Basic BASE64``: the field's value as written;
    - ``user:password`` (anything else with a colon): Basic authentication (RFC 7617, UTF-8), the password as
      written, spaces included;
    - ``SCHEME CREDENTIALS`` without a colon: the field's value as written;
    - one word without a colon: a bearer token (``Bearer WORD``), as vLLM's ``--api-key`` expects.

    One line; line ends after it are dropped."""
    line = text.rstrip("\r\n")
    if not line.strip():
        raise CredentialsError(f"{source} is empty")
    if "\n" in line or "\r" in line:
        raise CredentialsError(f"{source} holds more than one line: write the credentials on one line")
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in line):
        raise CredentialsError(f"{source} holds a control character")
    header = _HEADER_LINE_RE.match(line)
    if header is not None:
        return _scheme_value(line[header.end() :], source)
    if _KNOWN_SCHEME_RE.match(line):  # before user:password: a token may hold a colon
        return _scheme_value(line, source)
    if ":" in line:
        user, _, password = line.partition(":")
        if not user:
            raise CredentialsError(f"{source}: no user name before the colon of user:password")
        return basic_authorization(user, password)
    word = line.strip(" \t")
    if " " in word:
        return _scheme_value(word, source)
    if word.lower() in ("bearer", "basic"):
        raise CredentialsError(f"{source} names the scheme {word} without its credentials")
    return _scheme_value("Bearer " + word, source)


def basic_authorization(user: str, password: str) -> str:
    """RFC 7617's field value for user:password, encoded as UTF-8 (its only charset)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _scheme_value(value: str, source: str) -> str:
    value = value.strip(" \t")
    if not value.isascii() or not value.isprintable():
        raise CredentialsError(
            f"{source}: a token or header value must be printable ASCII (user:password may be UTF-8)"
        )
    scheme, _, rest = value.partition(" ")
    if not _SCHEME_RE.fullmatch(scheme) or not rest.strip(" \t"):
        raise CredentialsError(f"{source}: expected user:password, a token, or SCHEME CREDENTIALS such as Bearer TOKEN")
    return f"{scheme} {rest.strip(' ')}"


def check_credentials_mode(st: os.stat_result, source: str) -> None:
    """Refuse a credentials file others may read or change (as ssh does for keys), with PostgreSQL's allowance for
    files owned by root: owned by this process's user, no access for group or others (0600, 0400); owned by root,
    read access for its group too (0640, 0440: how a root-owned secret reaches a service's group, e.g. a Kubernetes
    Secret volume with ``defaultMode: 0440`` and the pod's ``fsGroup``); owned by anyone else, refused."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == 0 and not mode & 0o037:
        return
    if st.st_uid == os.geteuid() and not mode & 0o077:
        return
    if st.st_uid not in (0, os.geteuid()):
        raise CredentialsError(
            f"{source} belongs to uid {st.st_uid}: a credentials file must belong to this user ({os.geteuid()}) or "
            "to root"
        )
    allowed = "0640 or 0440 (owned by root)" if st.st_uid == 0 else "0600 or 0400"
    raise CredentialsError(f"{source} is open to other users (mode {mode:04o}): make it {allowed}")


def read_credentials_file(path: str) -> str:
    """The Authorization field value from the credentials file at ``path`` (:func:`authorization_value`), after
    :func:`check_credentials_mode`. Raises :class:`CredentialsError` with a one-line reason."""
    source = f"credentials file {path}"
    return authorization_value(read_secret_file(path, source), source)


def read_secret_file(path: str, source: str) -> str:
    """The text of a file of secrets (credentials, ``--otlp-headers-file``), after :func:`check_credentials_mode`:
    a regular file of UTF-8 text, at most :data:`MAX_CREDENTIALS_BYTES`. Raises :class:`CredentialsError` with a
    one-line reason that names ``source``."""
    try:
        # O_NONBLOCK: a FIFO put there is refused below instead of blocking the start; a symbolic link is followed
        # (a Kubernetes Secret volume's files are links into its ..data folder)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise CredentialsError(f"cannot read {source}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CredentialsError(f"{source} is not a regular file")
        check_credentials_mode(st, source)
        if st.st_size > MAX_CREDENTIALS_BYTES:
            raise CredentialsError(f"{source} is over {MAX_CREDENTIALS_BYTES} bytes: too large for credentials")
        data = os.read(fd, MAX_CREDENTIALS_BYTES + 1)
    except OSError as e:
        raise CredentialsError(f"cannot read {source}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsError(f"{source} is not UTF-8 text") from None
