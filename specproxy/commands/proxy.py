"""``specproxy proxy``: put the recorder in front of an engine.

One module: the command's options, each with its help text, their checks and their translation into one
:class:`~specproxy.proxy.config.ProxyConfig`; the work is in :mod:`specproxy.proxy`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import typer

from specproxy.analysis.figures.slo import parse_slo
from specproxy.commands.common import CommandError, command, fail, parse_listen, run_async
from specproxy.commands.options import EngineOpt, KOpt, TokenizerOpt, check_engine
from specproxy.core.errors import shown_url
from specproxy.core.tokens import SERVER_TOKENIZER, TokenizerError, load_model_tokenizer
from specproxy.core.urls import http_url
from specproxy.core.workload_rules import Rule, RulesError, parse_rules
from specproxy.exitcodes import EXIT_FAILURE, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM
from specproxy.proxy.allocator import one_arena
from specproxy.proxy.config import (
    CREDENTIALS_ENV,
    CredentialsError,
    ProxyConfig,
    authorization_value,
    read_credentials_file,
    read_secret_file,
)
from specproxy.proxy.shadow import ShadowConfig, parse_target
from specproxy.proxy.workers import Ended, default_workers
from specproxy.recorder.config import OtlpConfig
from specproxy.recorder.live_bands import parse_schedule
from specproxy.recorder.otlp import PROTOCOLS, OtlpConfigError, parse_headers, parse_resource, traces_url
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


def upstream_credentials(upstream: str, path: Path | None) -> str | None:
    """The upstream's Authorization field from ``$SPECPROXY_UPSTREAM_CREDENTIALS`` or ``--upstream-credentials-file``
    (None: neither; the user:password of the URL, if any, is then the relay's). One source only. The variable is
    taken out of the environment once read, so that no process the proxy starts inherits it."""
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
    if in_url:
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


# Header names whose values are usually secrets: given with --otlp-header, every local user can read them (ps)
_SECRET_HEADER_RE = re.compile(r"authorization|cookie|key|token|secret|password|signature", re.IGNORECASE)


def otlp_config(
    endpoint: str | None, protocol: str | None, header: list[str], headers_file: Path | None, upstream: str
) -> OtlpConfig | None:
    """The span export's settings, from the options and the standard OpenTelemetry variables (docs/otel.md): on
    with ``--otlp-endpoint``, or with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT set (unless
    OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none). The headers' variables are taken out of the environment
    once read, as the upstream's credentials are."""
    env = os.environ
    env_headers = env.pop("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "") or env.pop("OTEL_EXPORTER_OTLP_HEADERS", "")
    env.pop("OTEL_EXPORTER_OTLP_HEADERS", None)
    env_off = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or (
        env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
    )
    if endpoint is not None:
        url = traces_url(check_url(endpoint, "--otlp-endpoint"))
    elif not env_off and (full := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()):
        url = traces_url(check_url(full, "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), full=True)
    elif not env_off and (base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()):
        url = traces_url(check_url(base, "$OTEL_EXPORTER_OTLP_ENDPOINT"))
    else:
        if header or headers_file is not None or protocol is not None:
            raise typer.BadParameter("--otlp-protocol, --otlp-header and --otlp-headers-file need --otlp-endpoint")
        return None
    proto = (
        protocol
        or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "http/protobuf"
    )
    if proto not in PROTOCOLS:
        raise typer.BadParameter(f"--otlp-protocol must be http/protobuf or http/json (no grpc), got {proto!r}")
    pairs: list[tuple[str, str]] = []
    try:
        if env_headers:
            pairs += parse_headers(env_headers, "$OTEL_EXPORTER_OTLP_HEADERS")
        if headers_file is not None:
            source = f"--otlp-headers-file {headers_file}"
            pairs += parse_headers(read_secret_file(str(headers_file), source), source)
        for h in header:
            given = parse_headers(h, "--otlp-header")
            if any(_SECRET_HEADER_RE.search(k) for k, _ in given):
                typer.echo(
                    "specproxy proxy: warning: --otlp-header values are visible to every local user (ps, "
                    "/proc/PID/cmdline); give secrets in $OTEL_EXPORTER_OTLP_HEADERS or --otlp-headers-file",
                    err=True,
                )
            pairs += given
    except (OtlpConfigError, CredentialsError) as e:
        fail(str(e))
    if any(k.lower() in ("content-type", "content-length", "host") for k, _ in pairs):
        fail("OTLP headers cannot set Content-Type, Content-Length or Host")
    up = urlsplit(upstream)
    return OtlpConfig(
        traces_url=url,
        protocol=proto,
        headers=tuple(pairs),
        service_name=env.get("OTEL_SERVICE_NAME", "").strip() or "specproxy",
        resource=parse_resource(env.get("OTEL_RESOURCE_ATTRIBUTES", "")),
        server_address=up.hostname,
        server_port=up.port or (443 if up.scheme == "https" else 80),
    )


def register(app: typer.Typer) -> None:
    @command(app, "proxy")
    def proxy(
        upstream: str = typer.Option(..., "--upstream", help="The engine's base URL, e.g. http://127.0.0.1:8000."),
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
            help="Longest wait of a record whose counter share rests on the per-workload model (seconds).",
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
        slo: list[str] | None = typer.Option(
            None,
            "--slo",
            help="ttft=500ms,tpot=50ms,e2e=30s (WORKLOAD:... too): live attainment and goodput in status.",
        ),
        otlp_endpoint: str | None = typer.Option(
            None,
            "--otlp-endpoint",
            help="Export a span per inference request over OTLP/HTTP to this base URL (spans go to URL/v1/traces); "
            "default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else off.",
            show_default=False,
        ),
        otlp_protocol: str | None = typer.Option(
            None, "--otlp-protocol", help="http/protobuf (default) or http/json.", show_default=False
        ),
        otlp_header: list[str] | None = typer.Option(
            None,
            "--otlp-header",
            help="KEY=VALUE sent with every export (repeatable); for secrets use $OTEL_EXPORTER_OTLP_HEADERS or "
            "--otlp-headers-file, which no other user can read.",
        ),
        otlp_headers_file: Path | None = typer.Option(
            None,
            "--otlp-headers-file",
            help="A file (mode 0600) of KEY=VALUE lines sent with every export, e.g. an API key.",
        ),
        advise_every: float = typer.Option(
            60.0,
            "--advise-every",
            help="Seconds between refreshes of the live advice (the k that pays off now, per workload, in "
            "/specproxy/status and specproxy_recommended_k); 0: off.",
        ),
        advise_window: float = typer.Option(
            600.0, "--advise-window", help="Seconds of live records the advice is computed from."
        ),
        speculative_config: str | None = typer.Option(
            None,
            "--speculative-config",
            help="The JSON given to vllm serve --speculative-config (or its num_speculative_tokens_per_batch_size "
            "list): the live advice checks per band of requests in flight that the engine runs the k it schedules.",
        ),
        shadow: list[str] | None = typer.Option(
            None,
            "--shadow",
            help="LABEL=URL: a candidate server (same model, another speculative configuration) that also gets a "
            "share of live requests; compared per workload in /specproxy/status (repeatable; docs/shadow.md).",
        ),
        shadow_share: float = typer.Option(0.05, "--shadow-share", help="Share of live requests shadowed (0-1)."),
        shadow_max_inflight: int = typer.Option(
            4, "--shadow-max-inflight", help="Shadows in flight per candidate at most; past it, none is sent."
        ),
        shadow_seed: int = typer.Option(0, "--shadow-seed", help="Seed of the draw of shadowed requests."),
        shadow_timeout: float = typer.Option(
            300.0, "--shadow-timeout", help="Seconds without a byte from a candidate before a shadow is given up."
        ),
        shadow_workload: list[str] | None = typer.Option(
            None, "--shadow-workload", help="Shadow only this workload's requests (repeatable; default: all)."
        ),
        shadow_credentials: list[str] | None = typer.Option(
            None,
            "--shadow-credentials-file",
            help="LABEL=PATH: the Authorization a candidate's shadows carry, from a file as "
            "--upstream-credentials-file reads it (repeatable).",
        ),
    ) -> None:
        """Transparent recording proxy in front of vLLM (or any OpenAI-compatible engine)."""
        up = check_url(upstream, "--upstream")
        authorization = upstream_credentials(up, credentials_file)
        otlp = otlp_config(otlp_endpoint, otlp_protocol, otlp_header or [], otlp_headers_file, up)
        check_engine(engine)
        shadow_cfg = shadow_config(shadow or [], shadow_share, shadow_max_inflight, shadow_seed, shadow_timeout,
                                   shadow_workload or [], shadow_credentials or [])  # fmt: skip
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
        if advise_every < 0 or advise_window <= 0:
            raise typer.BadParameter("--advise-every cannot be negative, and --advise-window must be positive")
        schedule = None
        if speculative_config is not None:
            if advise_every == 0:
                raise typer.BadParameter("--speculative-config needs the live advice (--advise-every > 0)")
            try:
                schedule = parse_schedule(speculative_config)
            except ValueError as e:
                raise typer.BadParameter(f"--speculative-config: {e}") from None
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
        try:
            slo_spec = parse_slo(slo or [])
        except ValueError as e:
            fail(str(e))
        max_body_bytes = parse_size(max_body)  # every option is checked before anything touches the disk
        record_buffer_bytes = parse_size(record_buffer)
        capture_max_bytes = parse_size(capture_max)
        bookkeeping_buffer_bytes = parse_size(bookkeeping_buffer)
        tokenizer = check_tokenizer(tokenizer)
        record_path = None if record == "-" else record
        if record_path is not None:
            try:
                Path(record_path).parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE))
            except OSError as e:
                fail(f"cannot write records to {record_path}: {e.strerror}")
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
            slo=slo_spec,
            bookkeeping_buffer_bytes=bookkeeping_buffer_bytes,
            workers=default_workers() if workers is None else workers,
            upstream_authorization=authorization,
            otlp=otlp,
            shadow=shadow_cfg,
            advise_every_s=advise_every,
            advise_window_s=advise_window,
            speculative_schedule=schedule,
        )
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        one_arena()  # before any thread or fork: every process of the proxy frees into the arena it allocates from
        if cfg.workers == 0:
            from specproxy.proxy.memtrace import traced

            run_async(traced(_main(cfg), "proxy"))
        else:
            _run_workers(cfg)


def shadow_config(
    specs: list[str],
    share: float,
    max_inflight: int,
    seed: int,
    timeout: float,
    workloads: list[str],
    credentials: list[str],
) -> ShadowConfig | None:
    """The ``--shadow*`` options checked; None without ``--shadow``."""
    if not specs:
        if workloads or credentials:
            raise typer.BadParameter("--shadow-workload and --shadow-credentials-file need --shadow")
        return None
    try:
        targets = tuple(parse_target(s) for s in specs)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    labels = [t.label for t in targets]
    if len(set(labels)) != len(labels):
        raise typer.BadParameter(f"--shadow labels must differ, got {', '.join(labels)}")
    for spec in credentials:
        label, sep, path = spec.partition("=")
        if not sep or label not in labels:
            raise typer.BadParameter(f"--shadow-credentials-file wants LABEL=PATH with a --shadow label, got {spec!r}")
        try:
            auth = read_credentials_file(path)
        except CredentialsError as e:
            fail(str(e))
        targets = tuple(replace(t, authorization=auth) if t.label == label else t for t in targets)
    if not 0.0 < share <= 1.0:
        raise typer.BadParameter(f"--shadow-share must be in (0, 1], got {share}")
    if max_inflight < 1:
        raise typer.BadParameter(f"--shadow-max-inflight must be at least 1, got {max_inflight}")
    if timeout <= 0:
        raise typer.BadParameter(f"--shadow-timeout must be positive, got {timeout}")
    return ShadowConfig(targets, share, max_inflight, seed, timeout, workloads=frozenset(workloads))


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
