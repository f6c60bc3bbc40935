"""OTLP payloads (protobuf from the real OpenTelemetry SDK encoder, OTLP/JSON as the Collector writes it)
decode to the right contract-v1 events; other spans are skipped and counted; bad input is rejected."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, SpanView
from skewwatch.otlp.decode import MALFORMED_OTLP, Encoding, decode_otlp_traces, detect_encoding, encode_by_replica

T0_NS = 1_700_000_000_000_000_000  # a fixed epoch in nanoseconds


def vllm_attributes(i: int) -> dict[str, Any]:
    """The attributes vLLM's OutputProcessor.do_tracing puts on an ``llm_request`` span (seconds)."""
    return {
        "gen_ai.request.id": f"cmpl-{i}",
        "gen_ai.usage.prompt_tokens": 100 + i,
        "gen_ai.usage.completion_tokens": 20 + i,
        "gen_ai.latency.time_to_first_token": 0.05 + i / 1000,
        "gen_ai.latency.e2e": 0.5 + i / 100,
        "gen_ai.latency.time_in_queue": 0.01,
        "gen_ai.latency.time_in_model_prefill": 0.03,
        "gen_ai.latency.time_in_model_decode": 0.4,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.n": 1,
    }


def record_spans(resource: Mapping[str, Any], spans: Sequence[tuple[str, SpanKind, Mapping[str, Any], int, int]],
                 error: bool = False) -> list[ReadableSpan]:
    """Spans made by a real SDK tracer: (name, kind, attributes, start_ns, end_ns)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(dict(resource)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.llm_engine")
    for name, kind, attributes, start_ns, end_ns in spans:
        span = tracer.start_span(name, kind=kind, attributes=dict(attributes), start_time=start_ns)
        if error:
            span.set_status(Status(StatusCode.ERROR, "engine dead"))
        span.end(end_time=end_ns)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def vllm_request(n: int, replica: str = "vllm-0", model: str = "meta-llama/Llama-3.1-8B-Instruct",
                 t0_ns: int = T0_NS) -> ExportTraceServiceRequest:
    """What vLLM's OTLP exporter sends for ``n`` finished requests (protobuf, via the SDK's encoder)."""
    spans = [("llm_request", SpanKind.SERVER, vllm_attributes(i), t0_ns + i * 10**9, t0_ns + i * 10**9 + 600_000_000)
             for i in range(n)]
    resource = {"service.name": "vllm", "service.instance.id": replica, "gen_ai.request.model": model}
    return encode_spans(record_spans(resource, spans))


def to_otlp_json(request: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the Collector's pdata JSON marshaler writes it: camelCase, hex ids, int64 as strings."""
    document = json_format.MessageToDict(request)  # camelCase, int64 as strings, ids base64

    def hexify(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                else:
                    hexify(value)
        elif isinstance(node, list):
            for item in node:
                hexify(item)

    hexify(document)
    return orjson.dumps(document)


def test_vllm_protobuf_spans_become_events() -> None:
    request = vllm_request(3)
    result = decode_otlp_traces(request.SerializeToString(), "otlp_proto")
    assert result.rejections == [] and not result.skipped and result.spans_total == 3
    by_id = {e["request_id"]: e for e in result.events}
    assert set(by_id) == {"cmpl-0", "cmpl-1", "cmpl-2"}
    e = by_id["cmpl-2"]
    assert e["model"] == "meta-llama/Llama-3.1-8B-Instruct" and e["replica"] == "vllm-0"
    assert e["prompt_tokens"] == 102 and e["completion_tokens"] == 22
    assert e["latency_ms"] == pytest.approx(520.0) and e["ttft_ms"] == pytest.approx(52.0)
    assert e["ts"] == pytest.approx((T0_NS + 2 * 10**9 + 600_000_000) / 1e9)  # span end = request finished
    assert e["status"] == "ok"
    assert "batch_size" not in e and "batch_capacity" not in e  # vLLM spans carry no batch size
    assert "queue_time_ms" not in e  # no contract field for the queue wait (yet)


def test_json_encoding_decodes_to_the_same_events() -> None:
    request = vllm_request(4)
    proto = decode_otlp_traces(request.SerializeToString(), "otlp_proto")
    as_json = to_otlp_json(request)
    assert b'"traceId":"' in as_json and b'"startTimeUnixNano":"' in as_json  # hex ids, int64 as strings
    encodings: tuple[Encoding, ...] = ("otlp_json", "auto")
    for encoding in encodings:
        decoded = decode_otlp_traces(as_json, encoding)
        assert decoded.rejections == []
        assert decoded.events == proto.events


COLLECTOR_JSON = b"""{"resourceSpans":[{"resource":{"attributes":[
  {"key":"service.name","value":{"stringValue":"sglang"}},
  {"key":"k8s.pod.name","value":{"stringValue":"llm-7f9c-0"}},
  {"key":"host.name","value":{"stringValue":"gpu-node-3"}}]},
 "scopeSpans":[{"scope":{"name":"genai"},"spans":[
  {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","parentSpanId":"",
   "name":"chat llama","kind":2,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000750000000",
   "attributes":[
    {"key":"gen_ai.request.model","value":{"stringValue":"llama-3-70b"}},
    {"key":"gen_ai.usage.input_tokens","value":{"intValue":"812"}},
    {"key":"gen_ai.usage.output_tokens","value":{"intValue":64}},
    {"key":"gen_ai.server.time_to_first_token","value":{"doubleValue":0.125}},
    {"key":"skewwatch.batch_size","value":{"intValue":"12"}},
    {"key":"skewwatch.batch_capacity","value":{"intValue":"64"}}],
   "status":{"code":"STATUS_CODE_ERROR"},"futureField":{"ignored":true}},
  {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"aaa19b7ec3c1b174",
   "name":"GET /health","kind":"SPAN_KIND_SERVER","startTimeUnixNano":"1700000000000000000",
   "endTimeUnixNano":"1700000000001000000","attributes":[{"key":"http.route","value":{"stringValue":"/health"}}]}
 ]}]}]}"""


def test_collector_otlp_json_with_semconv_names() -> None:
    """Hand-written the way the Collector's otlp_json encoding looks: hex ids, int64 as strings and as
    numbers, enums by number and by name, an unknown field (must be ignored per the OTLP spec)."""
    result = decode_otlp_traces(COLLECTOR_JSON, "otlp_json")
    assert result.rejections == []
    assert result.skipped == {"not_inference": 1} and result.spans_total == 2
    [event] = result.events
    assert event == {
        "model": "llama-3-70b",
        "prompt_tokens": 812,
        "completion_tokens": 64,
        "ttft_ms": 125.0,
        "batch_size": 12,
        "batch_capacity": 64,
        "replica": "llm-7f9c-0",  # k8s.pod.name: service.instance.id is absent, it comes before host.name
        "ts": 1700000000.75,
        "latency_ms": 750.0,  # no gen_ai.latency.e2e: span end - start
        "request_id": "eee19b7ec3c1b174",  # no request id attribute: the span id
        "status": "error",
    }


def collector_kafka_records(request: ExportTraceServiceRequest, encoding: str = "otlp_proto",
                            partition_traces_by_id: bool = False) -> list[tuple[bytes | None, bytes]]:
    """(key, value) records exactly as the Collector's Kafka exporter writes ``request``: one whole
    ExportTraceServiceRequest per record, no envelope; key nil, or with ``partition_traces_by_id`` one
    record per trace keyed by the trace id in hex. (For the worker's tests too.)"""
    def encode(part: ExportTraceServiceRequest) -> bytes:
        return to_otlp_json(part) if encoding == "otlp_json" else part.SerializeToString()

    if not partition_traces_by_id:
        return [(None, encode(request))]
    traces: dict[bytes, ExportTraceServiceRequest] = {}
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                part = traces.setdefault(span.trace_id, ExportTraceServiceRequest())
                rs = part.resource_spans.add(resource=resource_spans.resource, schema_url=resource_spans.schema_url)
                rs.scope_spans.add(scope=scope_spans.scope, schema_url=scope_spans.schema_url).spans.append(span)
    return [(trace_id.hex().encode(), encode(part)) for trace_id, part in traces.items()]


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_kafka_exporter_framing_one_request_per_record_split_by_trace(encoding: Encoding) -> None:
    """With partition_traces_by_id the Collector writes one ExportTraceServiceRequest per trace, keyed by
    the trace id: each record decodes on its own, and none of them is keyed by replica."""
    records = collector_kafka_records(vllm_request(3), encoding, partition_traces_by_id=True)
    assert len(records) == 3 and all(key is not None and len(key) == 32 for key, _ in records)
    events = [e for _key, value in records for e in decode_otlp_traces(value, encoding).events]
    assert sorted(e["request_id"] for e in events) == ["cmpl-0", "cmpl-1", "cmpl-2"]
    [(key, whole)] = collector_kafka_records(vllm_request(3), encoding)
    assert key is None and len(decode_otlp_traces(whole, encoding).events) == 3


def test_non_request_spans_are_skipped_and_counted_not_rejected() -> None:
    resource = {"service.instance.id": "vllm-0", "gen_ai.request.model": "m"}
    tokens = {"gen_ai.usage.prompt_tokens": 5, "gen_ai.usage.completion_tokens": 6}
    spans: list[tuple[str, SpanKind, Mapping[str, Any], int, int]] = [
        ("GET /metrics", SpanKind.SERVER, {"http.route": "/metrics"}, T0_NS, T0_NS + 1000),
        ("chat m", SpanKind.CLIENT, tokens, T0_NS, T0_NS + 1000),  # the caller's view of the same request
        ("embeddings", SpanKind.SERVER, {"gen_ai.usage.input_tokens": 9}, T0_NS, T0_NS + 1000),
    ]
    payload = encode_spans(record_spans(resource, spans)).SerializeToString()
    result = decode_otlp_traces(payload)
    assert result.events == [] and result.rejections == []
    assert result.skipped == {"not_inference": 1, "span_kind": 1, "incomplete_tokens": 1}


def test_model_from_span_resource_or_default_else_skipped() -> None:
    tokens = {"gen_ai.usage.prompt_tokens": 5, "gen_ai.usage.completion_tokens": 6}
    span = [("llm_request", SpanKind.SERVER, tokens, T0_NS, T0_NS + 10**6)]
    payload = encode_spans(record_spans({"service.instance.id": "r"}, span)).SerializeToString()
    assert decode_otlp_traces(payload).skipped == {"no_model": 1}
    with_default = DEFAULT_ATTRIBUTE_MAP.with_overrides({"default_model": "served-name"})
    assert decode_otlp_traces(payload, attribute_map=with_default).events[0]["model"] == "served-name"
    on_span = [("llm_request", SpanKind.SERVER, {**tokens, "gen_ai.response.model": "span-model"}, T0_NS, T0_NS + 1)]
    payload = encode_spans(record_spans({"service.instance.id": "r", "gen_ai.request.model": "res"},
                                        on_span)).SerializeToString()
    assert decode_otlp_traces(payload, attribute_map=with_default).events[0]["model"] == "span-model"


def test_replica_identity_order_is_configurable() -> None:
    resource = {"service.instance.id": "inst-1", "k8s.pod.name": "pod-1", "host.name": "host-1",
                "gen_ai.request.model": "m"}
    span = [("llm_request", SpanKind.SERVER, vllm_attributes(0), T0_NS, T0_NS + 10**6)]
    payload = encode_spans(record_spans(resource, span)).SerializeToString()
    assert decode_otlp_traces(payload).events[0]["replica"] == "inst-1"
    pods_first = DEFAULT_ATTRIBUTE_MAP.with_overrides({"replica_keys": ["k8s.pod.name", "service.instance.id"]})
    assert decode_otlp_traces(payload, attribute_map=pods_first).events[0]["replica"] == "pod-1"


def test_span_without_replica_identity_is_rejected_with_the_fix() -> None:
    span = [("llm_request", SpanKind.SERVER, vllm_attributes(0), T0_NS, T0_NS + 10**6)]
    payload = encode_spans(record_spans({"service.name": "vllm", "gen_ai.request.model": "m"}, span))
    # Recent SDKs invent a random service.instance.id per process; a server with an older SDK has none.
    resource = payload.resource_spans[0].resource
    kept = [kv for kv in resource.attributes if kv.key != "service.instance.id"]
    del resource.attributes[:]
    resource.attributes.extend(kept)
    result = decode_otlp_traces(payload.SerializeToString())
    [rejection] = result.rejections
    assert rejection.reason_code == "missing_field" and rejection.event_index == 0
    assert "service.instance.id" in rejection.reason and "OTEL_RESOURCE_ATTRIBUTES" in rejection.reason


def test_wrong_attribute_type_rejects_only_that_span() -> None:
    good = vllm_attributes(0)
    bad = {**vllm_attributes(1), "gen_ai.usage.completion_tokens": "twenty"}
    spans = [("llm_request", SpanKind.SERVER, attrs, T0_NS, T0_NS + 10**6) for attrs in (good, bad)]
    payload = encode_spans(record_spans({"service.instance.id": "r", "gen_ai.request.model": "m"}, spans))
    result = decode_otlp_traces(payload.SerializeToString())
    assert [e["request_id"] for e in result.events] == ["cmpl-0"]
    [rejection] = result.rejections
    assert (rejection.reason_code, rejection.event_index) == ("wrong_type", 1)
    assert "gen_ai.usage.completion_tokens" in rejection.reason and "'twenty'" in rejection.reason
    assert result.rejected_spans == 1 and not result.is_malformed


def test_error_status_and_integral_double_tokens() -> None:
    attrs = {**vllm_attributes(0), "gen_ai.usage.prompt_tokens": 7.0}  # some SDKs send counts as doubles
    span = [("llm_request", SpanKind.SERVER, attrs, T0_NS, T0_NS + 10**6)]
    payload = encode_spans(record_spans({"service.instance.id": "r", "gen_ai.request.model": "m"}, span,
                                        error=True))
    [event] = decode_otlp_traces(payload.SerializeToString()).events
    assert event["status"] == "error" and event["prompt_tokens"] == 7 and type(event["prompt_tokens"]) is int


@pytest.mark.parametrize(("payload", "encoding", "fragment"), [
    (b"\xff\xfe garbage", "otlp_proto", "not a protobuf"),
    (b"{not json", "otlp_json", "not JSON"),
    (b'{"resourceSpans": 3}', "otlp_json", "resourceSpans"),
    (b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"zz"}]}]}]}', "otlp_json", "not a hex id"),
    (b"[1, 2]", "otlp_json", "must be an object"),
    (b"\x08\x96\x01", "otlp_proto", "hold no resource_spans"),  # parses, but only as unknown fields
])
def test_malformed_otlp_is_one_message_level_rejection(payload: bytes, encoding: str, fragment: str) -> None:
    result = decode_otlp_traces(payload, encoding)  # type: ignore[arg-type]
    assert result.events == [] and result.is_malformed
    [rejection] = result.rejections
    assert rejection.reason_code == MALFORMED_OTLP and rejection.event_index is None
    assert fragment in rejection.reason


def test_a_metrics_payload_on_the_traces_topic_yields_no_events() -> None:
    """Protobuf cannot tell OTLP metrics from traces (both start with field 1); nothing may come out."""
    metrics = MetricsData()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name, metric.unit = "gen_ai.usage.input_tokens", "token"
    result = decode_otlp_traces(metrics.SerializeToString(), "otlp_proto")
    assert result.events == []


def test_null_and_empty_values() -> None:
    assert decode_otlp_traces(None).rejections[0].reason_code == MALFORMED_OTLP  # a tombstone
    empty = decode_otlp_traces(b"")  # a valid, empty ExportTraceServiceRequest
    assert (empty.events, empty.rejections, empty.spans_total) == ([], [], 0)


def test_detect_encoding_and_unknown_encoding() -> None:
    assert detect_encoding(vllm_request(1).SerializeToString()) == "otlp_proto"
    assert detect_encoding(b'\n  {"resourceSpans": []}') == "otlp_json"
    with pytest.raises(ValueError, match="unknown OTLP encoding"):
        decode_otlp_traces(b"x", "otlp_yaml")  # type: ignore[arg-type]


def test_docs_table_matches_the_attribute_map() -> None:
    """docs/connect.md lists every rule of the default map with its attributes in priority order."""
    from pathlib import Path

    from skewwatch.otlp.attribute_map import attribute_table

    doc = (Path(__file__).parents[2] / "docs" / "connect.md").read_text()
    for field, keys, _conversion in attribute_table():
        assert f"| `{field}` | `{keys}` |" in doc, f"docs/connect.md: row for {field} should list `{keys}`"


def test_attribute_map_overrides_from_config_strings_and_lists() -> None:
    amap = DEFAULT_ATTRIBUTE_MAP.with_overrides({
        "replica_keys": "k8s.pod.name, host.name",  # an env var / CLI value
        "span_kinds": ["SERVER", "SPAN_KIND_CLIENT"],  # a TOML list, either spelling
        "fields": {"prompt_tokens": "my.in", "completion_tokens": ["my.out"]},
    })
    assert amap.replica_keys == ("k8s.pod.name", "host.name")
    view = SpanView(attributes={"my.in": 3, "my.out": 4, "gen_ai.request.model": "m"},
                    resource={"host.name": "h1"}, start_ns=T0_NS, end_ns=T0_NS + 10**6, kind=3)  # CLIENT
    out = amap.map_span(view)
    assert out.event is not None and (out.event["prompt_tokens"], out.event["replica"]) == (3, "h1")
    for bad in ({"span_kinds": ["SEVER"]}, {"fields": {"tokens": ["x"]}}, {"replica_key": ["x"]}):
        with pytest.raises(ValueError):
            DEFAULT_ATTRIBUTE_MAP.with_overrides(bad)


def test_encode_by_replica_makes_one_contract_message_per_replica() -> None:
    events = decode_otlp_traces(vllm_request(2, replica="a").SerializeToString()).events
    events += decode_otlp_traces(vllm_request(3, replica="b").SerializeToString()).events
    messages = dict(encode_by_replica(events))
    assert sorted(messages) == [b"a", b"b"]
    assert [e["replica"] for e in orjson.loads(messages[b"b"])["events"]] == ["b", "b", "b"]
