"""``specproxy proxy``: put the recorder in front of an engine.

One module: the command's core options (where to listen, the upstream, the records, the relay's limits), their
checks and their translation into one :class:`~specproxy.proxy.config.ProxyConfig`, with the options of every addon
(:mod:`specproxy.proxy.addons`) added to the command as each declares them, and ``--config FILE``, which gives any of
them from a YAML file. The work is in :mod:`specproxy.proxy`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
import yaml
from typer._click.core import Context, ParameterSource
from typer._click.exceptions import UsageError
from typer._click.formatting import HelpFormatter
from typer._click.globals import get_current_context
from typer.core import TyperCommand

from specproxy.commands.common import CommandError, error_boundary, fail, parse_listen, run_async
from specproxy.commands.options import EngineOpt, KOpt, TokenizerOpt, check_engine
from specproxy.core.errors import shown_url
from specproxy.core.tokens import SERVER_TOKENIZER, TokenizerError, load_model_tokenizer
from specproxy.core.urls import http_url
from specproxy.core.workload_rules import Rule, RulesError, parse_rules
from specproxy.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM
from specproxy.proxy.addons import REGISTRY
from specproxy.proxy.addons.base import Addon, OptionError, SetupError
from specproxy.proxy.addons.base import Context as AddonContext
from specproxy.proxy.allocator import one_arena
from specproxy.proxy.config import (
    CREDENTIALS_ENV,
    CredentialsError,
    ProxyConfig,
    authorization_value,
    read_credentials_file,
)
from specproxy.proxy.workers import Ended, default_workers
from specproxy.recorder.recorder import RecorderConfig
from specproxy.recorder.sink import FILE_MODE, RecordSink

if TYPE_CHECKING:
    from specproxy.serving import Stopped

CAPTURES = ("none", "request", "full")


def check_url(value: str, what: str) -> str:
    url = http_url(value)
    if url is None:
        raise typer.BadParameter(f"{what} must be an http:// or https:// URL, got {value!r}")
    return url


def check_tokenizer(value: str | None) -> str | None:
    """``--tokenizer``: 'server', or a tokenizer that loads now (so a bad one is one line before anything starts)."""
    if value is None or value == SERVER_TOKENIZER:
        return value
    if not value.strip():
        raise typer.BadParameter("--tokenizer needs a tokenizer.json path, a folder, a cached model name or 'server'")
    try:
        load_model_tokenizer(value)
    except TokenizerError as e:
        fail(f"--tokenizer: {e}")
    return value


def tokenize_url(tokenizer: str | None, base: str) -> str | None:
    """Where --tokenizer server counts: the engine's own /tokenize (vLLM serves it at the root, not under /v1)."""
    return base + "/tokenize" if tokenizer == SERVER_TOKENIZER else None


def parse_size(value: str) -> int:
    v = value.strip().upper().removesuffix("B")
    mult = 1
    for suffix, m in (("K", 1024), ("M", 1024**2), ("G", 1024**3)):
        if v.endswith(suffix):
            v, mult = v[:-1], m
            break
    try:
        n = int(float(v) * mult)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a size like 64MB") from None
    if n <= 0:
        raise typer.BadParameter(f"size must be positive, got {value!r}")
    return n


def upstream_credentials(upstream: str, path: Path | None, *, in_argv: bool = True) -> str | None:
    """The upstream's Authorization field from ``$SPECPROXY_UPSTREAM_CREDENTIALS`` or ``--upstream-credentials-file``
    (None: neither; the user:password of the URL, if any, is then the relay's). One source only. The variable is
    taken out of the environment once read, so that no process the proxy starts inherits it. ``in_argv``: the URL
    came on the command line, which every local user can read (not from a ``--config`` file)."""
    env = os.environ.pop(CREDENTIALS_ENV, "")  # set but empty (compose's ${VAR} of an unset VAR): not given
    in_url = urlsplit(upstream).username is not None
    given = [
        name
        for name, there in (
            (f"${CREDENTIALS_ENV}", bool(env)),
            ("--upstream-credentials-file", path is not None),
            ("the user:password of --upstream", in_url),
        )
        if there
    ]
    if len(given) > 1:
        fail(f"the upstream's credentials come from one place, got {' and '.join(given)}")
    if in_url and in_argv:
        typer.echo(
            "specproxy proxy: warning: the user:password in --upstream is visible to every local user (ps, "
            f"/proc/PID/cmdline); give it in ${CREDENTIALS_ENV} or --upstream-credentials-file instead",
            err=True,
        )
    try:
        if path is not None:
            return read_credentials_file(str(path))
        if env:
            return authorization_value(env, f"${CREDENTIALS_ENV}")
    except CredentialsError as e:
        fail(str(e))
    return None


# -- --config FILE ---------------------------------------------------------------------------------------------------
CONFIG_HELP = (
    "A YAML file of options (KEY: VALUE, each KEY an option's name without the dashes, e.g. otlp-endpoint: "
    "http://collector:4318; a list for a repeatable option). Options given on the command line win. Secrets kept "
    "here stay out of the process list."
)
_NOT_FROM_FILE = frozenset({"config", "help"})


def _option_names(ctx: Context) -> dict[str, Any]:
    """Every option of the command by its name in a config file (``otlp-endpoint``), to its parameter."""
    names = {}
    for param in ctx.command.params:
        for opt in param.opts:
            if opt.startswith("--") and param.name not in _NOT_FROM_FILE:
                names[opt[2:]] = param
    return names


class _NotTaken(ValueError):
    """Why a config file's value is not taken (never the value itself, which may be a secret)."""


def _file_value(param: Any, value: object) -> object:
    """``value`` as the option takes it, or :class:`_NotTaken`."""
    if getattr(param, "multiple", False):
        return [_scalar(str, v) for v in (value if isinstance(value, list) else [value])]
    annotation = bool if getattr(param, "is_flag", False) else param.type_descriptor.annotation
    return _scalar(annotation, value)


def _scalar(annotation: object, value: object) -> object:
    if isinstance(value, dict | list):
        raise _NotTaken("expected one value, not a mapping or a list")
    if annotation is bool:
        if not isinstance(value, bool):
            raise _NotTaken("expected true or false")
        return value
    if isinstance(value, bool) or value is None:
        raise _NotTaken("expected a value" + (", not true or false" if value is not None else ""))
    if annotation is int:
        if not isinstance(value, int):
            raise _NotTaken("expected a whole number")
        return value
    if annotation is float:
        if not isinstance(value, int | float):
            raise _NotTaken("expected a number")
        return float(value)
    if isinstance(value, str | int | float):
        return str(value)
    raise _NotTaken(f"expected a text, got a {type(value).__name__}")


def read_config(ctx: typer.Context, path: Path | None) -> Path | None:
    """``--config FILE``: its options become the command's defaults (the command line overrides them). A file that
    cannot be read, is not a YAML mapping, names an unknown option or gives one a value of the wrong type is one line
    that names the file and the option, exit 2, and never shows a value."""
    if path is None:
        return None
    where = f"--config {path}"
    try:
        doc = yaml.safe_load(path.read_bytes())
    except OSError as e:
        raise UsageError(f"{where}: cannot read it: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{where}: not YAML{at}: {getattr(e, 'problem', None) or 'cannot be parsed'}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: expected a mapping of option names to values, got a {type(doc).__name__}")
    names = _option_names(ctx)
    defaults: dict[str, object] = {}
    for key, value in doc.items():
        param = names.get(str(key).replace("_", "-"))
        if param is None:
            raise UsageError(f"{where}: {key}: no such option of specproxy proxy")
        try:
            defaults[param.name] = _file_value(param, value)
        except _NotTaken as e:
            raise UsageError(f"{where}: {key}: {e}") from None
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


def _on_command_line(name: str) -> bool:
    """Whether the option ``name`` was given on the command line (every local user can read it there)."""
    ctx = get_current_context(silent=True)
    return ctx is None or ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE


# -- the addons' options ----------------------------------------------------------------------------------------------
class _GroupedHelp(TyperCommand):
    """``--help`` with the core options first, then each addon's under its group's heading."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        for title, rows in groups.items():
            with formatter.section(title):
                formatter.write_dl(rows)


def addon_parameters(addons: Sequence[type[Addon]]) -> list[inspect.Parameter]:
    """The addons' options as the command's parameters, each under its addon's group."""
    return [
        inspect.Parameter(
            opt.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=opt.default,
            annotation=Annotated[
                opt.type,
                typer.Option(opt.flag, help=opt.help, show_default=opt.show_default, rich_help_panel=addon.group),
            ],
        )
        for addon in addons
        for opt in addon.options
    ]


def with_addons(cfg: ProxyConfig, values: dict[str, Any], addons: Sequence[type[Addon]]) -> ProxyConfig:
    """``cfg`` holding each addon's settings, from its options' values (checked: a bad one is one line)."""
    ctx = AddonContext(
        upstream=cfg.upstream,
        warn=lambda line: typer.echo(f"specproxy proxy: warning: {line}", err=True),
        on_command_line=_on_command_line,
    )
    for addon in addons:
        try:
            settings = addon.configure({o.name: values[o.name] for o in addon.options}, ctx)
        except OptionError as e:
            raise typer.BadParameter(str(e)) from None
        except SetupError as e:
            fail(str(e))
        cfg = addon.with_settings(cfg, settings)
    return cfg


def register(app: typer.Typer, addons: Sequence[type[Addon]] = REGISTRY) -> None:
    def proxy(
        upstream: str = typer.Option(..., "--upstream", help="The engine's base URL, e.g. http://127.0.0.1:8000."),
        config: Path | None = typer.Option(
            None, "--config", metavar="FILE", is_eager=True, callback=read_config, help=CONFIG_HELP
        ),
        credentials_file: Path | None = typer.Option(
            None,
            "--upstream-credentials-file",
            help="A file (mode 0600, or 0640 owned by root) holding the upstream's credentials on one line: "
            f"user:password, a token (sent as Bearer), or Bearer TOKEN. Or set ${CREDENTIALS_ENV}; never put them "
            "in --upstream, which every local user can read.",
        ),
        listen: str = typer.Option("127.0.0.1:8080", "--listen", help="HOST:PORT to listen on (port 0: any free)."),
        record: str = typer.Option(
            "specproxy-records.jsonl", "--record", help="JSONL file of per-request records ('-' for none)."
        ),
        metrics_url: str = typer.Option(
            "", "--metrics-url", help="The engine's Prometheus endpoint (default UPSTREAM/metrics; 'none' to skip)."
        ),
        rules: Path | None = typer.Option(None, "--rules", help="JSON rules mapping requests to workloads."),
        label: str | None = typer.Option(None, "--label", help="Configuration label stored in every record."),
        capture: str = typer.Option("request", "--capture", help="What to keep of bodies: none, request, full."),
        capture_max: str = typer.Option(
            "1MB", "--capture-max-bytes", help="Larger request bodies are relayed but not parsed or captured."
        ),
        k: KOpt = None,
        tokenizer: TokenizerOpt = None,
        scrape_interval: float = typer.Option(0.25, "--scrape-interval", help="Seconds between scrapes in flight."),
        scrape_min_gap: float = typer.Option(
            0.1, "--scrape-min-gap", help="Floor between two scrapes, however many requests end (seconds)."
        ),
        attribution_hold: float = typer.Option(
            60.0,
            "--attribution-hold",
            help="Longest wait for the correction of a record whose counter share rests on a per-workload model "
            "(seconds; the record itself is written at once).",
        ),
        connect_timeout: float = typer.Option(10.0, "--connect-timeout", help="Seconds to connect upstream."),
        idle_timeout: float = typer.Option(600.0, "--idle-timeout", help="Seconds without an upstream byte."),
        max_body: str = typer.Option("64MB", "--max-body", help="Largest request body accepted (413 beyond)."),
        max_connections: int = typer.Option(0, "--max-connections", help="Upstream connection cap (0: none)."),
        drain_timeout: float = typer.Option(
            8.0,
            "--drain-timeout",
            help="Seconds streams get to finish on the first SIGTERM/SIGINT before they are cut (and recorded); "
            "keep it under the stop grace (docker stop -t, terminationGracePeriodSeconds).",
        ),
        client_header_timeout: float = typer.Option(
            60.0, "--client-header-timeout", help="Seconds a client has to send a whole request head."
        ),
        client_body_timeout: float = typer.Option(
            60.0, "--client-body-timeout", help="Seconds a request body may pause between two reads (408 beyond)."
        ),
        rotate_mb: int = typer.Option(256, "--rotate-mb", help="Rotate the record file past this size (0: never)."),
        rotate_keep: int = typer.Option(
            10, "--rotate-keep", help="Rotated record files kept; older ones are deleted, logged and counted (0: all)."
        ),
        record_buffer: str = typer.Option(
            "64MB", "--record-buffer", help="Memory for records waiting for the disk; past it they are lost, counted."
        ),
        fail_closed: bool = typer.Option(False, "--fail-closed", help="Refuse traffic (503) when records fail."),
        fast_lane: bool = typer.Option(
            True,
            "--fast-lane/--no-fast-lane",
            help="Read plainly formed POSTs and GETs with the relay's own front door (less CPU per request); off: "
            "aiohttp's server reads every request.",
        ),
        workers: int | None = typer.Option(
            None,
            "--workers",
            help="Relay processes sharing the port, beside one bookkeeping process (default: one per core, at most "
            "8; 0: one process, bookkeeping on the relay's loop).",
            show_default=False,
        ),
        bookkeeping_buffer: str = typer.Option(
            "8MB",
            "--bookkeeping-buffer",
            help="Events a relay holds for the bookkeeping; past it chunk events are shed (records flagged).",
        ),
        log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error."),
        engine: EngineOpt = "auto",
        **addon_values: Any,
    ) -> None:
        """Transparent recording proxy in front of vLLM (or any OpenAI-compatible engine)."""
        up = check_url(upstream, "--upstream")
        authorization = upstream_credentials(up, credentials_file, in_argv=_on_command_line("upstream"))
        check_engine(engine)
        host, port = parse_listen(listen)
        if capture not in CAPTURES:
            raise typer.BadParameter(f"--capture must be one of {', '.join(CAPTURES)}, got {capture!r}")
        if metrics_url.lower() == "none":
            murl = None
        else:
            murl = check_url(metrics_url, "--metrics-url") if metrics_url else up + "/metrics"
        for name, value in (
            ("--scrape-interval", scrape_interval),
            ("--scrape-min-gap", scrape_min_gap),
            ("--connect-timeout", connect_timeout),
            ("--idle-timeout", idle_timeout),
            ("--client-header-timeout", client_header_timeout),
            ("--client-body-timeout", client_body_timeout),
        ):
            if value <= 0:
                raise typer.BadParameter(f"{name} must be positive, got {value}")
        if drain_timeout < 0 or max_connections < 0 or rotate_mb < 0 or attribution_hold < 0:
            raise typer.BadParameter(
                "--drain-timeout, --max-connections, --rotate-mb and --attribution-hold cannot be negative"
            )
        if workers is not None and not 0 <= workers <= 256:
            raise typer.BadParameter(f"--workers must be between 0 and 256, got {workers}")
        if rotate_keep < 0:
            raise typer.BadParameter(f"--rotate-keep cannot be negative, got {rotate_keep}")
        if k is not None and k < 1:
            raise typer.BadParameter(f"--k must be at least 1, got {k}")
        if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise typer.BadParameter(f"--log-level must be debug, info, warning or error, got {log_level!r}")
        parsed_rules: tuple[Rule, ...] = ()
        if rules is not None:
            try:
                parsed_rules = parse_rules(rules.read_bytes(), str(rules))
            except OSError as e:
                fail(f"cannot read rules file {rules}: {e.strerror}")
            except RulesError as e:
                fail(str(e))
        max_body_bytes = parse_size(max_body)  # every option is checked before anything touches the disk
        record_buffer_bytes = parse_size(record_buffer)
        capture_max_bytes = parse_size(capture_max)
        bookkeeping_buffer_bytes = parse_size(bookkeeping_buffer)
        tokenizer = check_tokenizer(tokenizer)
        record_path = None if record == "-" else record
        cfg = ProxyConfig(
            upstream=up,
            host=host,
            port=port,
            recorder=RecorderConfig(
                record_path=record_path,
                metrics_url=murl,
                label=label,
                capture=capture,
                capture_max_bytes=capture_max_bytes,
                k=k,
                scrape_interval_s=scrape_interval,
                scrape_min_gap_s=scrape_min_gap,
                calibration_hold_s=attribution_hold,
                rotate_bytes=rotate_mb * 1024 * 1024,
                rotate_keep=rotate_keep,
                max_pending_bytes=record_buffer_bytes,
                tokenizer=tokenizer,
                tokenize_url=tokenize_url(tokenizer, up),
                engine=engine,
                probe_url=up,
            ),
            rules=parsed_rules,
            connect_timeout_s=connect_timeout,
            idle_timeout_s=idle_timeout,
            max_body_bytes=max_body_bytes,
            max_connections=max_connections,
            drain_timeout_s=drain_timeout,
            fail_closed=fail_closed,
            fast_lane=fast_lane,
            client_header_timeout_s=client_header_timeout,
            client_body_timeout_s=client_body_timeout,
            bookkeeping_buffer_bytes=bookkeeping_buffer_bytes,
            workers=default_workers() if workers is None else workers,
            upstream_authorization=authorization,
        )
        cfg = with_addons(cfg, addon_values, addons)
        if record_path is not None:
            try:
                Path(record_path).parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE))
            except OSError as e:
                fail(f"cannot write records to {record_path}: {e.strerror}")
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        one_arena()  # before any thread or fork: every process of the proxy frees into the arena it allocates from
        if cfg.workers == 0:
            from specproxy.proxy.memtrace import traced

            run_async(traced(_main(cfg), "proxy"))
        else:
            _run_workers(cfg)

    core = [p for p in inspect.signature(proxy, eval_str=True).parameters.values() if p.kind != p.VAR_KEYWORD]
    proxy.__signature__ = inspect.Signature([*core, *addon_parameters(addons)])  # type: ignore[attr-defined]

    @functools.wraps(proxy)  # typer reads the options from the signature and the help from the docstring
    def bounded(**values: Any) -> None:
        with error_boundary():
            proxy(**values)

    app.command("proxy", cls=_GroupedHelp)(bounded)


async def _main(cfg: ProxyConfig) -> None:
    """Serve until SIGTERM / SIGINT. The first signal stops accepting and lets the requests in flight finish for up
    to ``--drain-timeout``; a second signal, or the end of that time, cuts those left (recorded with outcome
    ``shutdown``). Every record is written either way; a third signal only says so (SIGKILL ends it at once)."""
    import asyncio
    import contextlib

    from specproxy.proxy.server import start_proxy
    from specproxy.serving import Cut, bound_ports, stop_signals

    try:
        handle = await start_proxy(cfg)
    except OSError as e:
        raise CommandError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}", EXIT_FAILURE) from None
    log = logging.getLogger("specproxy.proxy")
    stop = asyncio.Event()
    cut = Cut()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if not stop.is_set():
            log.warning(
                "%s: stopping; %d requests in flight get up to %g s to finish (a second signal cuts them)",
                name,
                handle.in_flight,
                cfg.drain_timeout_s,
            )
            stop.set()
        elif not cut.event.is_set():
            log.warning("%s again: cutting %d requests in flight; their records are written", name, handle.in_flight)
            cut.now(f"a second signal ({name})", signum)
        else:
            log.warning("%s: already stopping, writing the last records (SIGKILL ends the process now)", name)

    def on_hup() -> None:  # logrotate: the sink opens the file by name for each append, so the next goes there
        log.warning("SIGHUP: the record file is reopened: the next records go to a file by its name now")

    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    with stop_signals(on_signal):
        where = ", ".join(f"http://{cfg.host}:{p}" for p in bound_ports(handle.runner))
        typer.echo(f"specproxy proxy: {where} -> {shown_url(cfg.upstream)}", err=True)  # once a signal stops it cleanly
        try:
            await stop.wait()
        finally:
            stopped = await handle.close(cut)
    raise typer.Exit(_exit_code(stopped, handle.recorder.sink))


def _exit_code(stopped: Stopped, sink: RecordSink) -> int:
    """0 when every record was written, after a drain or a cut by the drain timeout (the configured way to stop);
    128 + the signal (130, 143) when a second signal cut streams, as for a process that signal ended, records
    written all the same; 1 when records could not be written, whatever the stop."""
    if stopped.cut:
        typer.echo(
            f"specproxy proxy: {stopped.cut} requests cut by {stopped.cut_reason}: recorded with outcome shutdown",
            err=True,
        )
    if sink.dropped:
        raise CommandError(
            f"{sink.dropped} records were lost (not written to {sink.path}; {sink.written} written)", EXIT_FAILURE
        )
    if stopped.signum is not None:
        return EXIT_SIGINT if stopped.signum == signal.SIGINT else EXIT_SIGTERM
    return EXIT_OK


def _run_workers(cfg: ProxyConfig) -> None:
    """``--workers N``: the relays and the bookkeeper in processes of their own (:mod:`specproxy.proxy.workers`),
    stopped as :func:`_main` stops the one-process proxy, with the same exit codes."""
    from specproxy.proxy import supervisor, workers
    from specproxy.proxy.memtrace import traced

    try:
        procs = workers.start(cfg, cfg.workers)
    except OSError as e:
        raise CommandError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}", EXIT_FAILURE) from None

    def ready(port: int) -> None:
        n = cfg.workers
        relays = f"{n} relay{'s' if n > 1 else ''}"
        typer.echo(f"specproxy proxy: http://{cfg.host}:{port} -> {shown_url(cfg.upstream)} ({relays})", err=True)

    ended = run_async(traced(supervisor.supervise(procs, cfg.drain_timeout_s, ready), "main"))
    raise typer.Exit(_workers_exit_code(ended))


def _workers_exit_code(ended: Ended) -> int:
    try:
        return _workers_exit(ended)
    except CommandError as e:  # one line: why the proxy stopped (a process that kept dying), then what was lost
        if ended.failure is not None and str(e) != ended.failure:
            raise CommandError(f"{ended.failure}; {e}", EXIT_FAILURE) from None
        raise


def _workers_exit(ended: Ended) -> int:
    if ended.cut:
        typer.echo(
            f"specproxy proxy: {ended.cut} requests cut by {ended.cut_reason}: recorded with outcome shutdown", err=True
        )
    if ended.lost and set(ended.lost_by) == {"sink"}:
        raise CommandError(
            f"{ended.lost} records were lost (not written to {ended.record_path}; {ended.written} written)",
            EXIT_FAILURE,
        )
    if ended.lost:  # lost = finished - written, exactly: each cause counted where it happened
        causes = ", ".join(f"{cause}: {n}" for cause, n in sorted(ended.lost_by.items()))
        raise CommandError(
            f"{ended.lost} records were lost ({causes}): {ended.finished} requests finished, {ended.written} "
            f"records written",
            EXIT_FAILURE,
        )
    if ended.dropped:
        raise CommandError(
            f"{ended.dropped} records were lost (not written to {ended.record_path}; {ended.written} written)",
            EXIT_FAILURE,
        )
    if ended.failure is not None:
        raise CommandError(ended.failure, EXIT_FAILURE)
    if ended.signum is not None:
        return EXIT_SIGINT if ended.signum == signal.SIGINT else EXIT_SIGTERM
    return EXIT_OK
