"""The JSON Schema files and the Python decoders/encoders say the same thing.

Every schema is a valid draft 2020-12 schema; the request schemas and the decoder agree on valid
and invalid samples (by hand and generated); the features and telemetry schemas list exactly the
fields of FeatureVector and TelemetrySample; encoders' output validates; dead-letter records keep
the original bytes and fit the dead-letter topic; docs/contracts.md names every field and code.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from referencing import Registry, Resource

from skewwatch.config import LimitSettings
from skewwatch.schemas import SCHEMA_FILES, load_schema
from skewwatch.schemas.alerts import Action, Alert, Severity, decode_alert, encode_alert
from skewwatch.schemas.corrections import RoutingCorrection, decode_correction, encode_correction
from skewwatch.schemas.dead_letter import (
    DEAD_LETTER_MAX_VALUE_BYTES,
    DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES,
    dead_letter_record,
    decode_dead_letter,
    rejections_of,
)
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.features import decode_features, encode_features
from skewwatch.schemas.limits import DEFAULT_LIMITS
from skewwatch.schemas.rejection import REASON_CODES, Rejection
from skewwatch.schemas.requests import REQUEST_FIELDS, RequestColumns, decode_request_message, decode_request_messages
from skewwatch.schemas.requests.spec import FIELDS_BY_NAME, event_schema, field_schema
from skewwatch.schemas.telemetry import TELEMETRY_FIELDS, decode_telemetry, encode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample
from tests.unit.test_decode_requests import _DROP, VALID_POOLS, VALUE_POOLS, good_event

LIMITS = LimitSettings()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


def _registry() -> Registry:
    resources = [(load_schema(name)["$id"], Resource.from_contents(load_schema(name))) for name in SCHEMA_FILES]
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(load_schema(name), registry=REGISTRY)


@pytest.mark.parametrize("name", sorted(SCHEMA_FILES))
def test_every_schema_file_is_a_valid_draft_2020_12_schema(name: str) -> None:
    schema = load_schema(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] == f"urn:skewwatch:schema:{name.replace('.v1', '')}:v1"


# --- llm.requests: schema and decoder agree --------------------------------------------------------

MESSAGE = validator("request-message.v1")

VALID_MESSAGES: list[Any] = [
    good_event(),
    good_event(ttft_ms=1.5, queue_length=0, kv_cache_hit_rate=1, status="error", cuda_error=700, v=1),
    good_event(prompt_tokens=12.0, cuda_error="cudaErrorIllegalAddress", status=None, ttft_ms=None),
    good_event(unknown={"nested": [1, 2]}, ts=0),
    {"events": [good_event(i) for i in range(3)]},
    {"v": 1, "events": []},
    {"v": None, "events": [good_event(batch_size=32, batch_capacity=32)]},
]
INVALID_MESSAGES: list[Any] = [
    [good_event()],
    "event",
    {},
    good_event(latency_ms=-3),
    good_event(latency_ms="3"),
    good_event(prompt_tokens=True),
    good_event(prompt_tokens=12.5),
    good_event(prompt_tokens=10_000_001),
    good_event(batch_size=0),
    good_event(ts=1.7e12),
    good_event(model=""),
    good_event(kv_cache_hit_rate=1.5),
    good_event(status="fail"),
    good_event(cuda_error=-1),
    good_event(cuda_error=False),
    good_event(v=2),
    good_event(request_id=_DROP),
    good_event(replica=None),
    {"events": {"a": 1}},
    {"v": 2, "events": [good_event()]},
    {"events": [good_event(), good_event(latency_ms=-1)]},
    {"events": [good_event(), 3]},
]


def _clean(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _clean(v) for k, v in doc.items() if v is not _DROP}
    if isinstance(doc, list):
        return [_clean(v) for v in doc]
    return doc


@pytest.mark.parametrize("doc", VALID_MESSAGES)
def test_valid_samples_pass_both_schema_and_decoder(doc: Any) -> None:
    value = orjson.dumps(_clean(doc))
    MESSAGE.validate(orjson.loads(value))
    assert decode_request_message(value, LIMITS).rejects == []


@pytest.mark.parametrize("doc", INVALID_MESSAGES)
def test_invalid_samples_fail_both_schema_and_decoder(doc: Any) -> None:
    value = orjson.dumps(_clean(doc))
    assert not MESSAGE.is_valid(orjson.loads(value))
    assert decode_request_message(value, LIMITS).rejects != []


def test_batch_over_capacity_is_the_one_rule_the_schema_cannot_state() -> None:
    # JSON Schema has no cross-field comparison: the schema's description says so, the decoder enforces it
    doc = good_event(batch_size=40, batch_capacity=32)
    assert MESSAGE.is_valid(doc)
    assert [r.reason_code for r in decode_request_message(orjson.dumps(doc), LIMITS).rejects] == [
        "batch_over_capacity"]
    assert "batch_capacity" in load_schema("request-event.v1")["properties"]["batch_size"]["description"]


@st.composite
def json_events(draw: st.DrawFn) -> dict[str, Any]:
    """Events mixing valid and invalid values that JSON can carry (no NaN/inf: JSON has none)."""
    event = {}
    for name, pool in VALUE_POOLS.items():
        finite = [v for v in pool if not (isinstance(v, float) and not math.isfinite(v))
                  and not (isinstance(v, int) and abs(v) >= 2**64)]
        pool_to_use = finite if draw(st.integers(0, 4)) == 0 else VALID_POOLS.get(name, finite)
        value = draw(st.sampled_from(pool_to_use))
        if value is not _DROP:
            event[name] = value
    return event


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(json_events(), min_size=1, max_size=3), st.booleans())
def test_schema_and_decoder_agree_on_generated_messages(events: list[dict[str, Any]], batch_form: bool) -> None:
    doc: Any = {"events": events} if batch_form else events[0]
    value = orjson.dumps(doc)
    rejects = decode_request_message(value, LIMITS).rejects
    if MESSAGE.is_valid(orjson.loads(value)):
        assert all(r.reason_code == "batch_over_capacity" for r in rejects), rejects
    else:
        assert rejects, "the schema rejects what the decoder accepts"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(json_events(), min_size=1, max_size=3), min_size=1, max_size=6), st.booleans())
def test_schema_and_decoder_agree_message_by_message_on_a_generated_poll(messages: list[list[dict[str, Any]]],
                                                                         batch_form: bool) -> None:
    # a whole poll, as the worker decodes it (one msgspec pass when every message is clean)
    values = [orjson.dumps({"events": events} if batch_form else events[0]) for events in messages]
    decoded = decode_request_messages(values, LIMITS)
    assert len(decoded.rejects) == len(values)
    for m, (value, rejects) in enumerate(zip(values, decoded.rejects, strict=True)):
        if MESSAGE.is_valid(orjson.loads(value)):
            assert all(r.reason_code == "batch_over_capacity" for r in rejects), (m, rejects)
        else:
            assert rejects, f"message {m}: the schema rejects what the decoder accepts"
            if rejects[0].is_message_level or not batch_form:
                assert m not in decoded.message_index.tolist()


def test_the_event_schema_lists_exactly_the_decoders_fields() -> None:
    schema = load_schema("request-event.v1")
    assert set(schema["properties"]) == {f.name for f in REQUEST_FIELDS} | {"v"}
    assert schema["required"] == [f.name for f in REQUEST_FIELDS if f.required]
    assert schema["additionalProperties"] is True  # unknown fields are ignored: forward compatible
    tokens = {f.name for f in REQUEST_FIELDS if f.tokens}
    assert {schema["properties"][n]["maximum"] for n in tokens} == {LIMITS.max_tokens}


def test_the_event_schema_file_is_the_one_the_field_spec_makes() -> None:
    """request-event.v1.json says what REQUEST_FIELDS say (types, ranges, required, descriptions): the
    contract is written once. After changing the spec, regenerate the file:
    ``python -m skewwatch.schemas.requests.spec > skewwatch/schemas/request-event.v1.json``."""
    shipped, made = load_schema("request-event.v1"), event_schema()
    assert {k: v for k, v in shipped.items() if k != "properties"} == {k: v for k, v in made.items()
                                                                        if k != "properties"}
    assert list(shipped["properties"]) == list(made["properties"])
    for name, rule in made["properties"].items():
        assert shipped["properties"][name] == rule, name
    # the message schema's batch limit is the decoder's default too
    message = load_schema("request-message.v1")
    assert message["then"]["properties"]["events"]["maxItems"] == DEFAULT_LIMITS.max_events_per_message


def test_a_changed_spec_no_longer_matches_the_shipped_schema() -> None:
    """The check above can fail: one field's range changed in the spec changes the schema it makes."""
    changed = dataclasses.replace(FIELDS_BY_NAME["latency_ms"], minimum=1.0)
    assert field_schema(changed) != load_schema("request-event.v1")["properties"]["latency_ms"]


def test_the_columns_are_the_spec_s_columns_in_order_and_dtype() -> None:
    names = [f.name for f in dataclasses.fields(RequestColumns)]
    assert names == [f.column_name for f in REQUEST_FIELDS] + ["batch_source"]
    row = {"request_id": "a", "ts": 1.7e9, "model": "m", "replica": "r", "latency_ms": 1.0,
           "prompt_tokens": 1, "completion_tokens": 1}
    decoded = decode_request_message(orjson.dumps(row), LIMITS).columns
    for spec in REQUEST_FIELDS:
        column = getattr(decoded, spec.column_name)
        assert column.dtype == np.dtype(spec.dtype), spec.name
        if not spec.required:  # an absent optional field holds the spec's "not reported" value
            value = column[0].item() if hasattr(column[0], "item") else column[0]
            assert value == spec.absent or (value != value and spec.absent != spec.absent), spec.name


# --- llm.features ------------------------------------------------------------------------------------

def test_the_features_schema_lists_exactly_the_feature_vector_fields() -> None:
    schema = load_schema("features.v1")
    fields = {f.name: f for f in dataclasses.fields(FeatureVector)}
    assert set(schema["properties"]) == set(fields)
    no_default = {name for name, f in fields.items()
                  if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert no_default <= set(schema["required"]) <= no_default | {"v"}


def test_encoded_features_validate_and_never_carry_nan() -> None:
    fv = FeatureVector(model="m", replica=None, window_start=0.0, window_end=60.0, count=3, rps=0.05,
                       latency_p50=float("nan"), latency_p99=float("inf"), batch_fill_mean=0.5,
                       step_cuda_errors={"cudaErrorLaunchTimeout": 2}, replicas=2)
    record = encode_features(fv)
    assert b"NaN" not in record and b"Infinity" not in record
    data = orjson.loads(record)
    validator("features.v1").validate(data)
    assert data["latency_p50"] is None and data["latency_p99"] is None and data["count"] == 3
    assert decode_features(record) == dataclasses.replace(fv, latency_p50=None, latency_p99=None)
    with pytest.raises(ValueError, match="missing"):
        decode_features(b'{"model": "m"}')


# --- llm.routing-corrections -----------------------------------------------------------------------

CORRECTION = validator("routing-correction.v1")


def test_the_correction_schema_lists_exactly_the_correction_fields() -> None:
    schema = load_schema("routing-correction.v1")
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(RoutingCorrection)}
    assert set(schema["properties"]["actions"]["items"]["properties"]) == {f.name for f in dataclasses.fields(Action)}


def _published_before(correction: RoutingCorrection) -> bytes:
    """What the worker published before the record had one encoder: its plain dict through orjson."""
    record = {"model": correction.model, "ts": correction.ts, "seq": correction.seq,
              "weights": dict(correction.weights),
              "actions": [{"replica": a.replica, "action": a.action, "severity": str(a.severity), "reason": a.reason,
                           "params": dict(a.params), "expires_at": a.expires_at} for a in correction.actions],
              "mode": correction.mode, "mode_reason": correction.mode_reason, "valid_for_s": correction.valid_for_s,
              "v": correction.v}
    return orjson.dumps(record)


CORRECTIONS = (
    RoutingCorrection("m", 60.0, 60_000, {"a": 0.5, "b": 0.5},
                      [Action("a", "drain", Severity.CRITICAL, "hardware", {}, 360.0),
                       Action("b", "adjust_batch_policy", Severity.WARNING, "kv", {"max_batch_size": 8}, None)],
                      mode="panic", mode_reason="panic: 1 of 4 replicas healthy", valid_for_s=90.0),
    RoutingCorrection("m", 65.0, 65_000, {"a": 1.0}),
    RoutingCorrection("llama/70b", 1_700_000_065.125, 1_700_000_065_125, {"r1": 1 / 3, "r2": 2 / 3, "r3": 0.0},
                      valid_for_s=90.0),
)


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_a_correction_round_trips_as_the_worker_published_it(correction: RoutingCorrection) -> None:
    record = encode_correction(correction)
    assert record == _published_before(correction)  # byte for byte
    CORRECTION.validate(orjson.loads(record))
    assert decode_correction(record) == correction
    assert RoutingCorrection.from_dict(correction.to_dict()) == correction  # the checkpoint's plain data
    assert correction.to_dict() == orjson.loads(record)


def test_old_correction_records_still_read_and_bad_ones_are_refused() -> None:
    # a record from a writer before v1.4 (no mode) or before v1.9 (no valid_for_s): valid, read as normal
    old = {"model": "m", "ts": 60.0, "seq": 60_000, "weights": {"a": 1.0}, "actions": [], "v": 1}
    CORRECTION.validate(old)
    for record in (old, {**old, "mode": None, "v": None}, {k: v for k, v in old.items() if k != "actions"}):
        decoded = decode_correction(orjson.dumps(record))
        assert (decoded.mode, decoded.v, decoded.valid_for_s, decoded.actions) == ("normal", 1, None, [])
        assert RoutingCorrection.from_dict(record) == decoded
    assert decode_correction(orjson.dumps({**old, "unknown": 1})) == decode_correction(orjson.dumps(old))
    with pytest.raises(jsonschema.ValidationError):
        CORRECTION.validate({**old, "mode": "chaos"})
    for bad, match in ((b"[]", "object"), (b'{"model": "m"}', "missing"), (orjson.dumps({**old, "v": 2}), "v"),
                       (orjson.dumps({**old, "mode": "chaos"}), "mode"),
                       (orjson.dumps({**old, "valid_for_s": 0}), "valid_for_s"),
                       (orjson.dumps({**old, "valid_for_s": True}), "valid_for_s"), (b"{", "truncated")):
        with pytest.raises(ValueError, match=match):
            decode_correction(bad)
    with pytest.raises(ValueError, match="mode must be"):
        RoutingCorrection("m", 60.0, 60_000, {"a": 1.0}, mode="chaos")  # type: ignore[arg-type]


def test_the_client_library_reads_corrections_without_the_engine() -> None:
    """client/ decodes a correction with schemas/ alone (schemas/ reaches nothing of the engine:
    test_layering.py), never with pipeline/."""
    import ast
    from pathlib import Path

    import skewwatch.client

    offenders = []
    for path in sorted(Path(skewwatch.client.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("skewwatch.pipeline")]
    assert offenders == []


# --- llm.alerts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("alert", [
    Alert(60.0, "m", "r1", "kv_pressure", Severity.WARNING, "open", "kv > 95 %", {"rule": "usage", "x": 1.5, "n": 3}),
    Alert(1_700_000_060.0, "m", None, "fail_static", Severity.CRITICAL, "resolved", "", {"note": None, "flag": True}),
])
def test_an_alert_round_trips_as_the_worker_published_it(alert: Alert) -> None:
    before = {"ts": alert.ts, "model": alert.model, "replica": alert.replica, "detector": alert.detector,
              "severity": str(alert.severity), "state": alert.state, "message": alert.message,
              "evidence": dict(alert.evidence)}
    record = encode_alert(alert)
    assert record == orjson.dumps(before)  # byte for byte what the worker published
    assert decode_alert(record) == alert and Alert.from_dict(alert.to_dict()) == alert
    assert alert.to_dict() == before
    with pytest.raises(ValueError, match="state"):
        decode_alert(orjson.dumps({**before, "state": "closed"}))


# --- llm.gpu-telemetry --------------------------------------------------------------------------------

TELEMETRY = validator("gpu-telemetry.v1")


def test_the_telemetry_schema_lists_exactly_the_sample_fields() -> None:
    schema = load_schema("gpu-telemetry.v1")
    fields = {f.name for f in dataclasses.fields(TelemetrySample)}
    assert set(schema["properties"]) == fields
    assert {f.name for f in TELEMETRY_FIELDS} == fields - {"v"}
    assert schema["required"] == [f.name for f in TELEMETRY_FIELDS if f.required]


def full_sample() -> TelemetrySample:
    return TelemetrySample(
        ts=1.7e9, replica="r1", source="nvml", node="gpu-node-1", gpu_index=0, gpu_uuid="GPU-abc",
        memory_used_bytes=8e9, memory_total_bytes=80e9, utilization_gpu=0.9, power_w=350.0,
        temperature_c=-5.0, throttle_reasons=4, ecc_uncorrected_total=0, xid_last=79, xid_count_5m=1,
        queue_length=3, running_requests=16, kv_cache_usage=0.4, kv_cache_hit_rate=0.7,
        preemptions_total=2, memory_reserved_bytes=9e9, memory_allocated_bytes=6e9)


def test_telemetry_round_trips_and_validates() -> None:
    sample = full_sample()
    value = encode_telemetry(sample)
    TELEMETRY.validate(orjson.loads(value))
    assert decode_telemetry(value) == sample
    minimal = TelemetrySample(ts=1.0, replica="r", source="dcgm")
    assert orjson.loads(encode_telemetry(minimal)) == {"ts": 1.0, "replica": "r", "source": "dcgm", "v": 1}
    assert decode_telemetry(encode_telemetry(minimal)) == minimal
    assert decode_telemetry(b'{"ts": 1, "replica": "r", "source": "x", "gpu_index": 2.0, "new": 1}') == \
        TelemetrySample(ts=1.0, replica="r", source="x", gpu_index=2)


@pytest.mark.parametrize(("doc", "code", "text"), [
    ({"replica": "r", "source": "nvml"}, "missing_field", "ts: required field is missing"),
    ({"ts": 1, "replica": "", "source": "nvml"}, "out_of_range", 'replica: must be a non-empty string'),
    ({"ts": 1, "replica": "r", "source": "nvml", "utilization_gpu": 87}, "out_of_range",
     "utilization_gpu: must be ≤ 1, got 87"),
    ({"ts": 1, "replica": "r", "source": "nvml", "memory_used_bytes": -1}, "out_of_range",
     "memory_used_bytes: must be ≥ 0, got -1"),
    ({"ts": 1, "replica": "r", "source": "nvml", "xid_last": "79"}, "wrong_type",
     'xid_last: must be an integer, got "79"'),
    ({"ts": 1, "replica": "r", "source": "nvml", "gpu_index": True}, "wrong_type", "gpu_index: must be an integer"),
    ({"ts": 1, "replica": "r", "source": "nvml", "v": 2}, "unsupported_version", "v: unsupported schema version 2"),
    ([1], "not_an_object", "must be a JSON object"),
])
def test_bad_telemetry_is_rejected_with_reasons_and_the_schema_agrees(doc: Any, code: str, text: str) -> None:
    result = decode_telemetry(orjson.dumps(doc))
    assert isinstance(result, Rejection)
    assert result.reason_code == code and text in result.reason and result.event_index is None
    assert not TELEMETRY.is_valid(doc)


@pytest.mark.parametrize(("value", "code"), [(None, "empty"), (b"", "empty"), (b"{", "malformed_json"),
                                             (b"x" * ((1 << 20) + 1), "too_large"),
                                             (b'{"ts": NaN, "replica": "r", "source": "s"}', "out_of_range")])
def test_telemetry_message_level_rejections(value: bytes | None, code: str) -> None:
    result = decode_telemetry(value)
    assert isinstance(result, Rejection) and result.reason_code == code


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256) | st.dictionaries(st.sampled_from([f.name for f in TELEMETRY_FIELDS] + ["v"]),
                                                 st.none() | st.booleans() | st.integers(-5, 2**40)
                                                 | st.floats(allow_nan=False, allow_infinity=False)
                                                 | st.text(max_size=4), max_size=8).map(orjson.dumps))
def test_telemetry_decoding_never_raises_and_agrees_with_the_schema(value: bytes) -> None:
    result = decode_telemetry(value)
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        assert isinstance(result, Rejection)
        return
    assert isinstance(result, Rejection) != TELEMETRY.is_valid(doc)


# --- llm.dead-letter --------------------------------------------------------------------------------

DEAD_LETTER = validator("dead-letter.v1")


def test_a_dead_letter_record_keeps_the_original_bytes_and_the_reasons() -> None:
    original = b'{"events": [{"latency_ms": -3}, {"broken": \xff}]}'  # not even valid UTF-8
    rejects = [Rejection("malformed_json", "malformed JSON: str is not valid UTF-8", None)]
    record = dead_letter_record(source_topic="llm.requests", partition=2, offset=1234, key=b"replica-7",
                                value=original, rejects=rejects, ts=1.7e9)
    data = orjson.loads(record)
    DEAD_LETTER.validate(data)
    assert base64.b64decode(data["value_b64"]) == original
    decoded = decode_dead_letter(record)
    assert decoded["value"] == original and decoded["key"] == b"replica-7"
    assert (decoded["source_topic"], decoded["partition"], decoded["offset"]) == ("llm.requests", 2, 1234)
    assert decoded["value_bytes"] == len(original) and decoded["value_truncated"] is False
    assert rejections_of(decoded) == rejects and decoded["rejects_total"] == 1


def test_a_dead_letter_record_of_a_decoded_batch() -> None:
    value = orjson.dumps({"events": [good_event(0), good_event(1, latency_ms=-3), good_event(2, batch_size=99)]})
    decoded = decode_request_message(value, LIMITS)
    record = dead_letter_record(source_topic="llm.requests", partition=0, offset=0, key=None, value=value,
                                rejects=decoded.rejects, ts=1.7e9)
    data = decode_dead_letter(record)
    DEAD_LETTER.validate(orjson.loads(record))
    assert data["key"] is None and data["value"] == value
    assert [(r["reason_code"], r["event_index"]) for r in data["rejects"]] == [
        ("out_of_range", 1), ("batch_over_capacity", 2)]
    assert data["rejects"][0]["reason"] == "events[1].latency_ms: must be ≥ 0, got -3"


def test_the_worst_dead_letter_record_fits_the_dead_letter_topic() -> None:
    huge = b"x" * (DEAD_LETTER_MAX_VALUE_BYTES + 12345)
    rejects = [Rejection("out_of_range", "e" * 5000, i) for i in range(LIMITS.max_events_per_message)]
    record = dead_letter_record(source_topic="llm.requests", partition=0, offset=7, key=b"k" * 200_000,
                                value=huge, rejects=rejects, ts=1.0)
    assert len(record) < DEAD_LETTER_TOPIC_MAX_MESSAGE_BYTES
    data = decode_dead_letter(record)
    DEAD_LETTER.validate(orjson.loads(record))
    assert data["value_truncated"] is True and data["value_bytes"] == len(huge)
    assert data["value"] == huge[:DEAD_LETTER_MAX_VALUE_BYTES]
    assert data["key_truncated"] is True
    assert len(data["rejects"]) == 100 and data["rejects_total"] == LIMITS.max_events_per_message
    assert data["rejects_by_code"] == {"out_of_range": LIMITS.max_events_per_message}
    # a too_large request message (just over the 1 MiB limit) is still kept whole
    over = b"y" * (LIMITS.max_message_bytes + 1)
    kept = decode_dead_letter(dead_letter_record(source_topic="t", partition=0, offset=0, key=None, value=over,
                                                 rejects=[Rejection("too_large", "big", None)], ts=1.0))
    assert kept["value"] == over and kept["value_truncated"] is False


def test_dead_letter_reason_codes_are_the_stable_labels() -> None:
    schema = load_schema("dead-letter.v1")
    assert tuple(schema["properties"]["rejects"]["items"]["properties"]["reason_code"]["enum"]) == REASON_CODES
    with pytest.raises(ValueError):
        decode_dead_letter(b'{"v": 9}')


# --- the documentation names every field and every code ---------------------------------------------

@pytest.mark.parametrize("name", sorted(SCHEMA_FILES))
def test_docs_name_every_field(name: str) -> None:
    text = DOCS.read_text(encoding="utf-8")
    missing = [field for field in load_schema(name).get("properties", {}) if f"`{field}`" not in text]
    assert not missing, f"docs/contracts.md does not document {missing} of {name}"


def test_docs_name_every_reason_code() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert [code for code in REASON_CODES if f"`{code}`" not in text] == []


def test_the_settings_limits_start_from_the_decoders_defaults() -> None:
    """``[limits]`` and the decoders' own defaults (for callers without settings) are the same numbers."""
    from skewwatch.config import LimitSettings
    from skewwatch.schemas.limits import DEFAULT_LIMITS

    settings = LimitSettings()
    assert (settings.max_message_bytes, settings.max_tokens, settings.max_events_per_message) == (
        DEFAULT_LIMITS.max_message_bytes, DEFAULT_LIMITS.max_tokens, DEFAULT_LIMITS.max_events_per_message)
