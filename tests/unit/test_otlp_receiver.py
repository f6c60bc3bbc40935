"""The OTLP/HTTP receiver's answers per the OTLP/HTTP spec and its dead letters, with an in-memory
publisher; the dead letters also on the real broker (the last test); the SDK exporter -> receiver ->
Kafka path is tests/integration/test_otlp_receiver.py."""

from __future__ import annotations

import asyncio
import gzip
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiokafka import AIOKafkaConsumer
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.trace import SpanKind

from skewwatch.config import LimitSettings, Settings
from skewwatch.otlp.decode import parse_export_request
from skewwatch.otlp.receiver import JSON, PROTOBUF, KafkaPublisher, ListPublisher, OtlpReceiver
from skewwatch.schemas.dead_letter import decode_dead_letter
from skewwatch.schemas.requests import decode_request_message
from tests.unit.test_otlp_decode import T0_NS, record_spans, to_otlp_json, vllm_attributes, vllm_request
from tests.unit.test_schemas import DEAD_LETTER


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
    receiver = OtlpReceiver(publisher, max_decompressed_bytes=1 << 20)
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB of zeros in ~8 KiB
    async with TestClient(TestServer(receiver.app)) as small_client:
        response = await small_client.post("/v1/traces", data=bomb,
                                           headers={"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
        assert response.status == 413  # refused before it is interpreted: nothing to dead-letter
        assert "expands beyond" in Status.FromString(await response.read()).message
    assert publisher.dead_letters == [] and publisher.messages == []


# ---------------------------------------------------------------------------------------- dead letters
def mixed_export() -> ExportTraceServiceRequest:
    """Four spans of replica r1: good, wrong type, negative latency, not an inference span."""
    spans = [
        ("llm_request", SpanKind.SERVER, vllm_attributes(0), T0_NS, T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(1), "gen_ai.usage.prompt_tokens": "many"}, T0_NS,
         T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(2), "gen_ai.latency.e2e": -0.5}, T0_NS, T0_NS + 10**6),
        ("GET /health", SpanKind.SERVER, {"http.route": "/health"}, T0_NS, T0_NS + 10**6),
    ]
    return encode_spans(record_spans({"service.instance.id": "r1", "gen_ai.request.model": "m"}, spans))


def only_span(request: ExportTraceServiceRequest) -> Any:
    [resource_spans] = request.resource_spans
    [scope_spans] = resource_spans.scope_spans
    [span] = scope_spans.spans
    return span


@pytest.mark.parametrize("media_type", [PROTOBUF, JSON])
async def test_each_rejected_span_is_dead_lettered_alone_with_its_reason(client: TestClient, publisher: ListPublisher,
                                                                         media_type: str) -> None:
    export = mixed_export()
    body = export.SerializeToString() if media_type == PROTOBUF else to_otlp_json(export)
    response = await client.post("/v1/traces", data=body, headers={"Content-Type": media_type})
    assert response.status == 200
    assert len(publisher.dead_letters) == 2  # the /health span is skipped, not dead-lettered
    letters = [decode_dead_letter(value) for _key, value in publisher.dead_letters]
    for _key, value in publisher.dead_letters:
        DEAD_LETTER.validate(orjson.loads(value))  # the dead-letter.v1 contract
    assert [key for key, _ in publisher.dead_letters] == [b"r1", b"r1"]  # keyed by the span's replica
    assert [[r["reason_code"] for r in d["rejects"]] for d in letters] == [["wrong_type"], ["out_of_range"]]
    assert "gen_ai.usage.prompt_tokens" in letters[0]["rejects"][0]["reason"]
    assert letters[1]["rejects"][0]["reason"] == "request cmpl-2: latency_ms: must be ≥ 0, got -500.0"
    for letter, position in zip(letters, (1, 2), strict=True):
        assert letter["source_topic"] == "otlp-http:/v1/traces" and letter["rejects"][0]["event_index"] == 0
        assert letter["origin"]["span_index"] == position and letter["origin"]["content_type"] == media_type
        # the value is that span alone, resource and scope kept, in the request's encoding: fix and resend
        single = parse_export_request(letter["value"], "otlp_proto" if media_type == PROTOBUF else "otlp_json")
        original = export.resource_spans[0]
        assert single.resource_spans[0].resource == original.resource
        assert single.resource_spans[0].scope_spans[0].scope == original.scope_spans[0].scope
        assert only_span(single) == original.scope_spans[0].spans[position]
    assert (media_type == JSON) == letters[0]["value"].startswith(b"{")
    stats = await (await client.get("/stats")).json()
    assert stats["dead_letters_published"] == 2 and stats["skipped_not_inference"] == 1
    assert stats["rejected_wrong_type"] == 1 and stats["rejected_out_of_range"] == 1


@pytest.mark.parametrize(("media_type", "body"), [(PROTOBUF, b"\xff\xfe not protobuf"), (JSON, b"{oops")])
async def test_a_malformed_body_is_dead_lettered_whole(client: TestClient, publisher: ListPublisher,
                                                       media_type: str, body: bytes) -> None:
    response = await client.post("/v1/traces", data=body, headers={"Content-Type": media_type})
    assert response.status == 400
    [(key, value)] = publisher.dead_letters
    DEAD_LETTER.validate(orjson.loads(value))
    letter = decode_dead_letter(value)
    assert key is None and letter["value"] == body and letter["value_bytes"] == len(body)
    [reject] = letter["rejects"]
    assert reject["reason_code"] == "malformed_otlp" and reject["event_index"] is None
    assert reject["reason"] in (await response.text() if media_type == JSON else Status.FromString(
        await response.read()).message)
    assert letter["origin"]["content_encoding"] == "identity"
    stats = await (await client.get("/stats")).json()
    assert stats["rejected_malformed_otlp"] == 1 and stats["dead_letters_published"] == 1 and stats["http_400"] == 1
    assert publisher.messages == []


async def test_a_body_that_does_not_gunzip_is_dead_lettered_as_received(client: TestClient,
                                                                         publisher: ListPublisher) -> None:
    broken = gzip.compress(vllm_request(2).SerializeToString())[:-8]
    response = await client.post("/v1/traces", data=broken,
                                 headers={"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
    assert response.status == 400
    letter = decode_dead_letter(publisher.dead_letters[0][1])
    assert letter["value"] == broken and letter["origin"]["content_encoding"] == "gzip"
    assert letter["rejects"][0]["reason_code"] == "malformed_otlp"


async def test_a_gzip_request_whose_spans_would_outgrow_it_is_dead_lettered_as_received(
        client: TestClient, publisher: ListPublisher) -> None:
    export = mixed_export()
    body = gzip.compress(export.SerializeToString())
    response = await client.post("/v1/traces", data=body,
                                 headers={"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})
    assert response.status == 200
    [(key, value)] = publisher.dead_letters  # the two spans alone, decompressed, are larger than the request
    DEAD_LETTER.validate(orjson.loads(value))
    letter = decode_dead_letter(value)
    assert letter["value"] == body and letter["value_bytes"] == len(body) and not letter["value_truncated"]
    assert letter["origin"]["content_encoding"] == "gzip" and letter["origin"]["whole_request"] is True
    assert letter["origin"]["span_indexes"] == [1, 2]
    assert [r["reason_code"] for r in letter["rejects"]] == ["wrong_type", "out_of_range"]
    assert letter["rejects"][1]["reason"].startswith("span 2: request cmpl-2")
    assert parse_export_request(gzip.decompress(letter["value"]), "otlp_proto") == export  # replayable
    assert len(published_events(publisher)[b"r1"]) == 1  # the good span still goes through


def bad_spans_export(spans: int, resource_bytes: int) -> ExportTraceServiceRequest:
    """``spans`` spans with a negative latency, under one resource carrying ``resource_bytes`` of attributes."""
    resource = {"service.instance.id": "r1", "gen_ai.request.model": "m", "padding": "x" * resource_bytes}
    return encode_spans(record_spans(resource, [
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(i), "gen_ai.latency.e2e": -1.0}, T0_NS, T0_NS + 10**6)
        for i in range(spans)]))


@pytest.mark.parametrize("gzipped", [True, False])
async def test_dead_letters_never_outgrow_the_request(publisher: ListPublisher, gzipped: bool) -> None:
    """The amplification cap: 400 bad spans under a 4 KiB resource. Span by span, each dead letter would
    repeat the resource (~1.7 MB in all); stored, the original bytes never exceed the request as received,
    nor dead_letter_max_bytes, and the record says it was truncated."""
    raw = bad_spans_export(400, 4096).SerializeToString()
    body = gzip.compress(raw) if gzipped else raw
    headers = {"Content-Type": PROTOBUF, **({"Content-Encoding": "gzip"} if gzipped else {})}
    cap = 64 * 1024
    receiver = OtlpReceiver(publisher, dead_letter_max_bytes=cap)
    async with TestClient(TestServer(receiver.app)) as small_client:
        response = await small_client.post("/v1/traces", data=body, headers=headers)
        assert response.status == 200
    letters = [decode_dead_letter(value) for _key, value in publisher.dead_letters]
    stored = sum(len(letter["value"]) for letter in letters)
    assert stored <= min(len(body), cap)
    assert sum(len(value) for _key, value in publisher.dead_letters) <= len(body) * 4 // 3 + 64 * 1024  # the record
    [letter] = letters
    assert letter["rejects_total"] == 400 and letter["rejects_by_code"] == {"out_of_range": 400}
    assert letter["value_bytes"] == len(body) and letter["value_truncated"] == (len(body) > cap)
    assert letter["value"] == body[:cap]


async def test_a_malformed_body_is_capped(publisher: ListPublisher) -> None:
    receiver = OtlpReceiver(publisher, dead_letter_max_bytes=1000)
    async with TestClient(TestServer(receiver.app)) as small_client:
        response = await small_client.post("/v1/traces", data=b"\xff" * 5000, headers={"Content-Type": PROTOBUF})
        assert response.status == 400
    [(_key, value)] = publisher.dead_letters
    letter = decode_dead_letter(value)
    assert letter["value"] == b"\xff" * 1000 and letter["value_bytes"] == 5000 and letter["value_truncated"]


async def test_a_body_above_the_limit_is_413_and_not_dead_lettered(publisher: ListPublisher) -> None:
    receiver = OtlpReceiver(publisher, max_body_bytes=1024)
    async with TestClient(TestServer(receiver.app)) as small_client:
        response = await small_client.post("/v1/traces", data=b"x" * 4096, headers={"Content-Type": PROTOBUF})
        assert response.status == 413
    assert publisher.dead_letters == []


async def test_refusals_are_logged_once_per_interval_with_a_count(publisher: ListPublisher,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    receiver = OtlpReceiver(publisher, log_interval_s=3600)
    async with TestClient(TestServer(receiver.app)) as small_client:
        for _ in range(50):
            response = await small_client.post("/v1/traces", data=b"x", headers={"Content-Type": "text/plain"})
            assert response.status == 415
    lines = [r for r in caplog.records if r.name == "skewwatch.otlp.receiver"]
    assert len(lines) == 1 and "answered 415" in lines[0].getMessage()
    assert receiver.stats["http_415"] == 50


async def test_refused_requests_are_not_dead_lettered(client: TestClient, publisher: ListPublisher) -> None:
    publisher.is_ready = False  # 503: the sender retries the same body
    response = await client.post("/v1/traces", data=b"garbage", headers={"Content-Type": PROTOBUF})
    assert response.status == 503
    status = Status.FromString(await response.read())
    assert status.code == 14 and "retry later" in status.message  # google.rpc.Code UNAVAILABLE
    publisher.is_ready = True
    response = await client.post("/v1/traces", data=b"garbage", headers={"Content-Type": "text/plain"})
    assert response.status == 415  # the body was never interpreted
    assert Status.FromString(await response.read()).code == 3  # INVALID_ARGUMENT, protobuf for a non-OTLP type
    assert publisher.dead_letters == []


async def test_error_status_body_follows_the_request_encoding(client: TestClient) -> None:
    response = await client.post("/v1/traces", data=b"{", headers={"Content-Type": JSON, "Content-Encoding": "br"})
    assert response.status == 415 and response.content_type == JSON
    status = json_format.Parse(await response.text(), Status())
    assert status.code == 3 and "Content-Encoding" in status.message


async def test_a_span_without_replica_is_dead_lettered_without_a_key(client: TestClient,
                                                                      publisher: ListPublisher) -> None:
    spans = [("llm_request", SpanKind.SERVER, vllm_attributes(0), T0_NS, T0_NS + 10**6)]
    export = encode_spans(record_spans({"gen_ai.request.model": "m"}, spans))
    attributes = export.resource_spans[0].resource.attributes
    kept = [kv for kv in attributes if kv.key != "service.instance.id"]  # the SDK invents one: remove it
    del attributes[:]
    attributes.extend(kept)
    body = export.SerializeToString()
    assert (await client.post("/v1/traces", data=body, headers={"Content-Type": PROTOBUF})).status == 200
    [(key, value)] = publisher.dead_letters
    assert key is None and decode_dead_letter(value)["rejects"][0]["reason_code"] == "missing_field"


async def test_batch_fields_are_optional_and_checked_when_present(client: TestClient, publisher: ListPublisher) -> None:
    """Contract v1.1 (no placeholders any more): no batch size is fine, a size alone is fine, a size above
    the capacity is rejected like the worker rejects it."""
    spans = [
        ("llm_request", SpanKind.SERVER, vllm_attributes(0), T0_NS, T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(1), "skewwatch.batch_size": 12}, T0_NS, T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, {**vllm_attributes(2), "skewwatch.batch_size": 40,
                                          "skewwatch.batch_capacity": 32}, T0_NS, T0_NS + 10**6),
    ]
    body = encode_spans(record_spans({"service.instance.id": "r1", "gen_ai.request.model": "m"}, spans))
    response = await client.post("/v1/traces", data=body.SerializeToString(), headers={"Content-Type": PROTOBUF})
    assert response.status == 200
    events = published_events(publisher)[b"r1"]
    assert [(e["request_id"], e.get("batch_size"), e.get("batch_capacity")) for e in events] == [
        ("cmpl-0", None, None), ("cmpl-1", 12, None)]
    [(_key, value)] = publisher.dead_letters
    [reject] = decode_dead_letter(value)["rejects"]
    assert reject["reason_code"] == "batch_over_capacity" and "batch_size: 40 > batch_capacity 32" in reject["reason"]


async def test_an_empty_body_is_an_empty_export(client: TestClient, publisher: ListPublisher) -> None:
    for media_type in (PROTOBUF, JSON):
        response = await client.post("/v1/traces", data=b"", headers={"Content-Type": media_type})
        assert response.status == 200
    assert publisher.messages == [] and publisher.dead_letters == []


async def test_dead_letters_reach_the_real_broker(kafka_settings: Settings) -> None:
    """The receiver on a real broker: a body that is not OTLP and a span the worker would reject come
    back from the dead-letter topic with their bytes and reasons; the good span goes to the request topic."""
    bootstrap, topics = kafka_settings.kafka.bootstrap, kafka_settings.topics
    assert bootstrap
    publisher = KafkaPublisher(bootstrap, topics.requests, dead_letter_topic=topics.dead_letter)
    await publisher.start()
    receiver = OtlpReceiver(publisher)
    try:
        async with TestClient(TestServer(receiver.app)) as real_client:
            async with asyncio.timeout(30):  # the receiver answers 503 until both producers reached the broker
                while not publisher.ready():
                    await asyncio.sleep(0.1)
            bad_body = b"\x0a\x05not an OTLP export at all"
            response = await real_client.post("/v1/traces", data=bad_body, headers={"Content-Type": PROTOBUF})
            assert response.status == 400
            export = mixed_export()
            response = await real_client.post("/v1/traces", data=export.SerializeToString(),
                                              headers={"Content-Type": PROTOBUF})
            assert response.status == 200
            letters = await consume(bootstrap, topics.dead_letter, 3)
            events = await consume(bootstrap, topics.requests, 1)
    finally:
        await publisher.close()
    assert publisher.dead_letters.dropped_total == 0 and publisher.dead_letters.sent_total == 3
    by_code = {decode_dead_letter(value)["rejects"][0]["reason_code"]: (key, decode_dead_letter(value))
               for key, value in letters}
    assert sorted(by_code) == ["malformed_otlp", "out_of_range", "wrong_type"]
    key, malformed = by_code["malformed_otlp"]
    assert key is None and malformed["value"] == bad_body
    assert malformed["rejects"][0]["reason"].startswith("not a protobuf ExportTraceServiceRequest")
    key, negative = by_code["out_of_range"]
    assert key == b"r1" and "latency_ms: must be ≥ 0" in negative["rejects"][0]["reason"]
    assert only_span(parse_export_request(negative["value"], "otlp_proto")) == export.resource_spans[0].scope_spans[
        0].spans[2]
    [(key, value)] = events
    assert key == b"r1" and [e["request_id"] for e in orjson.loads(value)["events"]] == ["cmpl-0"]
    assert receiver.stats["dead_letters_published"] == 3 and receiver.stats["rejected_malformed_otlp"] == 1


async def consume(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[tuple[bytes | None, bytes]]:
    """(key, value) of the first ``count`` records of ``topic``."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"dlq-test-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest")
    await consumer.start()
    out: list[tuple[bytes | None, bytes]] = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < count:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend((record.key, record.value) for record in records)
    finally:
        await consumer.stop()
    return out


async def test_a_large_export_is_split_into_messages_the_worker_accepts() -> None:
    """A 2500-span export of one replica: messages of at most max_events_per_message events, each under the
    worker's message limit and accepted whole by its decoder, in the export's order."""
    publisher = ListPublisher()
    async with TestClient(TestServer(OtlpReceiver(publisher, max_events_per_message=1000).app)) as small_client:
        body = vllm_request(2500, replica="big").SerializeToString()
        response = await small_client.post("/v1/traces", data=body, headers={"Content-Type": PROTOBUF})
        assert response.status == 200
    assert [len(orjson.loads(value)["events"]) for _key, value in publisher.messages] == [1000, 1000, 500]
    limits = LimitSettings()
    ids = []
    for key, value in publisher.messages:
        assert key == b"big" and len(value) < limits.max_message_bytes
        decoded = decode_request_message(value, limits)
        assert decoded.rejects == []
        ids += [e["request_id"] for e in orjson.loads(value)["events"]]
    assert ids == [f"cmpl-{i}" for i in range(2500)]
    with pytest.raises(ValueError):
        OtlpReceiver(publisher, max_events_per_message=0)
