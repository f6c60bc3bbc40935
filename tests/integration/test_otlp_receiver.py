"""A real OpenTelemetry SDK tracer with the OTLP/HTTP exporter -> `skewwatch otlp-receiver` -> the real
broker: vLLM-shaped spans come out of the request topic as contract-v1 events, keyed by replica."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from skewwatch.config import Settings
from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP
from skewwatch.otlp.receiver import JSON, KafkaPublisher, OtlpReceiver, serve
from skewwatch.ports import free_port
from skewwatch.schemas.requests import decode_request_message
from tests.unit.test_otlp_decode import T0_NS, to_otlp_json, vllm_attributes, vllm_request


async def consume_events(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[tuple[bytes, dict]]:
    """(key, event) for every event in the topic's messages, until ``count`` events were read."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"otlp-test-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest")
    await consumer.start()
    out: list[tuple[bytes, dict]] = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < count:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for record in records:
                        out.extend((record.key, event) for event in orjson.loads(record.value)["events"])
    finally:
        await consumer.stop()
    return out


def emit_vllm_spans(endpoint: str, replica: str, model: str, n: int) -> None:
    """What a vLLM server started with --otlp-traces-endpoint does: one SERVER span per finished request,
    exported by the SDK's BatchSpanProcessor and OTLP/HTTP protobuf exporter. Blocking: run in a thread."""
    resource = Resource.create({"service.name": "vllm", "service.instance.id": replica})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=10)))
    tracer = provider.get_tracer("vllm.llm_engine")
    now_ns = time.time_ns()
    for i in range(n):
        start = now_ns - 2_000_000_000 + i * 1_000_000
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=start,
                                 attributes={**vllm_attributes(i), "gen_ai.request.id": f"{replica}-{i}",
                                             "gen_ai.response.model": model})
        span.end(end_time=start + 600_000_000)
    assert provider.force_flush(timeout_millis=20_000)
    provider.shutdown()


@pytest.fixture
async def receiver_url(kafka_settings: Settings) -> Any:
    assert kafka_settings.kafka.bootstrap
    publisher = KafkaPublisher(kafka_settings.kafka.bootstrap, kafka_settings.topics.requests,
                               dead_letter_topic=kafka_settings.topics.dead_letter)
    await publisher.start()
    receiver = OtlpReceiver(publisher, DEFAULT_ATTRIBUTE_MAP)
    port = free_port()
    runner = await serve(receiver, "127.0.0.1", port)
    async with asyncio.timeout(30):  # until the publisher reached the broker (the receiver answers 503 before)
        while not publisher.ready():
            await asyncio.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", receiver
    finally:
        await runner.cleanup()
        await publisher.close()


async def test_sdk_otlp_http_exporter_to_receiver_to_kafka(kafka_settings: Settings, receiver_url: Any) -> None:
    url, receiver = receiver_url
    await asyncio.gather(
        asyncio.to_thread(emit_vllm_spans, url, "vllm-0", "llama-8b", 40),
        asyncio.to_thread(emit_vllm_spans, url, "vllm-1", "llama-8b", 25),
    )
    assert kafka_settings.kafka.bootstrap
    got = await consume_events(kafka_settings.kafka.bootstrap, kafka_settings.topics.requests, 65)
    assert len(got) == 65
    by_id = {event["request_id"]: (key, event) for key, event in got}
    assert set(by_id) == {f"vllm-0-{i}" for i in range(40)} | {f"vllm-1-{i}" for i in range(25)}
    for key, event in got:
        assert key == event["replica"].encode()  # keyed by replica: one partition per replica's events
        assert event["model"] == "llama-8b"
    key, event = by_id["vllm-1-7"]
    assert event["prompt_tokens"] == 107 and event["completion_tokens"] == 27
    assert event["latency_ms"] == pytest.approx(570.0) and event["ttft_ms"] == pytest.approx(57.0)
    assert abs(event["ts"] - time.time()) < 60
    assert receiver.stats["events_published"] == 65 and receiver.stats["spans_total"] == 65


async def test_worker_decoder_accepts_what_the_receiver_publishes(kafka_settings: Settings,
                                                                  receiver_url: Any) -> None:
    """The published messages are valid llm.requests messages for the worker's own decoder, apart from
    the batch fields (absent: vLLM spans carry none; contract v1.1 makes them optional)."""
    url, _receiver = receiver_url
    body = gzip.compress(to_otlp_json(vllm_request(5, replica="vllm-9", model="m", t0_ns=T0_NS)))
    async with aiohttp.ClientSession() as session, session.post(
            url, data=body, headers={"Content-Type": JSON, "Content-Encoding": "gzip"}) as response:
        assert response.status == 200
        assert await response.json() == {}  # ExportTraceServiceResponse without partial_success
    assert kafka_settings.kafka.bootstrap
    got = await consume_events(kafka_settings.kafka.bootstrap, kafka_settings.topics.requests, 5)
    events = [event for _key, event in got]
    assert sorted(e["request_id"] for e in events) == [f"cmpl-{i}" for i in range(5)]
    with_batch = [{**e, "batch_size": 1, "batch_capacity": 8} for e in events]
    decoded = decode_request_message(orjson.dumps({"events": with_batch}), kafka_settings.limits)
    assert decoded.rejects == [] and len(decoded.columns) == 5


def emit_vllm_v1_spans(endpoint: str, n: int) -> None:
    """vLLM V1: no model on the span; the replica named through OTEL_RESOURCE_ATTRIBUTES semantics."""
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm", "service.instance.id": "pod-a"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=20)))
    tracer = provider.get_tracer("vllm.llm_engine")
    now_ns = time.time_ns()
    for i in range(n):
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=now_ns - 10**9,
                                 attributes=vllm_attributes(i))
        span.end(end_time=now_ns)
    assert provider.force_flush(timeout_millis=30_000)
    provider.shutdown()


def test_the_otlp_receiver_command(kafka_settings: Settings, tmp_path: Any) -> None:
    """Recipe 2 of docs/connect.md as a user runs it: `skewwatch otlp-receiver --model ...`."""
    assert kafka_settings.kafka.bootstrap
    port = free_port()
    log = (tmp_path / "receiver.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "skewwatch", "otlp-receiver", "--port", str(port), "--bootstrap",
         kafka_settings.kafka.bootstrap, "--topic", kafka_settings.topics.requests, "--model", "served-model"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until it listens
            assert proc.poll() is None, (tmp_path / "receiver.log").read_text()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        # The SDK exporter retries the 503s the receiver answers until its Kafka producer is connected.
        emit_vllm_v1_spans(f"http://127.0.0.1:{port}/v1/traces", 12)
        got = asyncio.run(consume_events(kafka_settings.kafka.bootstrap, kafka_settings.topics.requests, 12))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert sorted(e["request_id"] for _k, e in got) == sorted(f"cmpl-{i}" for i in range(12))
    assert {(k, e["replica"], e["model"]) for k, e in got} == {(b"pod-a", "pod-a", "served-model")}
    assert proc.returncode == 0, (tmp_path / "receiver.log").read_text()
