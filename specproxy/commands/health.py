"""``specproxy health``: one GET against a running proxy (or simulator), for container health checks.

Images have no curl; this needs nothing but the package. Exit 0 when the URL answers 2xx within the timeout,
1 otherwise with one line on stderr saying why.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import typer

from specproxy.commands.common import command, fail
from specproxy.exitcodes import EXIT_FAILURE

HEALTH_URL_ENV = "SPECPROXY_HEALTH_URL"
DEFAULT_HEALTH_URL = "http://127.0.0.1:8080/specproxy/status"


def register(app: typer.Typer) -> None:
    @command(app, "health")
    def health(
        url: str | None = typer.Option(
            None,
            "--url",
            help=f"What to GET (default: ${HEALTH_URL_ENV}, else {DEFAULT_HEALTH_URL}).",
        ),
        timeout: float = typer.Option(3.0, "--timeout", help="Seconds to wait for the answer."),
    ) -> None:
        """Exit 0 if a running specproxy answers (for HEALTHCHECK and probes), 1 if not."""
        target = url or os.environ.get(HEALTH_URL_ENV) or DEFAULT_HEALTH_URL
        if not target.startswith(("http://", "https://")):
            fail(f"--url must be an http:// or https:// URL, got {target!r}")
        if timeout <= 0:
            fail(f"--timeout must be positive, got {timeout:g}")
        try:
            with urllib.request.urlopen(target, timeout=timeout) as resp:  # the scheme was checked above
                status = int(resp.status)
        except urllib.error.HTTPError as e:
            status = e.code
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            fail(f"{target}: {' '.join(str(reason).split()) or type(e).__name__}", EXIT_FAILURE)
        if not 200 <= status < 300:
            fail(f"{target}: HTTP {status}", EXIT_FAILURE)
