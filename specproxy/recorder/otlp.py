"""OpenTelemetry export: one span per finished inference record, posted over OTLP/HTTP (docs/otel.md).

The span is made from the record (:func:`span_of_record`), never from the stream: the exporter is one of the
recorder's per-record observers, so it runs in the bookkeeper once a record is complete, off every client's path.
Each record's span is encoded at once (tens of microseconds) and queued; a background task posts batches (up to
``batch_spans``, at least every ``interval_s``), one at a time, each within ``timeout_s``. The queue is bounded:
past ``max_queue`` spans or :data:`MAX_QUEUE_BYTES` waiting (a receiver that is down or slow), the oldest are
dropped. Every span ends as exported, dropped or failed, counted in ``/specproxy/status`` and
``/specproxy/metrics``; nothing here raises into the recorder, and a receiver that hangs only fills (and trims) the
queue.

Attribute names follow the OpenTelemetry GenAI semantic conventions where they have one (``gen_ai.*``,
``server.*``, ``error.type``); specproxy's own figures are ``specproxy.*``. The export's headers (an API key) are
never logged nor shown: they live in :class:`~specproxy.recorder.config.OtlpConfig`, outside its repr.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy import __version__
from specproxy.core.errors import one_line, shown_url
from specproxy.core.otlp_proto import (
    FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE,
    STATUS_ERROR,
    AttrValue,
    Span,
    encode_span,
    export_request,
    export_request_json,
    parse_traceparent,
    span_json,
)
from specproxy.core.record import Record, number
from specproxy.recorder.config import OtlpConfig

log = logging.getLogger("specproxy.otlp")

PROTOCOLS = ("http/protobuf", "http/json")
SCOPE = "specproxy"
TRACES_PATH = "/v1/traces"
RESPONSE_MAX_BYTES = 64 * 1024  # a receiver's answer is read this far, no further
MAX_QUEUE_BYTES = 8 * 2**20  # encoded spans waiting, at most: a span's strings are clients' (path, model, error)
_CHAT_ENDS = ("chat/completions", "api/chat", "responses", "messages")


# -- the span of a record (pure) -----------------------------------------------------------------------------------
def operation_name(path: str) -> str:
    """GenAI's ``gen_ai.operation.name`` for an inference path: ``chat`` for the chat APIs (OpenAI's chat
    completions and responses, Ollama's ``/api/chat``, Anthropic's messages), else ``text_completion``."""
    p = path.lower().rstrip("/")
    return "chat" if p.endswith(_CHAT_ENDS) else "text_completion"


def _num(body: Mapping[str, Any], *names: str) -> float | None:
    """The first of ``names`` that is a number in the body, or in its Ollama ``options``."""
    options = body.get("options")
    for where in (body, options if isinstance(options, Mapping) else {}):
        for name in names:
            v = number(where.get(name))
            if v is not None:
                return v
    return None


def request_attributes(body: Any) -> list[tuple[str, AttrValue]]:
    """``gen_ai.request.*`` from the captured request body (none with ``--capture none``)."""
    if not isinstance(body, Mapping):
        return []
    out: list[tuple[str, AttrValue]] = []
    for attr, names, as_int in (
        (
            "gen_ai.request.max_tokens",
            ("max_tokens", "max_completion_tokens", "max_output_tokens", "num_predict", "n_predict"),
            True,
        ),
        ("gen_ai.request.temperature", ("temperature",), False),
        ("gen_ai.request.top_p", ("top_p",), False),
        ("gen_ai.request.top_k", ("top_k",), False),
        ("gen_ai.request.frequency_penalty", ("frequency_penalty",), False),
        ("gen_ai.request.presence_penalty", ("presence_penalty",), False),
        ("gen_ai.request.seed", ("seed",), True),
        ("gen_ai.request.choice.count", ("n",), True),
    ):
        v = _num(body, *names)
        if v is None or (as_int and not float(v).is_integer()):
            continue
        if attr == "gen_ai.request.choice.count" and v == 1:
            continue  # the conventions: only when not 1
        out.append((attr, int(v) if as_int else float(v)))
    stop = body.get("stop")
    if isinstance(stop, str):
        out.append(("gen_ai.request.stop_sequences", (stop,)))
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        out.append(("gen_ai.request.stop_sequences", tuple(stop)))
    return out


def span_id_of(request_id: str) -> bytes:
    """The span's id: the record's ``request_id`` (16 hex digits, also the ``X-Specproxy-Request-Id`` header), so
    that a span and its record find each other; a random one for an id of another shape."""
    if len(request_id) == 16:
        with contextlib.suppress(ValueError):
            raw = bytes.fromhex(request_id)
            if any(raw):
                return raw
    return os.urandom(8)


def span_of_record(rec: Record, cfg: OtlpConfig) -> Span | None:
    """The record's span: a child of the client's ``traceparent`` when it sent a valid one, else the root of a new
    trace; from ``started_at`` to ``started_at + e2e_s``; status error for an outcome other than ``ok``. None for a
    record without a start time."""
    started = rec["started_at"]
    if started is None:
        return None
    start_ns = int(started * 1e9)
    end_ns = start_ns + max(0, int((rec["e2e_s"] or 0.0) * 1e9))
    parent = parse_traceparent(rec["trace_parent"])
    if parent is not None:
        trace_id, parent_id = parent.trace_id, parent.parent_id
        flags = (parent.flags & 0xFF) | FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE
    else:
        trace_id, parent_id, flags = os.urandom(16), b"", FLAG_HAS_IS_REMOTE | 0x01  # sampled: every span is sent
    op = operation_name(rec["path"])
    model = rec["model"]
    attrs: list[tuple[str, AttrValue]] = [("gen_ai.operation.name", op)]
    if rec["engine"]:
        attrs += [("gen_ai.provider.name", rec["engine"]), ("gen_ai.system", rec["engine"])]
    if model:
        attrs.append(("gen_ai.request.model", model))
    attrs += request_attributes(rec["request"])
    if rec["upstream_id"]:
        attrs.append(("gen_ai.response.id", rec["upstream_id"]))
    if rec["finish_reason"]:
        attrs.append(("gen_ai.response.finish_reasons", (rec["finish_reason"],)))
    for attr, v in (
        ("gen_ai.usage.input_tokens", rec["prompt_tokens"]),
        ("gen_ai.usage.output_tokens", rec["completion_tokens"]),
        ("gen_ai.usage.cache_read.input_tokens", rec["cached_tokens"]),
        ("http.response.status_code", rec["status"]),
    ):
        if v is not None:
            attrs.append((attr, v))
    if cfg.server_address:
        attrs.append(("server.address", cfg.server_address))
    if cfg.server_port is not None:
        attrs.append(("server.port", cfg.server_port))
    outcome = rec["outcome"]
    if outcome != "ok":
        status = rec["status"]
        attrs.append(("error.type", str(status) if status is not None and status >= 400 else outcome))
    attrs += [
        ("specproxy.request_id", rec["request_id"]),
        ("specproxy.run_id", rec["run_id"] or ""),
        ("specproxy.workload", rec["workload"]),
        ("specproxy.outcome", outcome),
        ("specproxy.stream", rec["stream"]),
        ("specproxy.token_source", rec["token_source"]),
    ]
    if rec["label"] is not None:
        attrs.append(("specproxy.label", rec["label"]))
    spec = rec["spec"]
    for attr, fv in (
        ("specproxy.ttft_s", rec["ttft_s"]),
        ("specproxy.tpot_s", rec["tpot_s"]),
        ("specproxy.e2e_s", rec["e2e_s"]),
        ("specproxy.decode_tok_s", rec["decode_tok_s"]),
        ("specproxy.acceptance_rate", spec["acceptance_rate"] if spec else None),
        ("specproxy.mean_acceptance_length", spec["mean_acceptance_length"] if spec else None),
    ):
        if fv is not None:
            attrs.append((attr, float(fv)))
    if spec is not None and spec["source"]:
        attrs.append(("specproxy.spec_source", spec["source"]))
    if rec["flags"]:
        attrs.append(("specproxy.flags", tuple(rec["flags"])))
    return Span(
        trace_id=trace_id,
        span_id=span_id_of(rec["request_id"]),
        parent_span_id=parent_id,
        name=f"{op} {model}" if model else op,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=tuple(attrs),
        status_code=STATUS_ERROR if outcome != "ok" else 0,
        status_message=(rec["error"] or outcome) if outcome != "ok" else "",
        flags=flags,
    )


# -- configuration from the command line and the environment (pure) ------------------------------------------------
_KEY_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP field name (RFC 9110 token)


class OtlpConfigError(ValueError):
    """A setting that cannot be used: one line that never quotes a header's value."""


def traces_url(endpoint: str, *, full: bool = False) -> str:
    """Where spans are posted: ``endpoint`` with ``/v1/traces`` added (OTEL_EXPORTER_OTLP_ENDPOINT's rule), unless
    it is ``full`` (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's) or already ends with it."""
    endpoint = endpoint.strip()
    if full or endpoint.rstrip("/").endswith(TRACES_PATH):
        return endpoint
    return endpoint.rstrip("/") + TRACES_PATH


def parse_headers(text: str, source: str) -> tuple[tuple[str, str], ...]:
    """``key=value`` pairs, separated by commas or line ends (OTEL_EXPORTER_OTLP_HEADERS's form: values
    percent-decoded); in a file, blank lines and lines that start with ``#`` are skipped."""
    out: list[tuple[str, str]] = []
    entries = [e for line in text.splitlines() if not line.lstrip().startswith("#") for e in line.split(",")]
    for i, entry in enumerate(entries, 1):
        if not entry.strip():
            continue
        key, eq, value = entry.partition("=")
        key = unquote(key).strip()
        if not eq or not _KEY_RE.fullmatch(key):
            raise OtlpConfigError(f"{source}: entry {i} is not KEY=VALUE with a header name as KEY")
        value = unquote(value).strip(" \t")
        if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value):
            raise OtlpConfigError(f"{source}: the value of {key} holds a control character")
        out.append((key, value))
    return tuple(out)


def parse_resource(text: str) -> tuple[tuple[str, str], ...]:
    """OTEL_RESOURCE_ATTRIBUTES: ``key=value`` pairs, percent-decoded; malformed ones are skipped (as SDKs do)."""
    out = []
    for entry in text.split(","):
        key, eq, value = entry.partition("=")
        if eq and key.strip():
            out.append((unquote(key).strip(), unquote(value).strip()))
    return tuple(out)


# -- the exporter (IO) ---------------------------------------------------------------------------------------------
class SpanExporter:
    """The observer that turns records into spans, and the task that posts them."""

    def __init__(self, cfg: OtlpConfig) -> None:
        self.cfg = cfg
        self._json = cfg.protocol == "http/json"
        resource = [("service.name", cfg.service_name), ("service.version", __version__)]
        given = dict(cfg.resource)
        given.pop("service.name", None)  # OTEL_SERVICE_NAME (or this one in the attributes) is in service_name
        self._resource: tuple[tuple[str, AttrValue], ...] = (*resource, *given.items())
        self._headers = {
            **dict(cfg.headers),
            "Content-Type": "application/json" if self._json else "application/x-protobuf",
        }
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self.exported = 0
        self.dropped = 0  # never sent: the queue was full, or the proxy stopped before they went
        self.failed = 0  # sent, and the receiver did not take them (an error, no answer in time, unreachable)
        self.last_error: str | None = None
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._session: aiohttp.ClientSession | None = None

    # -- the observer: in the recorder's task that wrote the record; bounded work, never raises ----------------------
    def observe(self, rec: Record) -> None:
        try:
            span = span_of_record(rec, self.cfg)
            if span is None:
                return
            data = span_json(span) if self._json else encode_span(span)
        except Exception:
            log.exception("making the span of %s failed", rec.get("request_id"))
            self.dropped += 1
            return
        queue = self._queue
        queue.append(data)
        self._queued_bytes += len(data)
        while len(queue) > 1 and (len(queue) > self.cfg.max_queue or self._queued_bytes > MAX_QUEUE_BYTES):
            self._queued_bytes -= len(queue.popleft())
            self.dropped += 1
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._run())
        if len(queue) >= self.cfg.batch_spans:
            self._wake.set()

    # -- the background task -----------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while self._queue or not self._closing:
            if len(self._queue) < self.cfg.batch_spans and not self._closing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.cfg.interval_s)
                self._wake.clear()
            if self._queue:
                try:
                    await self._export()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug here must not end the export of the spans to come
                    log.exception("an OTLP export failed")

    async def _export(self) -> None:
        queue = self._queue
        batch = [queue.popleft() for _ in range(min(len(queue), self.cfg.batch_spans))]
        self._queued_bytes -= sum(len(b) for b in batch)
        encode = export_request_json if self._json else export_request
        body = encode(self._resource, SCOPE, __version__, batch)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(), connector=aiohttp.TCPConnector(limit=1)
            )
        error: str | None = None
        try:
            async with self._session.post(
                self.cfg.traces_url,
                data=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s),
                allow_redirects=False,  # the headers (an API key) go to the address given, nowhere else
            ) as resp:
                await resp.content.read(RESPONSE_MAX_BYTES)
                if not 200 <= resp.status < 300:
                    error = f"HTTP {resp.status}"
        except asyncio.CancelledError:
            self.failed += len(batch)
            raise
        except TimeoutError:
            error = f"no answer within {self.cfg.timeout_s:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as e:
            error = one_line(f"{type(e).__name__}: {e}", 200)
        if error is None:
            self.exported += len(batch)
            if self._failing:
                self._failing = False
                log.warning("OTLP export to %s works again", shown_url(self.cfg.traces_url))
            return
        self.failed += len(batch)
        self.last_error = error
        if not self._failing:  # said once per failing spell; the counters say the rest
            self._failing = True
            log.warning(
                "OTLP export to %s failed (%s): its spans are counted as failed", shown_url(self.cfg.traces_url), error
            )

    async def close(self) -> None:
        """The proxy stops (every record is written): the spans still queued get ``close_timeout_s`` to go; those
        left then are dropped, counted."""
        self._closing = True
        self._wake.set()
        task = self._task
        if task is not None:
            done, _ = await asyncio.wait([task], timeout=self.cfg.close_timeout_s)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            elif not task.cancelled() and task.exception() is not None:
                log.error("the OTLP export task ended: %s", task.exception())
        self.dropped += len(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        if self._session is not None:
            await self._session.close()

    def status(self) -> dict[str, Any]:
        return {
            "endpoint": shown_url(self.cfg.traces_url),
            "protocol": self.cfg.protocol,
            "exported": self.exported,
            "dropped": self.dropped,
            "failed": self.failed,
            "queued": len(self._queue),
            "last_error": self.last_error,
        }


class OtlpCollector(Collector):
    """The exporter's counts in the proxy's own /metrics."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        e = self.exporter
        spans = CounterMetricFamily(
            "specproxy_otlp_spans",
            "Spans of inference records, by what became of them: exported, dropped (queue full, or left at the stop),"
            " failed (the OTLP receiver refused them, did not answer in time, or could not be reached).",
            labels=["result"],
        )
        for result, n in (("exported", e.exported), ("dropped", e.dropped), ("failed", e.failed)):
            spans.add_metric([result], n)
        yield spans
        yield GaugeMetricFamily("specproxy_otlp_queued_spans", "Spans waiting to be exported.", len(e._queue))
