"""The hand-written OTLP encoding (core/otlp_proto.py) read back by opentelemetry-proto's generated classes, the
span a record makes (recorder/otlp.py), W3C traceparent parsing, and the export's settings."""

from __future__ import annotations

import pytest
from analysisutil import make_record
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from otlputil import attributes, json_to_message, value_of

from specproxy.core.otlp_proto import (
    FLAG_HAS_IS_REMOTE,
    FLAG_IS_REMOTE,
    STATUS_ERROR,
    Span,
    encode_span,
    export_request,
    export_request_json,
    parse_traceparent,
    span_json,
)
from specproxy.core.record import as_record
from specproxy.recorder.config import OtlpConfig
from specproxy.recorder.otlp import operation_name, parse_headers, span_of_record, traces_url

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CFG = OtlpConfig(traces_url="http://collector:4318/v1/traces", server_address="engine", server_port=8000)
RESOURCE = (("service.name", "specproxy"), ("deployment.environment", "test"))


SPAN = Span(
    trace_id=bytes(range(16)),
    span_id=bytes(range(100, 108)),
    parent_span_id=bytes(range(200, 208)),
    name="chat m",
    start_ns=1_700_000_000_123_456_789,
    end_ns=1_700_000_001_000_000_000,
    attributes=(
        ("s", "text"),
        ("empty", ""),
        ("unicode", "日本語"),
        ("b", True),
        ("f", False),
        ("i", 7),
        ("neg", -3),
        ("big", 1 << 62),
        ("d", 0.25),
        ("arr", ("stop", "length")),
    ),
    status_code=STATUS_ERROR,
    status_message="upstream said no",
    flags=0x301,
    trace_state="vendor=x",
)


@pytest.mark.parametrize("form", ["protobuf", "json"])
def test_a_request_reads_back_field_for_field(form: str) -> None:
    msg = ExportTraceServiceRequest()
    if form == "protobuf":
        msg.ParseFromString(export_request(RESOURCE, "specproxy", "1.2", [encode_span(SPAN), encode_span(SPAN)]))
    else:
        json_to_message(export_request_json(RESOURCE, "specproxy", "1.2", [span_json(SPAN)] * 2), msg)
    (rs,) = msg.resource_spans
    assert {kv.key: value_of(kv.value) for kv in rs.resource.attributes} == dict(RESOURCE)
    (ss,) = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("specproxy", "1.2")
    assert len(ss.spans) == 2
    s = ss.spans[0]
    assert s.trace_id == SPAN.trace_id and s.span_id == SPAN.span_id and s.parent_span_id == SPAN.parent_span_id
    assert s.name == "chat m" and s.kind == PbSpan.SPAN_KIND_CLIENT and s.trace_state == "vendor=x"
    assert (s.start_time_unix_nano, s.end_time_unix_nano) == (SPAN.start_ns, SPAN.end_ns)
    assert s.status.code == Status.STATUS_CODE_ERROR and s.status.message == "upstream said no"
    assert s.flags == 0x301
    assert attributes(s) == dict(SPAN.attributes)


def test_a_root_span_has_no_parent_field_and_an_unset_status() -> None:
    root = Span(bytes(16 * [1]), bytes(8 * [2]), b"", "text_completion", 1, 2, ())
    s = PbSpan()
    s.ParseFromString(encode_span(root))
    assert not s.HasField("status") and s.parent_span_id == b"" and s.flags == 0
    assert s.start_time_unix_nano == 1 and s.end_time_unix_nano == 2


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (TP, True),
        (" " + TP + " ", True),
        (TP.upper(), False),  # hex must be lower case
        (TP + "-extra", False),  # version 00 has exactly four fields
        ("01" + TP[2:] + "-extra", True),  # a later version may add some
        ("ff" + TP[2:], False),
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01", False),
        ("00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01", False),
        ("garbage", False),
        (None, False),
    ],
)
def test_traceparent_as_w3c_trace_context_reads_it(value: str | None, ok: bool) -> None:
    got = parse_traceparent(value)
    assert (got is not None) == ok
    if got is not None:
        assert got.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
        assert got.parent_id.hex() == "b7ad6b7169203331" and got.flags == 1


def _record(**over: object) -> dict[str, object]:
    rec = dict(make_record("0123456789abcdef", accepted=[2, 1, 3], k=3))
    rec.update(
        model="llama",
        engine="vllm",
        prompt_tokens=12,
        completion_tokens=10,
        cached_tokens=4,
        finish_reason="stop",
        status=200,
        upstream_id="chatcmpl-1",
        request={"max_tokens": 64, "temperature": 0.7, "top_p": 1, "stop": ["\n"], "n": 1, "seed": 3},
        trace_parent=TP,
    )
    rec.update(over)
    return rec


def test_the_span_of_a_record_is_a_child_of_its_traceparent_with_genai_attributes() -> None:
    rec = as_record(_record())
    span = span_of_record(rec, CFG)
    assert span is not None
    assert span.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent_span_id.hex() == "b7ad6b7169203331"
    assert span.span_id.hex() == "0123456789abcdef"  # the request id: span and record find each other
    assert span.flags == 1 | FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE
    assert span.name == "chat llama" and span.status_code == 0
    started = rec["started_at"]
    assert started is not None and rec["e2e_s"] is not None
    assert abs(span.start_ns - started * 1e9) < 1e3
    assert abs((span.end_ns - span.start_ns) - rec["e2e_s"] * 1e9) < 1e3
    a = dict(span.attributes)
    spec = rec["spec"]
    assert spec is not None
    assert a == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.system": "vllm",
        "gen_ai.request.model": "llama",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.seed": 3,
        "gen_ai.request.stop_sequences": ("\n",),
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 10,
        "gen_ai.usage.cache_read.input_tokens": 4,
        "http.response.status_code": 200,
        "server.address": "engine",
        "server.port": 8000,
        "specproxy.request_id": "0123456789abcdef",
        "specproxy.run_id": rec["run_id"],
        "specproxy.workload": rec["workload"],
        "specproxy.outcome": "ok",
        "specproxy.stream": rec["stream"],
        "specproxy.token_source": rec["token_source"],
        "specproxy.label": rec["label"],
        "specproxy.ttft_s": rec["ttft_s"],
        "specproxy.tpot_s": rec["tpot_s"],
        "specproxy.e2e_s": rec["e2e_s"],
        "specproxy.decode_tok_s": rec["decode_tok_s"],
        "specproxy.acceptance_rate": spec["acceptance_rate"],
        "specproxy.mean_acceptance_length": spec["mean_acceptance_length"],
        "specproxy.spec_source": spec["source"],
    } | ({"specproxy.flags": tuple(rec["flags"])} if rec["flags"] else {})


def test_a_failed_request_without_traceparent_is_an_error_root_span() -> None:
    rec = as_record(_record(trace_parent=None, outcome="upstream_error", status=503, error="overloaded", request=None))
    span = span_of_record(rec, CFG)
    assert span is not None
    assert span.parent_span_id == b"" and len(span.trace_id) == 16 and any(span.trace_id)
    assert span.status_code == STATUS_ERROR and span.status_message == "overloaded"
    a = dict(span.attributes)
    assert a["error.type"] == "503" and a["specproxy.outcome"] == "upstream_error"
    assert not any(k.startswith("gen_ai.request.m") and k != "gen_ai.request.model" for k in a)
    cut = span_of_record(as_record(_record(outcome="timeout", status=None, error=None)), CFG)
    assert cut is not None and dict(cut.attributes)["error.type"] == "timeout" and cut.status_message == "timeout"
    assert span_of_record(as_record(_record(trace_parent="00-bad")), CFG).parent_span_id == b""  # type: ignore[union-attr]


def test_operation_names() -> None:
    assert operation_name("/v1/chat/completions") == "chat"
    assert operation_name("/api/chat") == "chat"
    assert operation_name("/v1/completions") == "text_completion"
    assert operation_name("/completion") == "text_completion"


def test_headers_and_urls() -> None:
    assert parse_headers("api-key=s%3Dcret, x-tenant = a b", "env") == (("api-key", "s=cret"), ("x-tenant", "a b"))
    assert parse_headers("# a comment\nauthorization=Bearer t\n\n", "file") == (("authorization", "Bearer t"),)
    with pytest.raises(ValueError, match="entry 1") as e:
        parse_headers("no-equals-sign-s3cret", "env")
    assert "s3cret" not in str(e.value)
    with pytest.raises(ValueError, match="control character") as e:
        parse_headers("k=s3cret%0A", "env")
    assert "s3cret" not in str(e.value)
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/otlp/") == "http://c:4318/otlp/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/custom", full=True) == "http://c:4318/custom"
    assert "headers" not in repr(OtlpConfig("http://c/v1/traces", headers=(("api-key", "s3cret"),)))
