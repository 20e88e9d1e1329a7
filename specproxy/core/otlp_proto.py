"""OTLP trace export requests, encoded by hand: the protobuf wire format of ``ExportTraceServiceRequest`` (OTLP/HTTP
``application/x-protobuf``) and its JSON mapping (``application/json``), for the few messages a span needs, and the
W3C ``traceparent`` a client sends.

Why by hand: a span is a handful of varints and length-delimited fields, and the protobuf runtime with the generated
OTLP classes would be a heavy dependency of a proxy that only ever writes this one message. Field numbers are those
of opentelemetry-proto's ``trace.proto``, ``common.proto``, ``resource.proto`` and ``trace_service.proto``; the tests
decode what this writes with the real generated classes.

A span is encoded once, when it is made (:func:`encode_span`, :func:`span_json`): a batch is then only the spans'
bytes put together under one resource and scope (:func:`export_request`, :func:`export_request_json`). Pure.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# Span.SpanKind and Status.StatusCode
KIND_CLIENT = 3
STATUS_UNSET = 0
STATUS_ERROR = 2
# Span.flags: the W3C trace flags in bits 0-7; bit 8 says bit 9 is known, bit 9 that the parent is remote
FLAG_HAS_IS_REMOTE = 0x100
FLAG_IS_REMOTE = 0x200

# An attribute's value: OTLP AnyValue's string, bool, int, double, or an array of strings
AttrValue = str | bool | int | float | tuple[str, ...]

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: bytes  # 16 bytes
    span_id: bytes  # 8 bytes
    parent_span_id: bytes  # 8 bytes, or b"" for a root span
    name: str
    start_ns: int  # wall clock, nanoseconds since the epoch
    end_ns: int
    attributes: tuple[tuple[str, AttrValue], ...]
    status_code: int = STATUS_UNSET
    status_message: str = ""
    kind: int = KIND_CLIENT
    flags: int = 0
    trace_state: str = ""


# -- the protobuf wire format --------------------------------------------------------------------------------------
_SMALL = [bytes((i,)) for i in range(128)]  # a one-byte varint: nearly every tag and length here


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64  # int64: two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _string(field: int, s: str) -> bytes:
    return _delimited(field, s.encode("utf-8", "replace")) if s else b""


def _fixed64(field: int, n: int) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<Q", n & 0xFFFFFFFFFFFFFFFF)


def _uvarint_field(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n) if n else b""


def _any_value(v: AttrValue) -> bytes:
    if isinstance(v, bool):  # before int: a bool is an int
        return _varint(2 << 3) + _varint(int(v))
    if isinstance(v, int):
        return _varint(3 << 3) + _varint(min(max(v, _I64_MIN), _I64_MAX))
    if isinstance(v, float):
        return _varint(4 << 3 | 1) + struct.pack("<d", v)
    if isinstance(v, tuple):  # ArrayValue { repeated AnyValue values = 1 }
        return _delimited(5, b"".join(_delimited(1, _any_value(x)) for x in v))
    return _delimited(1, v.encode("utf-8", "replace"))  # an empty string is still a value: written


def _key_value(key: str, v: AttrValue) -> bytes:
    return _string(1, key) + _delimited(2, _any_value(v))


def _attributes(field: int, attrs: Iterable[tuple[str, AttrValue]]) -> bytes:
    return b"".join(_delimited(field, _key_value(k, v)) for k, v in attrs)


def encode_span(s: Span) -> bytes:
    """The ``Span`` message's bytes (without its tag: :func:`export_request` adds it)."""
    status = _string(2, s.status_message) + _uvarint_field(3, s.status_code)
    return b"".join(
        (
            _delimited(1, s.trace_id),
            _delimited(2, s.span_id),
            _string(3, s.trace_state),
            _delimited(4, s.parent_span_id) if s.parent_span_id else b"",
            _string(5, s.name),
            _uvarint_field(6, s.kind),
            _fixed64(7, s.start_ns),
            _fixed64(8, s.end_ns),
            _attributes(9, s.attributes),
            _delimited(15, status) if status else b"",
            (_varint(16 << 3 | 5) + struct.pack("<I", s.flags & 0xFFFFFFFF)) if s.flags else b"",
        )
    )


def export_request(
    resource: Sequence[tuple[str, AttrValue]], scope_name: str, scope_version: str, spans: Iterable[bytes]
) -> bytes:
    """``ExportTraceServiceRequest`` with one ``ResourceSpans`` holding one ``ScopeSpans``: the encoded ``spans``."""
    scope = _string(1, scope_name) + _string(2, scope_version)
    scope_spans = _delimited(1, scope) + b"".join(_delimited(2, s) for s in spans)
    resource_spans = _delimited(1, _attributes(1, resource)) + _delimited(2, scope_spans)
    return _delimited(1, resource_spans)


# -- the JSON mapping (OTLP/HTTP JSON: ids in hex, 64-bit integers as strings, enums as numbers) --------------------
def _json_value(v: AttrValue) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(min(max(v, _I64_MIN), _I64_MAX))}
    if isinstance(v, float):
        return {"doubleValue": v} if v == v and abs(v) != float("inf") else {"stringValue": str(v)}
    if isinstance(v, tuple):
        return {"arrayValue": {"values": [_json_value(x) for x in v]}}
    return {"stringValue": v}


def _json_attributes(attrs: Iterable[tuple[str, AttrValue]]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _json_value(v)} for k, v in attrs]


def span_json(s: Span) -> bytes:
    """The span as OTLP/JSON, one object's bytes."""
    doc: dict[str, Any] = {
        "traceId": s.trace_id.hex(),
        "spanId": s.span_id.hex(),
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": str(s.start_ns),
        "endTimeUnixNano": str(s.end_ns),
        "attributes": _json_attributes(s.attributes),
        "status": {"code": s.status_code, **({"message": s.status_message} if s.status_message else {})},
    }
    if s.parent_span_id:
        doc["parentSpanId"] = s.parent_span_id.hex()
    if s.trace_state:
        doc["traceState"] = s.trace_state
    if s.flags:
        doc["flags"] = s.flags
    return orjson.dumps(doc)


def export_request_json(
    resource: Sequence[tuple[str, AttrValue]], scope_name: str, scope_version: str, spans: Iterable[bytes]
) -> bytes:
    """The JSON form of :func:`export_request`, from spans made by :func:`span_json`."""
    resource_doc = orjson.dumps({"attributes": _json_attributes(resource)})
    scope_doc = orjson.dumps({"name": scope_name, "version": scope_version})
    return b'{"resourceSpans":[{"resource":%s,"scopeSpans":[{"scope":%s,"spans":[%s]}]}]}' % (
        resource_doc,
        scope_doc,
        b",".join(spans),
    )


# -- W3C Trace Context ---------------------------------------------------------------------------------------------
_TRACEPARENT_RE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: bytes
    parent_id: bytes
    flags: int


def parse_traceparent(value: str | None) -> TraceParent | None:
    """A ``traceparent`` header as W3C Trace Context (level 1) reads it; None for one that is absent or invalid
    (an invalid one starts a new trace, as the spec says). Version 00 is exactly four fields; a later version may
    add more after them, which are ignored; version ff and all-zero ids are invalid."""
    if value is None:
        return None
    value = value.strip(" \t")
    m = _TRACEPARENT_RE.fullmatch(value)
    if m is None:
        return None
    version, trace_id, parent_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(bytes.fromhex(trace_id), bytes.fromhex(parent_id), int(flags, 16))
