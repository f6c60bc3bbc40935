"""OTLP trace payloads -> contract-v1 request events, pure (bytes in, plain data out).

The worker consumes the topic the OpenTelemetry Collector's Kafka exporter
writes, and ``skewwatch otlp-receiver`` accepts OTLP/HTTP; both hand the payload here. Decoding
uses the official ``opentelemetry-proto`` messages and ``google.protobuf.json_format``, not a
hand-written parser.

Framing (Collector ``kafkaexporter``, encodings ``otlp_proto`` and ``otlp_json``): every Kafka
record value is one complete ``ExportTraceServiceRequest`` (the exporter marshals a
``ptrace.Traces``; its proto ``TracesData`` has the same field 1 ``resource_spans``), with no
length prefix, no schema-registry header and no envelope. The record key is nil by default; with
``partition_traces_by_id: true`` the batch is split per trace and each record is keyed by the
trace id (hex), so records are *not* keyed by replica: a consumer must group events by replica
itself. Some Collector versions split further (one span per record); that changes nothing here.

OTLP/JSON specifics handled: ``traceId``/``spanId``/``parentSpanId`` are hex strings (protobuf's
JSON mapping would expect base64), 64-bit integers may be strings, enums may be integers, field
names are lowerCamelCase (json_format accepts the proto names too), unknown fields are ignored as
the OTLP spec requires.

>>> from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
>>> decode_otlp_traces(ExportTraceServiceRequest().SerializeToString(), "otlp_proto").spans_total
0
>>> bad = decode_otlp_traces(b"not otlp at all", "otlp_json")
>>> bad.rejections[0].reason_code
'malformed_otlp'
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from skewwatch.errors import SkewwatchError
from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, AttributeMap, SpanView
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests import encode_request_events

Encoding = Literal["otlp_proto", "otlp_json", "auto"]
ENCODINGS: tuple[str, ...] = ("otlp_proto", "otlp_json", "auto")
MALFORMED_OTLP = "malformed_otlp"  # reason code for payloads that are not OTLP at all

_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class OtlpDecodeError(SkewwatchError, ValueError):
    """The payload is not an ExportTraceServiceRequest in the given encoding; the message says why."""


@dataclass(slots=True)
class OtlpDecodeResult:
    """What one payload held: events to process, spans skipped by reason, spans/payload rejected."""

    events: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    rejections: list[Rejection] = field(default_factory=list)
    spans_total: int = 0
    event_spans: list[int] = field(default_factory=list)  # per event: its span's position in the walk

    @property
    def rejected_spans(self) -> int:
        """Spans that claimed to be requests but could not be mapped (OTLP partial_success)."""
        return sum(1 for r in self.rejections if not r.is_message_level)

    @property
    def is_malformed(self) -> bool:
        return any(r.is_message_level for r in self.rejections)


def detect_encoding(value: bytes) -> Literal["otlp_proto", "otlp_json"]:
    """JSON starts with ``{`` (after whitespace); a serialized ExportTraceServiceRequest cannot,
    since its only field (1, length-delimited) starts with byte 0x0A.

    >>> detect_encoding(b' {"resourceSpans": []}'), detect_encoding(b"\\x0a\\x00")
    ('otlp_json', 'otlp_proto')
    """
    return "otlp_json" if value.lstrip()[:1] == b"{" else "otlp_proto"


def _hex_ids_to_base64(node: Any, path: str) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping reads bytes as base64. Convert in place."""
    if isinstance(node, dict):
        for key, child in node.items():
            if key in _ID_FIELDS and isinstance(child, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(child)).decode()
                except ValueError:
                    raise OtlpDecodeError(f"{path}.{key}: {child[:40]!r} is not a hex id "
                                          "(OTLP/JSON ids are hex strings, not base64)") from None
            elif isinstance(child, dict | list):
                _hex_ids_to_base64(child, f"{path}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            _hex_ids_to_base64(child, f"{path}[{i}]")


def parse_export_request(value: bytes, encoding: Encoding = "auto") -> ExportTraceServiceRequest:
    """Bytes -> ExportTraceServiceRequest, or OtlpDecodeError saying what is wrong."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown OTLP encoding {encoding!r} (known: {', '.join(ENCODINGS)})")
    if encoding == "auto":
        encoding = detect_encoding(value)
    request = ExportTraceServiceRequest()
    if encoding == "otlp_json":
        try:
            document = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise OtlpDecodeError(f"not JSON ({exc}); is the exporter's encoding otlp_proto?") from None
        if not isinstance(document, dict):
            raise OtlpDecodeError(f"OTLP/JSON must be an object, got {type(document).__name__}")
        _hex_ids_to_base64(document, "$")
        try:
            json_format.ParseDict(document, request, ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise OtlpDecodeError(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
        return request
    try:
        request.ParseFromString(value)
    except DecodeError as exc:
        raise OtlpDecodeError(f"not a protobuf ExportTraceServiceRequest ({exc}); "
                              "is the exporter's encoding otlp_json?") from None
    # Protobuf is lenient: arbitrary bytes can parse as "unknown fields" of an empty message.
    if value and not request.resource_spans:
        raise OtlpDecodeError(f"{len(value)} bytes parsed as protobuf but hold no resource_spans; "
                              "this is not an OTLP traces payload (metrics or logs topic? wrong encoding?)")
    return request


def _any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_to_dict(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_to_dict(attributes: Any) -> dict[str, Any]:
    """Repeated KeyValue -> {key: python value}; the last duplicate key wins."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in attributes:
        out[kv.key] = _any_value(kv.value)
    return out


def request_to_events(request: ExportTraceServiceRequest,
                      attribute_map: AttributeMap = DEFAULT_ATTRIBUTE_MAP) -> OtlpDecodeResult:
    """Walk resource -> scope -> span and map each span; ``event_index`` of a rejection is the
    span's position in that walk."""
    result = OtlpDecodeResult()
    index = 0
    for resource_spans in request.resource_spans:
        resource = attributes_to_dict(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                view = SpanView(
                    attributes=attributes_to_dict(span.attributes),
                    resource=resource,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    kind=span.kind,
                    is_error=span.status.code == Status.STATUS_CODE_ERROR,
                    span_id=span.span_id.hex(),
                )
                outcome = attribute_map.map_span(view)
                if outcome.event is not None:
                    result.events.append(outcome.event)
                    result.event_spans.append(index)
                elif outcome.skip_reason is not None:
                    result.skipped[outcome.skip_reason] += 1
                else:
                    result.rejections.append(Rejection(str(outcome.reject_code), str(outcome.reject_reason),
                                                       event_index=index))
                index += 1
    result.spans_total = index
    return result


def span_requests(request: ExportTraceServiceRequest,
                  positions: Iterable[int]) -> dict[int, ExportTraceServiceRequest]:
    """Each span at ``positions`` (of the walk in :func:`request_to_events`) as a request of its own,
    with its resource and scope: what a dead letter keeps of one rejected span, so that it can be
    fixed and sent again on its own. One pass over the request, whatever the number of positions.

    >>> from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
    >>> request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
    ...     spans=[Span(name="a"), Span(name="b"), Span(name="c")])])])
    >>> [r.resource_spans[0].scope_spans[0].spans[0].name for r in span_requests(request, [2, 0]).values()]
    ['a', 'c']
    """
    wanted = set(positions)
    out: dict[int, ExportTraceServiceRequest] = {}
    index = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if index in wanted:
                    single = ExportTraceServiceRequest()
                    target = single.resource_spans.add(resource=resource_spans.resource,
                                                       schema_url=resource_spans.schema_url)
                    target.scope_spans.add(scope=scope_spans.scope, schema_url=scope_spans.schema_url,
                                           spans=[span])
                    out[index] = single
                index += 1
    return out


def _base64_ids_to_hex(node: Any) -> None:
    """The inverse of :func:`_hex_ids_to_base64`, in place (protobuf's JSON mapping -> OTLP/JSON ids)."""
    if isinstance(node, dict):
        for key, child in node.items():
            if key in _ID_FIELDS and isinstance(child, str):
                node[key] = base64.b64decode(child).hex()
            elif isinstance(child, dict | list):
                _base64_ids_to_hex(child)
    elif isinstance(node, list):
        for child in node:
            _base64_ids_to_hex(child)


def encode_export_request(request: ExportTraceServiceRequest,
                          encoding: Literal["otlp_proto", "otlp_json"]) -> bytes:
    """An ExportTraceServiceRequest as protobuf bytes or OTLP/JSON (hex ids, integer enums,
    lowerCamelCase names, as the OTLP spec writes it); :func:`parse_export_request` reads both back.

    >>> from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
    >>> request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
    ...     spans=[Span(span_id=bytes.fromhex("00f067aa0ba902b7"), kind=Span.SPAN_KIND_SERVER)])])])
    >>> text = encode_export_request(request, "otlp_json")
    >>> b'"spanId":"00f067aa0ba902b7"' in text, b'"kind":2' in text
    (True, True)
    >>> parse_export_request(text, "otlp_json") == request == parse_export_request(
    ...     encode_export_request(request, "otlp_proto"), "otlp_proto")
    True
    """
    if encoding == "otlp_proto":
        return request.SerializeToString()
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    _base64_ids_to_hex(document)
    return orjson.dumps(document)


def encode_by_replica(events: list[dict[str, Any]],
                      max_events_per_message: int | None = None) -> list[tuple[bytes, bytes]]:
    """Events -> ``llm.requests`` messages ``(replica key, {"v": 1, "events": [...]})``, per replica,
    at most ``max_events_per_message`` events each (None: one message per replica).

    OTLP records are not keyed by replica (nil or trace-id keys), so a consumer of an OTLP topic must
    re-key before per-replica windows see the events: this is that step, shared with the receiver.
    The cap keeps a large export (16 MiB of spans is ~50 000 events) under the worker's
    ``limits.max_message_bytes`` (1 MiB), which would otherwise reject the whole message as too_large.

    >>> [key for key, _ in encode_by_replica([{"replica": "b"}, {"replica": "a"}, {"replica": "b"}])]
    [b'b', b'a']
    >>> [key for key, _ in encode_by_replica([{"replica": "b"}, {"replica": "a"}, {"replica": "b"}], 1)]
    [b'b', b'b', b'a']
    """
    if max_events_per_message is not None and max_events_per_message < 1:
        raise ValueError(f"max_events_per_message must be >= 1, got {max_events_per_message}")
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_replica.setdefault(str(event["replica"]), []).append(event)
    messages = []
    for replica, group in by_replica.items():
        step = max_events_per_message or len(group)
        messages += [(replica.encode(), encode_request_events(group[i:i + step])) for i in range(0, len(group), step)]
    return messages


def decode_otlp_traces(value: bytes | None, encoding: Encoding = "auto",
                       attribute_map: AttributeMap = DEFAULT_ATTRIBUTE_MAP) -> OtlpDecodeResult:
    """One Kafka record value (or HTTP body) -> events + skip counts + rejections. Never raises
    on bad input: an undecodable payload becomes one message-level ``malformed_otlp`` rejection."""
    if not value:
        # A zero-length protobuf is a valid, empty request; a null (tombstone) value is not OTLP.
        if value is None:
            return OtlpDecodeResult(rejections=[Rejection.message_level(
                MALFORMED_OTLP, "the record value is null; OTLP records always carry a payload")])
        return OtlpDecodeResult()
    try:
        request = parse_export_request(value, encoding)
    except OtlpDecodeError as exc:
        return OtlpDecodeResult(rejections=[Rejection.message_level(MALFORMED_OTLP, str(exc))])
    return request_to_events(request, attribute_map)
