"""The OTLP/HTTP receiver's answers per the OTLP/HTTP spec, with an in-memory publisher (the real
Kafka path is tests/integration/test_otlp_receiver.py)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.trace import SpanKind

from skewwatch.otlp.receiver import JSON, PROTOBUF, ListPublisher, OtlpReceiver
from tests.unit.test_otlp_decode import T0_NS, record_spans, to_otlp_json, vllm_attributes, vllm_request


@pytest.fixture
def publisher() -> ListPublisher:
    return ListPublisher()


@pytest.fixture
async def client(publisher: ListPublisher) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(OtlpReceiver(publisher).app)) as test_client:
        yield test_client


def published_events(publisher: ListPublisher) -> dict[bytes, list[dict]]:
    out: dict[bytes, list[dict]] = {}
    for key, value in publisher.messages:
        message = orjson.loads(value)
        assert message["v"] == 1
        out.setdefault(key, []).extend(message["events"])
    return out


async def test_protobuf_export_is_published_per_replica(client: TestClient, publisher: ListPublisher) -> None:
    body = vllm_request(3, replica="vllm-0").SerializeToString()
    body_b = vllm_request(2, replica="vllm-1").SerializeToString()
    for payload in (body, body_b):
        response = await client.post("/v1/traces", data=payload, headers={"Content-Type": PROTOBUF})
        assert response.status == 200 and response.content_type == PROTOBUF
        answer = ExportTraceServiceResponse.FromString(await response.read())
        assert not answer.HasField("partial_success")  # everything accepted
    by_key = published_events(publisher)
    assert sorted(by_key) == [b"vllm-0", b"vllm-1"]  # keyed by replica, one message per replica per export
    assert len(publisher.messages) == 2
    assert [e["request_id"] for e in by_key[b"vllm-0"]] == ["cmpl-0", "cmpl-1", "cmpl-2"]
    assert all(e["replica"] == "vllm-0" for e in by_key[b"vllm-0"])


async def test_json_export_gets_a_json_answer(client: TestClient, publisher: ListPublisher) -> None:
    body = to_otlp_json(vllm_request(2))
    response = await client.post("/v1/traces", data=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert response.status == 200 and response.content_type == JSON
    json_format.Parse(await response.text(), ExportTraceServiceResponse())  # a valid OTLP/JSON response
    assert len(published_events(publisher)[b"vllm-0"]) == 2


async def test_gzip_body(client: TestClient, publisher: ListPublisher) -> None:
    body = gzip.compress(vllm_request(2).SerializeToString())
    response = await client.post("/v1/traces", data=body,
                                 headers={"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
    assert response.status == 200
    assert len(published_events(publisher)[b"vllm-0"]) == 2
    broken = await client.post("/v1/traces", data=body[:-8],
                               headers={"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
    assert broken.status == 400


@pytest.mark.parametrize("headers", [
    {"Content-Type": "text/plain"},
    {"Content-Type": "application/grpc"},
    {"Content-Type": PROTOBUF, "Content-Encoding": "br"},
])
async def test_unsupported_media_is_415(client: TestClient, publisher: ListPublisher, headers: dict) -> None:
    response = await client.post("/v1/traces", data=vllm_request(1).SerializeToString(), headers=headers)
    assert response.status == 415
    assert publisher.messages == []


async def test_undecodable_body_is_400_with_a_status_reason(client: TestClient, publisher: ListPublisher) -> None:
    response = await client.post("/v1/traces", data=b"\xff\xfe not protobuf", headers={"Content-Type": PROTOBUF})
    assert response.status == 400
    status = Status.FromString(await response.read())
    assert "not a protobuf ExportTraceServiceRequest" in status.message
    response = await client.post("/v1/traces", data=b"{oops", headers={"Content-Type": JSON})
    assert response.status == 400 and "not JSON" in json_format.Parse(await response.text(), Status()).message
    assert publisher.messages == []


async def test_partial_success_counts_rejected_spans_and_says_why(client: TestClient,
                                                                   publisher: ListPublisher) -> None:
    spans = [
        ("llm_request", SpanKind.SERVER, vllm_attributes(0), T0_NS, T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(1), "gen_ai.usage.prompt_tokens": "many"}, T0_NS,
         T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(2), "gen_ai.latency.e2e": -0.5}, T0_NS, T0_NS + 10**6),
        ("GET /health", SpanKind.SERVER, {"http.route": "/health"}, T0_NS, T0_NS + 10**6),  # skipped, not an error
    ]
    body = encode_spans(record_spans({"service.instance.id": "r1", "gen_ai.request.model": "m"}, spans))
    response = await client.post("/v1/traces", data=body.SerializeToString(), headers={"Content-Type": PROTOBUF})
    assert response.status == 200
    answer = ExportTraceServiceResponse.FromString(await response.read())
    assert answer.partial_success.rejected_spans == 2
    assert "gen_ai.usage.prompt_tokens" in answer.partial_success.error_message
    assert "latency_ms: must be ≥ 0, got -500.0" in answer.partial_success.error_message  # the worker's words
    assert [e["request_id"] for e in published_events(publisher)[b"r1"]] == ["cmpl-0"]
    stats = await (await client.get("/stats")).json()
    assert stats["skipped_not_inference"] == 1 and stats["events_published"] == 1
    assert stats["rejected_wrong_type"] == 1 and stats["rejected_out_of_range"] == 1


async def test_kafka_unreachable_is_503_with_retry_after(client: TestClient, publisher: ListPublisher) -> None:
    publisher.is_ready = False
    response = await client.post("/v1/traces", data=vllm_request(1).SerializeToString(),
                                 headers={"Content-Type": PROTOBUF})
    assert response.status == 503 and response.headers["Retry-After"]
    assert publisher.messages == []


async def test_gzip_bomb_is_refused_not_inflated(publisher: ListPublisher) -> None:
    receiver = OtlpReceiver(publisher, max_body_bytes=1 << 20)
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB of zeros in ~8 KiB
    async with TestClient(TestServer(receiver.app)) as small_client:
        response = await small_client.post("/v1/traces", data=bomb,
                                           headers={"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
        assert response.status == 400
        assert "expands beyond" in Status.FromString(await response.read()).message
