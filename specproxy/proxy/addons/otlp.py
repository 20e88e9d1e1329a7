"""``--otlp-endpoint``: a span per inference request over OTLP/HTTP (:mod:`specproxy.recorder.otlp`, docs/otel.md).

Its settings are the proxy configuration's ``otlp``, which the relays read too (they pass the trace context on)."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

from prometheus_client.registry import Collector

from specproxy.core.record import Record
from specproxy.core.urls import http_url
from specproxy.proxy.addons.base import Addon, Context, Option, OptionError, SetupError
from specproxy.proxy.config import CredentialsError, ProxyConfig, read_secret_file
from specproxy.recorder.config import OtlpConfig
from specproxy.recorder.otlp import (
    PROTOCOLS,
    OtlpCollector,
    OtlpConfigError,
    SpanExporter,
    parse_headers,
    parse_resource,
    traces_url,
)

# Header names whose values are usually secrets: given with --otlp-header, every local user can read them (ps)
_SECRET_HEADER_RE = re.compile(r"authorization|cookie|key|token|secret|password|signature", re.IGNORECASE)


def _url(value: str, what: str) -> str:
    url = http_url(value)
    if url is None:
        raise OptionError(f"{what} must be an http:// or https:// URL, got {value!r}")
    return url


class OtlpAddon(Addon):
    name = "otlp"
    group = "OpenTelemetry export"
    options = (
        Option(
            "--otlp-endpoint",
            str | None,
            None,
            "Export a span per inference request over OTLP/HTTP to this base URL (spans go to URL/v1/traces); "
            "default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else off.",
            show_default=False,
        ),
        Option("--otlp-protocol", str | None, None, "http/protobuf (default) or http/json.", show_default=False),
        Option(
            "--otlp-header",
            list[str] | None,
            None,
            "KEY=VALUE sent with every export (repeatable); for secrets use $OTEL_EXPORTER_OTLP_HEADERS or "
            "--otlp-headers-file, which no other user can read.",
        ),
        Option(
            "--otlp-headers-file",
            Path | None,
            None,
            "A file (mode 0600) of KEY=VALUE lines sent with every export, e.g. an API key.",
        ),
    )

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    @classmethod
    def configure(cls, values: dict[str, Any], ctx: Context) -> OtlpConfig | None:
        """The span export's settings, from the options and the standard OpenTelemetry variables: on with
        ``--otlp-endpoint``, or with OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT set (unless
        OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none). The headers' variables are taken out of the
        environment once read, so that no process the proxy starts inherits them."""
        endpoint, protocol = values["otlp_endpoint"], values["otlp_protocol"]
        header: list[str] = values["otlp_header"] or []
        headers_file: Path | None = values["otlp_headers_file"]
        env = os.environ
        env_headers = env.pop("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "") or env.pop("OTEL_EXPORTER_OTLP_HEADERS", "")
        env.pop("OTEL_EXPORTER_OTLP_HEADERS", None)
        env_off = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or (
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        )
        if endpoint is not None:
            url = traces_url(_url(endpoint, "--otlp-endpoint"))
        elif not env_off and (full := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()):
            url = traces_url(_url(full, "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), full=True)
        elif not env_off and (base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()):
            url = traces_url(_url(base, "$OTEL_EXPORTER_OTLP_ENDPOINT"))
        else:
            if header or headers_file is not None or protocol is not None:
                raise OptionError("--otlp-protocol, --otlp-header and --otlp-headers-file need --otlp-endpoint")
            return None
        proto = (
            protocol
            or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
            or "http/protobuf"
        )
        if proto not in PROTOCOLS:
            raise OptionError(f"--otlp-protocol must be http/protobuf or http/json (no grpc), got {proto!r}")
        pairs: list[tuple[str, str]] = []
        try:
            if env_headers:
                pairs += parse_headers(env_headers, "$OTEL_EXPORTER_OTLP_HEADERS")
            if headers_file is not None:
                source = f"--otlp-headers-file {headers_file}"
                pairs += parse_headers(read_secret_file(str(headers_file), source), source)
            for h in header:
                given = parse_headers(h, "--otlp-header")
                if ctx.on_command_line("otlp_header") and any(_SECRET_HEADER_RE.search(k) for k, _ in given):
                    ctx.warn(
                        "--otlp-header values are visible to every local user (ps, /proc/PID/cmdline); give secrets "
                        "in $OTEL_EXPORTER_OTLP_HEADERS, --otlp-headers-file or a --config file"
                    )
                pairs += given
        except (OtlpConfigError, CredentialsError) as e:
            raise SetupError(str(e)) from None
        if any(k.lower() in ("content-type", "content-length", "host") for k, _ in pairs):
            raise SetupError("OTLP headers cannot set Content-Type, Content-Length or Host")
        up = urlsplit(ctx.upstream)
        return OtlpConfig(
            traces_url=url,
            protocol=proto,
            headers=tuple(pairs),
            service_name=env.get("OTEL_SERVICE_NAME", "").strip() or "specproxy",
            resource=parse_resource(env.get("OTEL_RESOURCE_ATTRIBUTES", "")),
            server_address=up.hostname,
            server_port=up.port or (443 if up.scheme == "https" else 80),
        )

    @classmethod
    def settings(cls, cfg: ProxyConfig) -> OtlpConfig | None:
        return cfg.otlp

    @classmethod
    def with_settings(cls, cfg: ProxyConfig, settings: object | None) -> ProxyConfig:
        return replace(cfg, otlp=settings if isinstance(settings, OtlpConfig) else None)

    @classmethod
    def create(cls, cfg: ProxyConfig) -> Self | None:
        return cls(SpanExporter(cfg.otlp)) if cfg.otlp is not None else None

    @classmethod
    def collector(cls, running: Self | None) -> Collector | None:
        return OtlpCollector(running.exporter) if running is not None else None

    def observe(self, rec: Record) -> None:
        self.exporter.observe(rec)

    async def close(self) -> None:
        await self.exporter.close()  # after the last record: its span goes too

    def status(self) -> dict[str, Any]:
        return self.exporter.status()
