"""OTLP in, through the real worker (recipes 1 and 2 of docs/connect.md).

* Recipe 1: OTLP protobuf and OTLP/JSON payloads, produced onto a Kafka topic exactly as the OTel
  Collector's Kafka exporter frames them (``collector_kafka_records``: one ExportTraceServiceRequest per
  record, key nil or the trace id), are consumed by the worker (``topics.otlp_spans``) and come out as the
  right feature vectors; a malformed record is dead-lettered (``malformed_otlp``), other spans are counted.
* Contract v1.1: spans carry no batch size. Without telemetry the batch statistics are None (and no
  batch_collapse alert); with the replica's ``running_requests`` telemetry they are derived.
* Recipe 2: a real opentelemetry-sdk tracer with the OTLP/HTTP exporter -> ``skewwatch otlp-receiver``
  -> ``llm.requests`` -> worker -> features.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from skewwatch.config import Settings
from skewwatch.ports import free_port
from skewwatch.schemas.telemetry import encode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.topics import ensure_topics
from tests.integration.worker_proc import WorkerProcess, consume_until, produce
from tests.unit.test_otlp_decode import collector_kafka_records, record_spans

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0  # a multiple of 5 s: steps end at T0 + 5k
MODEL = "llama-3-8b"
END = T0 + 60  # the window [T0, T0 + 60) holds every generated request


SpanSpec = tuple[str, SpanKind, dict, int, int]  # (name, kind, attributes, start ns, end ns)


def vllm_spans(replica: str, seed: int, n: int) -> tuple[list[dict[str, Any]], list[SpanSpec]]:
    """``n`` vLLM-shaped ``llm_request`` spans finishing in [T0, T0 + 60), and the events they stand for."""
    rng = np.random.default_rng(seed)
    ends = np.sort(rng.uniform(T0 + 0.5, END - 0.5, n))
    e2e = rng.lognormal(np.log(0.4), 0.6, n)  # seconds, as vLLM reports them
    truth, spans = [], []
    for i in range(n):
        end_ns = int(round(ends[i] * 1e9))
        attributes = {"gen_ai.request.id": f"{replica}-{i}", "gen_ai.usage.prompt_tokens": int(rng.integers(10, 2000)),
                      "gen_ai.usage.completion_tokens": int(rng.integers(1, 300)),
                      "gen_ai.latency.e2e": float(e2e[i]), "gen_ai.latency.time_to_first_token": float(e2e[i] / 5)}
        spans.append(("llm_request", SpanKind.SERVER, attributes, end_ns - int(e2e[i] * 1e9), end_ns))
        truth.append({"ts": end_ns / 1e9, "latency_ms": float(e2e[i]) * 1e3,
                      "prompt_tokens": attributes["gen_ai.usage.prompt_tokens"]})
    return truth, spans


def export_request(replica: str, spans: list[SpanSpec]) -> ExportTraceServiceRequest:
    """What vLLM's exporter sends (the SDK's own encoder), model and replica as resource attributes."""
    resource = {"service.name": "vllm", "service.instance.id": replica, "gen_ai.request.model": MODEL}
    return encode_spans(record_spans(resource, spans))


def advance_span(replica: str, ts: float) -> SpanSpec:
    """A request far enough ahead to close every step up to ``ts - lateness``."""
    end_ns = int(ts * 1e9)
    return ("llm_request", SpanKind.SERVER, {"gen_ai.request.id": f"adv-{replica}", "gen_ai.usage.prompt_tokens": 1,
                                             "gen_ai.usage.completion_tokens": 1}, end_ns - 1_000_000, end_ns)


def with_otlp_topic(settings: Settings) -> Settings:
    suffix = settings.topics.requests.rsplit(".t", 1)[1]
    settings.topics.otlp_spans = f"otlp_spans.t{suffix}"
    asyncio.run(ensure_topics(settings.kafka.bootstrap or "", settings))  # creates only the new one
    return settings


def wait_for_features(settings: Settings, keys: list[tuple[str, float]], timeout: float = 90) -> dict[Any, dict]:
    def done(records: list[Any]) -> bool:
        have = {(r.key.decode(), orjson.loads(r.value)["window_end"]) for r in records}
        return all(k in have for k in keys)
    records = asyncio.run(consume_until(settings.kafka.bootstrap or "", [settings.topics.features], done, timeout))
    return {(r.key.decode(), orjson.loads(r.value)["window_end"]): orjson.loads(r.value) for r in records}


def assert_latency_and_counts(fv: dict[str, Any], truth: list[dict[str, Any]]) -> None:
    latency = np.array([e["latency_ms"] for e in truth])
    assert fv["count"] == len(truth)
    for q in (0.5, 0.95, 0.99):
        exact = float(np.quantile(latency, q, method="lower"))
        assert fv[f"latency_p{int(q * 100)}"] == pytest.approx(exact, rel=0.01)
    assert fv["latency_mean"] == pytest.approx(latency.mean(), rel=1e-6)
    assert fv["ttft_p50"] == pytest.approx(float(np.quantile(latency / 5, 0.5, method="lower")), rel=0.01)
    assert fv["prompt_tokens_mean"] == pytest.approx(np.mean([e["prompt_tokens"] for e in truth]), rel=1e-9)


def running_at(ts: float) -> int:
    """The derived replica's engine telemetry: running requests per 5 s sample (varies, so std > 0)."""
    return (8, 20, 12)[int((ts - T0) // 5) % 3]


def test_collector_kafka_records_in_both_encodings_become_features(kafka_settings: Settings, tmp_path: Path) -> None:
    settings = with_otlp_topic(kafka_settings)
    bootstrap = settings.kafka.bootstrap or ""
    worker = WorkerProcess(settings, tmp_path / "worker.log").start()
    try:
        # the derived replica's engine telemetry first (running requests + its max-num-seqs), and wait
        # until the worker has it: telemetry and requests are separate topics with no order between them
        samples = [TelemetrySample(ts=T0 - 5 + 5 * k, replica="vllm-derived", source="vllm",
                                   running_requests=running_at(T0 - 5 + 5 * k), batch_capacity=64)
                   for k in range(20)]
        asyncio.run(produce(bootstrap, settings.topics.gpu_telemetry,
                            [(b"vllm-derived", encode_telemetry(s)) for s in samples]))
        deadline = time.monotonic() + 60
        while b"skewwatch_telemetry_samples_total 20.0" not in worker.get("/metrics"):
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.5)

        truth: dict[str, list[dict[str, Any]]] = {}
        batches: list[tuple[int, list[tuple[bytes | None, bytes]]]] = []  # (second, its records)
        for replica, seed, encoding, by_trace in (("vllm-proto", 1, "otlp_proto", False),
                                                  ("vllm-json", 2, "otlp_json", True),
                                                  ("vllm-derived", 3, "otlp_proto", False)):
            truth[replica], spans = vllm_spans(replica, seed, 60)
            # one record per Collector batch: the batch processor sends what ended within its timeout (1 s here)
            for second in sorted({span[4] // 10**9 for span in spans}):
                batch = [span for span in spans if span[4] // 10**9 == second]
                batches.append((second, collector_kafka_records(export_request(replica, batch), encoding, by_trace)))
        # the Collector writes as spans end: the replicas' batches interleave in time
        records = [record for _, part in sorted(batches, key=lambda b: b[0]) for record in part]
        # not requests: skipped and counted, never dead-lettered
        records += collector_kafka_records(export_request("vllm-proto", [
            ("GET /metrics", SpanKind.SERVER, {"http.route": "/metrics"}, int(T0 * 1e9), int(T0 * 1e9) + 1000),
            ("chat", SpanKind.CLIENT, {"gen_ai.usage.input_tokens": 1, "gen_ai.usage.output_tokens": 2},
             int(T0 * 1e9), int(T0 * 1e9) + 1000)]))
        records.append((None, b"this is not OTLP"))
        records += [record for replica in truth
                    for record in collector_kafka_records(export_request(replica, [advance_span(replica, T0 + 80)]))]
        # all at once: a backlog spread over the topic's partitions (nil keys land anywhere, trace-id keys
        # too), read in no particular order; the stage aligns the partitions so no event arrives late
        asyncio.run(produce(bootstrap, settings.topics.otlp_spans, records))

        replicas = list(truth)
        got = wait_for_features(settings, [(f"{MODEL}/{r}", END) for r in replicas] + [(MODEL, END)])
        for replica in replicas:
            fv = got[(f"{MODEL}/{replica}", END)]
            assert_latency_and_counts(fv, truth[replica])
        # no batch size reported and no telemetry: unknown, not 0 (the batch detectors stay silent)
        for replica in ("vllm-proto", "vllm-json"):
            fv = got[(f"{MODEL}/{replica}", END)]
            assert (fv["batch_size_mean"], fv["batch_size_std"], fv["batch_fill_mean"]) == (None, None, None)
            assert fv["batch_count"] == 0
        # derived from running_requests as of each request's finish time
        derived = got[(f"{MODEL}/vllm-derived", END)]
        running = np.array([running_at(e["ts"]) for e in truth["vllm-derived"]], dtype=float)
        assert derived["batch_count"] == derived["batch_derived_count"] == 60
        assert derived["batch_size_mean"] == pytest.approx(running.mean(), rel=1e-9)
        assert derived["batch_size_std"] == pytest.approx(running.std(), rel=1e-9)
        assert derived["batch_fill_mean"] == pytest.approx((running / 64).mean(), rel=1e-9)
        per_model = got[(MODEL, END)]
        assert per_model["count"] == 180 and per_model["batch_count"] == 60

        dead = asyncio.run(consume_until(bootstrap, [settings.topics.dead_letter], lambda rs: len(rs) >= 1, 30))
        assert len(dead) == 1
        letter = orjson.loads(dead[0].value)
        assert letter["source_topic"] == settings.topics.otlp_spans
        assert [r["reason_code"] for r in letter["rejects"]] == ["malformed_otlp"]
        assert base64.b64decode(letter["value_b64"]) == b"this is not OTLP"
        alerts = asyncio.run(consume_until(bootstrap, [settings.topics.alerts], lambda rs: False, 3))
        assert not [a for a in map(lambda r: orjson.loads(r.value), alerts)
                    if a.get("detector") == "batch_collapse" and a.get("replica") in ("vllm-proto", "vllm-json")]
        metrics = worker.get("/metrics").decode()
        assert 'skewwatch_rejected_total{reason="malformed_otlp"} 1.0' in metrics
        assert 'skewwatch_otlp_spans_skipped_total{reason="span_kind"} 1.0' in metrics
        assert 'skewwatch_otlp_spans_skipped_total{reason="not_inference"} 1.0' in metrics
        assert "skewwatch_batch_derived_total 61.0" in metrics  # its 60 requests + its advance span
        assert "skewwatch_late_events_total 0.0" in metrics
    finally:
        worker.stop()


def test_sdk_tracer_to_otlp_receiver_to_worker_features(kafka_settings: Settings, tmp_path: Path) -> None:
    """Recipe 2: vLLM's exporter (the real SDK, OTLP/HTTP protobuf) -> `skewwatch otlp-receiver --model`
    -> llm.requests -> the worker's features."""
    bootstrap = kafka_settings.kafka.bootstrap or ""
    worker = WorkerProcess(kafka_settings, tmp_path / "worker.log").start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    receiver = subprocess.Popen(
        [sys.executable, "-m", "skewwatch", "otlp-receiver", "--port", str(port), "--bootstrap", bootstrap,
         "--topic", kafka_settings.topics.requests, "--model", MODEL],
        stdout=(tmp_path / "receiver.log").open("wb"), stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            assert receiver.poll() is None and time.monotonic() < deadline, (tmp_path / "receiver.log").read_text()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        truth, spans = vllm_spans("vllm-0", 7, 50)
        provider = TracerProvider(resource=Resource.create({"service.name": "vllm", "service.instance.id": "vllm-0"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=10)))
        tracer = provider.get_tracer("vllm.llm_engine")
        for name, kind, attributes, start_ns, end_ns in [*spans, advance_span("vllm-0", T0 + 80)]:
            tracer.start_span(name, kind=kind, attributes=attributes, start_time=start_ns).end(end_time=end_ns)
        assert provider.force_flush(timeout_millis=30_000)  # the receiver answered 200 to every export
        provider.shutdown()
        got = wait_for_features(kafka_settings, [(f"{MODEL}/vllm-0", END)])
        fv = got[(f"{MODEL}/vllm-0", END)]
        assert_latency_and_counts(fv, truth)
        assert fv["batch_size_mean"] is None and fv["batch_count"] == 0  # spans carry no batch, no telemetry
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
        worker.stop()
