"""The worker's OTLP stage without Kafka: records -> validated events re-keyed by replica, sorted, chunked."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from opentelemetry.trace import SpanKind

from skewwatch.agents.otlp_stage import otlp_attribute_map, translate_records
from skewwatch.config import ConfigError, Settings, load_settings
from tests.unit.test_otlp_decode import T0_NS, collector_kafka_records, encode_spans, record_spans, vllm_request


def test_records_become_contract_messages_keyed_by_replica_sorted_and_chunked() -> None:
    settings = load_settings(env={"SKEWWATCH_OTLP__MAX_EVENTS_PER_MESSAGE": "2"})
    later = vllm_request(3, replica="vllm-0", t0_ns=T0_NS + 100 * 10**9)
    earlier = vllm_request(2, replica="vllm-0")
    other = vllm_request(1, replica="vllm-1")
    values = [value for request, encoding in ((later, "otlp_json"), (earlier, "otlp_proto"), (other, "otlp_proto"))
              for _, value in collector_kafka_records(request, encoding, partition_traces_by_id=True)]
    poll = translate_records(values, settings)
    assert poll.events == 6 and poll.spans == 6 and poll.rejects == [[] for _ in values]
    keys = [key for key, _ in poll.messages]
    assert keys == [b"vllm-0", b"vllm-0", b"vllm-0", b"vllm-1"]  # 5 events of vllm-0 in messages of <= 2
    events = [e for key, value in poll.messages if key == b"vllm-0" for e in orjson.loads(value)["events"]]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)  # records read out of order: sorted
    assert all("batch_size" not in e for e in events)  # v1.1: left for the worker to derive


def test_malformed_records_and_contract_violations_are_rejected_other_spans_counted() -> None:
    settings = Settings()
    settings.limits.max_tokens = 100
    resource = {"service.instance.id": "vllm-0", "gen_ai.request.model": "m"}
    big = {"gen_ai.request.id": "big", "gen_ai.usage.prompt_tokens": 500, "gen_ai.usage.completion_tokens": 1}
    fine = {"gen_ai.usage.prompt_tokens": 5, "gen_ai.usage.completion_tokens": 1}
    spans: list[tuple[str, SpanKind, dict[str, Any], int, int]] = [
        ("llm_request", SpanKind.SERVER, big, T0_NS, T0_NS + 10**6),
        ("llm_request", SpanKind.SERVER, fine, T0_NS, T0_NS + 10**6),
        ("GET /health", SpanKind.SERVER, {}, T0_NS, T0_NS + 10**6)]
    payload = encode_spans(record_spans(resource, spans)).SerializeToString()
    poll = translate_records([payload, b"\x00garbage", None], settings)
    assert poll.events == 1 and dict(poll.skipped) == {"not_inference": 1}
    assert [(r.reason_code, r.event_index) for r in poll.rejects[0]] == [("too_many_tokens", 0)]
    assert poll.rejects[0][0].reason.startswith("request big: prompt_tokens: 500 > limit 100")
    assert [r.reason_code for r in poll.rejects[1]] == ["malformed_otlp"]
    assert [r.reason_code for r in poll.rejects[2]] == ["malformed_otlp"]  # a tombstone is not OTLP


def test_otlp_settings_are_checked_and_applied() -> None:
    settings = load_settings(env={"SKEWWATCH_OTLP__REPLICA_KEYS": "k8s.pod.name,host.name",
                                  "SKEWWATCH_OTLP__DEFAULT_MODEL": "llama"})
    amap = otlp_attribute_map(settings)
    assert amap.replica_keys == ("k8s.pod.name", "host.name") and amap.default_model == "llama"
    with pytest.raises(ConfigError, match="otlp.encoding"):
        otlp_attribute_map(load_settings(env={"SKEWWATCH_OTLP__ENCODING": "protobuf"}))
