"""The upstream's credentials without the command line: ``$SPECPROXY_UPSTREAM_CREDENTIALS`` and
``--upstream-credentials-file`` (its permissions checked), the forms they may take, and that the credential reaches
the upstream, for relayed requests and the bookkeeping's own, while it is nowhere else: not in the process list
(/proc/PID/cmdline, every local user's to read), the proxy's output, its records or its own endpoints."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specproxy.proxy.config import (
    CREDENTIALS_ENV,
    CredentialsError,
    authorization_value,
    check_credentials_mode,
    read_credentials_file,
)
from tests.proxyutil import raw_exchange, started_proxy
from tests.upstreams import content_length

SECRET = "Zq7-upstream-s3cret-41"
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files owned by root and by another user")
OTHER_UID = 65534  # nobody: a second local user, with no entry needed in /etc/passwd for setresuid


# -- the forms -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [
        (f"bob:{SECRET}\n", "Basic " + base64.b64encode(f"bob:{SECRET}".encode()).decode()),
        ("bob:pass word with spaces ", "Basic " + base64.b64encode(b"bob:pass word with spaces ").decode()),
        ("b\u00f6b:p\u00e4ss", "Basic " + base64.b64encode("b\u00f6b:p\u00e4ss".encode()).decode()),  # RFC 7617 UTF-8
        (f"{SECRET}\n", f"Bearer {SECRET}"),  # a bare token: vLLM's --api-key
        (f"  {SECRET}  \r\n", f"Bearer {SECRET}"),
        (f"Bearer {SECRET}", f"Bearer {SECRET}"),
        ("bearer abc:def", "bearer abc:def"),  # a token may hold a colon after a known scheme
        ("Basic Ym9iOnB3", "Basic Ym9iOnB3"),
        (f"Authorization: ApiKey {SECRET}\n", f"ApiKey {SECRET}"),  # a header line: any scheme
        (f"authorization:Token {SECRET}", f"Token {SECRET}"),
        (f"Token {SECRET}", f"Token {SECRET}"),
    ],
)
def test_the_forms_credentials_may_take(text: str, value: str) -> None:
    assert authorization_value(text, "X") == value


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "is empty"),
        ("\n\n", "is empty"),
        (f"bob:{SECRET}\nother", "more than one line"),
        (f"Bearer {SECRET}\r\nX-Injected: 1", "more than one line"),
        (f"{SECRET}\x00", "control character"),
        (f":{SECRET}", "no user name"),
        ("Bearer", "without its credentials"),
        (f"Bearer {SECRET}\u00e9", "printable ASCII"),
        ("Authorization:", "expected user:password"),
    ],
)
def test_unusable_credentials_are_refused_without_showing_them(text: str, needle: str) -> None:
    with pytest.raises(CredentialsError) as e:
        authorization_value(text, "X")
    assert needle in str(e.value) and SECRET not in str(e.value) and "\n" not in str(e.value)


# -- the file's permissions ----------------------------------------------------------------------------------------
def _credentials_file(folder: Path, mode: int, text: str = f"bob:{SECRET}\n") -> Path:
    path = folder / "upstream.credentials"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_file_only_its_owner_reads_is_taken(tmp_path: Path, mode: int) -> None:
    path = _credentials_file(tmp_path, mode)
    assert read_credentials_file(str(path)).startswith("Basic ")


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620, 0o660, 0o666, 0o444])
def test_a_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _credentials_file(tmp_path, mode)
    with pytest.raises(CredentialsError) as e:
        read_credentials_file(str(path))
    assert f"mode {mode:04o}" in str(e.value) and SECRET not in str(e.value), e.value


def _stat(uid: int, mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, 0, 10, 0, 0, 0))


@pytest.mark.parametrize(
    ("uid", "mode", "ok"),
    [
        (os.geteuid(), 0o600, True),
        (os.geteuid(), 0o400, True),
        (0, 0o640, True),  # root's file for a service's group: a Kubernetes Secret with defaultMode 0440 and fsGroup
        (0, 0o440, True),
        (0, 0o644, False),  # a Kubernetes Secret's default mode: every user of the machine may read it
        (0, 0o444, False),
        (0, 0o660, False),  # the group may change it
        (12345, 0o600, False),  # someone else's file: they could change what the proxy sends
        (-1, 0o640, False),  # this user's own file, group-readable (-1: this user, when it is not root)
    ],
)
def test_the_mode_rule(uid: int, mode: int, ok: bool) -> None:
    if uid == -1:
        if os.geteuid() == 0:
            pytest.skip("this user is root, whose files follow the root rule")
        uid = os.geteuid()
    st = _stat(uid, mode)
    if ok:
        check_credentials_mode(st, "F")
    else:
        with pytest.raises(CredentialsError):
            check_credentials_mode(st, "F")


def test_what_is_not_a_credentials_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    large = tmp_path / "large"
    large.write_text("x" * 20_000)
    large.chmod(0o600)
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(b"bob:p\xe4ss")
    latin1.chmod(0o600)
    for path, needle in (
        (fifo, "not a regular file"),  # refused at once: no writer is waited for
        (tmp_path, "not a regular file"),
        (tmp_path / "absent", "No such file"),
        (large, "over"),
        (latin1, "not UTF-8"),
    ):
        with pytest.raises(CredentialsError) as e:
            read_credentials_file(str(path))
        assert needle in str(e.value), e.value


# -- the command line ----------------------------------------------------------------------------------------------
def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != CREDENTIALS_ENV} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "specproxy", "proxy", "--record", "-", "--listen", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=environ,
        cwd=tempfile.gettempdir(),
    )


def test_bad_credentials_are_one_line_exit_2(tmp_path: Path) -> None:
    open_file = _credentials_file(tmp_path, 0o644 if os.geteuid() else 0o646)
    (tmp_path / "two").write_text(f"bob:{SECRET}\nx\n")
    (tmp_path / "two").chmod(0o600)
    cases: list[tuple[tuple[str, ...], dict[str, str] | None, str]] = [
        (("--upstream", "http://127.0.0.1:9", "--upstream-credentials-file", str(open_file)), None, "mode 06"),
        (("--upstream", "http://127.0.0.1:9", "--upstream-credentials-file", str(tmp_path / "two")), None, "one line"),
        (("--upstream", "http://127.0.0.1:9", "--upstream-credentials-file", str(tmp_path / "no")), None, "No such"),
        (("--upstream", "http://127.0.0.1:9"), {CREDENTIALS_ENV: f"Bearer {SECRET}\nX: y"}, "one line"),
        (
            ("--upstream", "http://127.0.0.1:9", "--upstream-credentials-file", str(tmp_path / "two")),
            {CREDENTIALS_ENV: SECRET},
            "one place",
        ),
        (("--upstream", f"http://bob:{SECRET}@127.0.0.1:9"), {CREDENTIALS_ENV: SECRET}, "one place"),
    ]
    for args, env, needle in cases:
        p = _cli(*args, env=env)
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert needle in p.stderr and SECRET not in p.stderr, p.stderr


# -- end to end: the upstream gets it, nothing else shows it -------------------------------------------------------
@dataclass
class HeadsUpstream:
    """An upstream that keeps every request head it is sent and answers each with a small 200."""

    url: str
    heads: list[bytes] = field(default_factory=list)

    def authorizations(self, path_start: bytes) -> list[bytes]:
        out = []
        for head in self.heads:
            line, *fields = head.split(b"\r\n")
            if line.split(b" ")[1].startswith(path_start):
                got = [f.split(b":", 1)[1].strip() for f in fields if f.lower().startswith(b"authorization:")]
                out.append(got[0] if got else b"")
        return out


@asynccontextmanager
async def heads_upstream() -> AsyncIterator[HeadsUpstream]:
    up = HeadsUpstream("")

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                up.heads.append(head)
                await reader.readexactly(content_length(head))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    up.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield up
    finally:
        server.close()
        await server.wait_closed()


@dataclass
class ProxyProcess:
    url: str
    proc: asyncio.subprocess.Process

    def pids(self) -> list[int]:
        """The proxy's process and its children (relays, bookkeeper)."""
        out = [self.proc.pid]
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            children = task / "children"  # a kernel without CONFIG_PROC_CHILDREN has none: the main process only
            out += [int(p) for p in children.read_text().split()] if children.exists() else []
        return out


@asynccontextmanager
async def proxy_process(
    upstream: str, record: Path, *args: str, env: dict[str, str] | None = None, user: int | None = None
) -> AsyncIterator[ProxyProcess]:
    environ = {k: v for k, v in os.environ.items() if k != CREDENTIALS_ENV} | (env or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0",
        "--record", str(record), "--workers", "1", *args,
        stderr=asyncio.subprocess.PIPE, env=environ, user=user, group=user, extra_groups=[] if user else None,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert line.startswith(b"specproxy proxy: http://"), line
        yield ProxyProcess(line.split()[2].decode(), proc)
    finally:
        if proc.returncode is None:
            proc.terminate()
        rest = await asyncio.wait_for(proc.stderr.read(), 30)
        await proc.wait()
        assert SECRET.encode() not in line + rest, rest  # nothing the proxy wrote shows it


async def _until(cond: Callable[[], object], what: str, within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _secret_forms(text: str) -> list[bytes]:
    """The secret, and the field value it becomes (base64 of user:password for Basic)."""
    value = authorization_value(text, "X")
    return [SECRET.encode(), value.encode(), value.split(" ", 1)[1].encode()]


async def _check_end_to_end(tmp_path: Path, text: str, how: str) -> None:
    record = tmp_path / "records.jsonl"
    expected = authorization_value(text, "X").encode()
    forms = _secret_forms(text)
    async with heads_upstream() as up:
        if how == "file":
            path = _credentials_file(tmp_path, 0o600, text)
            px_cm = proxy_process(up.url, record, "--upstream-credentials-file", str(path))
        else:
            px_cm = proxy_process(up.url, record, env={CREDENTIALS_ENV: text})
        async with px_cm as px:
            for pid in px.pids():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()  # noqa: ASYNC240  # procfs: never blocks
                assert b"specproxy" in cmdline and not any(f in cmdline for f in forms), cmdline
            got = await raw_exchange(
                px.url,
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            )
            assert got.startswith(b"HTTP/1.1 200"), got
            # a request that brings its own Authorization keeps it
            await raw_exchange(
                px.url,
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer client-own\r\nConnection: close\r\n\r\n",
            )
            # the bookkeeping's requests (the engine's /metrics) carry it too
            await _until(lambda: up.authorizations(b"/metrics"), "a scrape of /metrics")
            own = b""
            for target in (b"/specproxy/status", b"/specproxy/metrics"):
                own += await raw_exchange(
                    px.url, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
            assert b"in_flight" in own and not any(f in own for f in forms)
        assert up.authorizations(b"/v1/chat/completions") == [expected]
        assert up.authorizations(b"/v1/models") == [b"Bearer client-own"]
        assert set(up.authorizations(b"/metrics")) == {expected}
        # and every other request of the bookkeeping (--engine auto's probe of the engine) too
        assert set(up.authorizations(b"/")) - {b"Bearer client-own"} == {expected}
        records = record.read_bytes()
        assert b"/v1/chat/completions" in records and not any(f in records for f in forms)


@pytest.mark.parametrize("text", [f"bob:{SECRET}\n", f"{SECRET}\n", f"Authorization: Bearer {SECRET}"])
async def test_the_file_reaches_the_upstream_and_nothing_else(tmp_path: Path, text: str) -> None:
    await _check_end_to_end(tmp_path, text, "file")


async def test_the_environment_variable_reaches_the_upstream_and_nothing_else(tmp_path: Path) -> None:
    await _check_end_to_end(tmp_path, f"bob:{SECRET}", "env")


async def test_a_metrics_url_elsewhere_gets_no_credentials(tmp_path: Path) -> None:
    async with heads_upstream() as up, heads_upstream() as elsewhere:
        path = _credentials_file(tmp_path, 0o600, SECRET)
        async with proxy_process(
            up.url, tmp_path / "r.jsonl", "--upstream-credentials-file", str(path), "--metrics-url",
            elsewhere.url + "/metrics",
        ) as px:  # fmt: skip
            await raw_exchange(px.url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await _until(lambda: elsewhere.authorizations(b"/metrics"), "a scrape of the other host")
        assert up.authorizations(b"/v1/models") == [f"Bearer {SECRET}".encode()]
        assert set(elsewhere.authorizations(b"/metrics")) == {b""}


# -- a second local user ---------------------------------------------------------------------------------------
def _as_other_user(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        list(argv), user=OTHER_UID, group=OTHER_UID, extra_groups=[], capture_output=True, timeout=30, cwd="/"
    )


@AS_ROOT
async def test_another_user_sees_the_process_list_but_not_the_credential(tmp_path: Path) -> None:
    """What a second local user of the machine can read of a running proxy: its command line (no credential in
    it), not its environment, not the credentials file."""
    cat = shutil.which("cat")
    assert cat is not None
    path = _credentials_file(tmp_path, 0o600, f"bob:{SECRET}")
    async with heads_upstream() as up:
        for args, env in (((), {CREDENTIALS_ENV: f"bob:{SECRET}"}), (("--upstream-credentials-file", str(path)), None)):
            async with proxy_process(up.url, tmp_path / "r.jsonl", *args, env=env) as px:
                seen = _as_other_user(cat, f"/proc/{px.proc.pid}/cmdline")
                assert seen.returncode == 0 and b"specproxy" in seen.stdout and SECRET.encode() not in seen.stdout
                environ = _as_other_user(cat, f"/proc/{px.proc.pid}/environ")
                assert environ.returncode != 0 and SECRET.encode() not in environ.stdout
        denied = _as_other_user(cat, str(path))
        assert denied.returncode != 0 and b"Permission denied" in denied.stderr


@AS_ROOT
def test_root_rules_on_real_files(tmp_path: Path) -> None:
    """As root: root's file may be group-readable (0640, a Kubernetes Secret with fsGroup), not world-readable
    (0644, the default defaultMode); a file of another user is refused."""
    path = _credentials_file(tmp_path, 0o640)
    os.chown(path, 0, OTHER_UID)
    assert read_credentials_file(str(path)).startswith("Basic ")
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="open to other users"):
        read_credentials_file(str(path))
    path.chmod(0o600)
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(CredentialsError, match=f"belongs to uid {OTHER_UID}"):
        read_credentials_file(str(path))
    # a Kubernetes Secret volume: the file is a link into ..data, and its target's mode counts
    (tmp_path / "..data").mkdir()
    target = _credentials_file(tmp_path / "..data", 0o440)
    link = tmp_path / "token"
    link.symlink_to(Path("..data") / target.name)
    assert read_credentials_file(str(link)).startswith("Basic ")
    target.chmod(0o444)
    with pytest.raises(CredentialsError, match="mode 0444"):
        read_credentials_file(str(link))


@AS_ROOT
async def test_a_service_user_reads_roots_file_through_its_group(tmp_path: Path) -> None:
    """The proxy as an unprivileged user, its credentials a root-owned file of that user's group (0640), as a
    Kubernetes Secret with fsGroup mounts it."""
    try:
        probe = _as_other_user(sys.executable, "-c", "import specproxy")
        why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] if probe.returncode else None
    except OSError as e:
        why = [str(e)]
    if why is not None:
        pytest.skip(f"uid {OTHER_UID} cannot run this interpreter and checkout: {why}")
    folder = Path(tempfile.mkdtemp())
    try:
        os.chmod(folder, 0o755)
        path = _credentials_file(folder, 0o640, SECRET)
        os.chown(path, 0, OTHER_UID)
        async with heads_upstream() as up:
            async with proxy_process(up.url, Path("-"), "--upstream-credentials-file", str(path), user=OTHER_UID) as px:
                await raw_exchange(px.url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert up.authorizations(b"/v1/models") == [f"Bearer {SECRET}".encode()]
    finally:
        shutil.rmtree(folder)


# -- the URL's user:password, as before ----------------------------------------------------------------------------
async def test_the_urls_user_password_still_works_and_is_warned_about(tmp_path: Path) -> None:
    async with heads_upstream() as up:
        url = up.url.replace("http://", f"http://b%C3%B6b:{SECRET}@")  # percent-encoded in the URL, UTF-8 sent
        async with started_proxy(url, tmp_path) as px:
            await raw_exchange(px.url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert up.authorizations(b"/v1/models") == [authorization_value(f"b\u00f6b:{SECRET}", "X").encode()]
    p = _cli("--upstream", f"http://bob:{SECRET}@127.0.0.1:9", "--rules", "/nonexistent/rules.json")
    assert p.returncode == 2 and "visible to every local user" in p.stderr and SECRET not in p.stderr, p.stderr
