"""The llm.requests decoder: every bad-input case of the contract, good events surviving bad ones,
the vectorised path agreeing with the per-event reference, and no input ever raising."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewwatch.config import LimitSettings
from skewwatch.schemas.rejection import REASON_CODES, Rejection
from skewwatch.schemas.requests import (
    REQUEST_FIELDS,
    REQUIRED_FIELDS,
    MessageRejects,
    RequestColumns,
    check_request_event,
    decode_request_message,
    decode_request_messages,
    encode_request_event,
    encode_request_events,
    event_problems,
)
from skewwatch.schemas.requests import typed_path as current_typed_path
from skewwatch.schemas.requests.column_checks import validate_columns
from skewwatch.schemas.requests.rules import SCALAR_MAX_EVENTS
from skewwatch.schemas.requests.typed_path import decode_typed_runs

LIMITS = LimitSettings()


def good_event(i: int = 0, **changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "request_id": f"req-{i}", "ts": 1_700_000_000.0 + i, "model": "llama", "replica": f"r{i % 3}",
        "latency_ms": 100.0 + i, "prompt_tokens": 10 + i, "completion_tokens": 20 + i,
        "batch_size": 4, "batch_capacity": 32,
    }
    event.update(changes)
    return {k: v for k, v in event.items() if v is not _DROP}


_DROP = object()  # good_event(field=_DROP) leaves the field out

# (changes to a good event, expected reason_code, text the reason must contain)
BAD_EVENTS: list[tuple[dict[str, Any], str, str]] = [
    ({"latency_ms": -3}, "out_of_range", "latency_ms: must be ≥ 0, got -3"),
    ({"latency_ms": "12"}, "wrong_type", 'latency_ms: must be a number, got "12"'),
    ({"latency_ms": True}, "wrong_type", "latency_ms: must be a number, got true"),
    ({"latency_ms": _DROP}, "missing_field", "latency_ms: required field is missing"),
    ({"latency_ms": None}, "missing_field", "latency_ms: required, got null"),
    ({"request_id": _DROP}, "missing_field", "request_id: required field is missing"),
    ({"request_id": 17}, "wrong_type", "request_id: must be a string, got 17"),
    ({"model": ""}, "out_of_range", 'model: must be a non-empty string, got ""'),
    ({"replica": ["r1"]}, "wrong_type", 'replica: must be a string, got ["r1"]'),
    ({"ts": -1.0}, "out_of_range", "ts: must be ≥ 0, got -1.0"),
    ({"ts": 1_700_000_000_000}, "out_of_range", "ts: 1700000000000 is not epoch seconds"),
    ({"ts": "2024-01-01T00:00:00Z"}, "wrong_type", "ts: must be a number"),
    ({"prompt_tokens": True}, "wrong_type", "prompt_tokens: must be an integer, got true"),
    ({"prompt_tokens": 12.5}, "wrong_type", "prompt_tokens: must be an integer, got 12.5"),
    ({"prompt_tokens": -1}, "out_of_range", "prompt_tokens: must be ≥ 0, got -1"),
    ({"prompt_tokens": 10_000_001}, "too_many_tokens", "prompt_tokens: 10000001 > limit 10000000"),
    ({"completion_tokens": 2**40}, "too_many_tokens", "completion_tokens: 1099511627776 > limit"),
    ({"completion_tokens": 1e30}, "too_many_tokens", "completion_tokens: 1e+30 > limit"),
    ({"batch_size": 40, "batch_capacity": 32}, "batch_over_capacity", "batch_size: 40 > batch_capacity 32"),
    ({"batch_size": 0}, "out_of_range", "batch_size: must be ≥ 1, got 0"),
    ({"batch_capacity": 2**63}, "out_of_range", "batch_capacity: must be < 2^63"),
    ({"batch_capacity": "32"}, "wrong_type", 'batch_capacity: must be an integer, got "32"'),
    ({"ttft_ms": -1}, "out_of_range", "ttft_ms: must be ≥ 0, got -1"),
    ({"queue_length": 1.5}, "wrong_type", "queue_length: must be an integer, got 1.5"),
    ({"queue_length": -2}, "out_of_range", "queue_length: must be ≥ 0, got -2"),
    ({"kv_cache_hit_rate": 1.2}, "out_of_range", "kv_cache_hit_rate: must be ≤ 1, got 1.2"),
    ({"kv_cache_hit_rate": "high"}, "wrong_type", "kv_cache_hit_rate: must be a number"),
    ({"status": "failed"}, "out_of_range", 'status: must be "ok" or "error", got "failed"'),
    ({"status": 0}, "wrong_type", 'status: must be "ok" or "error", got 0'),
    ({"cuda_error": True}, "wrong_type", "cuda_error: must be a cudaError_t name (string) or code"),
    ({"cuda_error": -2}, "out_of_range", "cuda_error: code must be ≥ 0, got -2"),
    ({"cuda_error": ""}, "out_of_range", "cuda_error: must be a non-empty cudaError_t name"),
    ({"v": 2}, "unsupported_version", "v: unsupported schema version 2 (this decoder knows 1)"),
    ({"v": "1"}, "wrong_type", 'v: must be an integer schema version, got "1"'),
]


@pytest.mark.parametrize(("changes", "code", "text"), BAD_EVENTS,
                         ids=[f"{c}-{'/'.join(ch)}" for ch, c, _ in BAD_EVENTS])
def test_a_bad_single_event_is_rejected_with_an_actionable_reason(changes: dict[str, Any], code: str,
                                                                  text: str) -> None:
    decoded = decode_request_message(encode_request_event(good_event(**changes)), LIMITS)
    assert len(decoded.columns) == 0
    assert len(decoded.rejects) == 1
    rejection = decoded.rejects[0]
    assert rejection.reason_code == code
    assert text in rejection.reason
    assert rejection.reason.startswith(text.split(":")[0])  # single-event form: no "events[i]." prefix
    assert rejection.event_index == 0 and not decoded.rejected_whole_message


@pytest.mark.parametrize("size", [3, SCALAR_MAX_EVENTS + 1, 60], ids=["scalar", "vector-small", "vector"])
@pytest.mark.parametrize(("changes", "code", "text"), BAD_EVENTS,
                         ids=[f"{c}-{'/'.join(ch)}" for ch, c, _ in BAD_EVENTS])
def test_in_a_batch_only_the_bad_event_is_rejected(changes: dict[str, Any], code: str, text: str,
                                                   size: int) -> None:
    bad_at = size // 2
    events = [good_event(i, **(changes if i == bad_at else {})) for i in range(size)]
    decoded = decode_request_message(encode_request_events(events), LIMITS)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects] == [(code, bad_at)]
    assert f"events[{bad_at}].{text}" in decoded.rejects[0].reason
    kept = [e for i, e in enumerate(events) if i != bad_at]
    assert list(decoded.columns.request_id) == [e["request_id"] for e in kept]
    assert decoded.columns.latency_ms.tolist() == [e["latency_ms"] for e in kept]


def test_a_mixed_batch_keeps_every_good_event_with_its_values() -> None:
    events: list[Any] = [
        good_event(0, ttft_ms=12.5, queue_length=3, kv_cache_hit_rate=0.5, status="error",
                   cuda_error="cudaErrorMemoryAllocation", extra_field={"ignored": True}),
        good_event(1, latency_ms=-3),
        good_event(2, prompt_tokens=12.0, batch_size=32.0, cuda_error=700.0, v=1),
        "not an event",
        good_event(4, batch_size=40, batch_capacity=32),
        good_event(5),
    ]
    decoded = decode_request_message(encode_request_events(events), LIMITS)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects] == [
        ("out_of_range", 1), ("not_an_object", 3), ("batch_over_capacity", 4)]
    assert decoded.rejects[1].reason == 'events[3]: must be an event object, got "not an event"'
    cols = decoded.columns
    assert list(cols.request_id) == ["req-0", "req-2", "req-5"]
    assert cols.prompt_tokens.dtype == np.int64 and cols.prompt_tokens.tolist() == [10, 12, 15]
    assert cols.batch_size.tolist() == [4, 32, 4]
    assert cols.batch_capacity.tolist() == [32, 32, 32]
    assert cols.ts.tolist() == [1_700_000_000.0, 1_700_000_002.0, 1_700_000_005.0]
    assert cols.ttft_ms[0] == 12.5 and np.isnan(cols.ttft_ms[1:]).all()  # absent = NaN, never 0
    assert cols.queue_length[0] == 3 and np.isnan(cols.queue_length[1:]).all()
    assert cols.kv_cache_hit_rate[0] == 0.5 and np.isnan(cols.kv_cache_hit_rate[1:]).all()
    assert cols.is_error.tolist() == [True, False, False]
    assert list(cols.cuda_error) == ["cudaErrorMemoryAllocation", 700, None]
    assert type(cols.cuda_error[1]) is int  # integral float codes are normalised


@pytest.mark.parametrize(("value", "code", "text"), [
    (None, "empty", "null"),
    (b"", "empty", "zero bytes"),
    (b" \n\t ", "empty", "whitespace"),
    (b"{oops", "malformed_json", "malformed JSON"),
    (b'{"latency_ms": 1', "malformed_json", "malformed JSON"),
    (b'{"request_id": "\xff\xfe"}', "malformed_json", "UTF-8"),
    (b'{"request_id": "\\ud800"}', "malformed_json", "malformed JSON"),  # lone surrogate
    (b"[" * 5000 + b"]" * 5000, "malformed_json", "malformed JSON"),  # nesting bomb
    (b"[1, 2]", "not_an_object", "got an array"),
    (b'"an event"', "not_an_object", "got a string"),
    (b"null", "not_an_object", "got null"),
    (b"42", "not_an_object", "got a number"),
    (b'{"events": {"request_id": "a"}}', "wrong_type", "events: must be an array of event objects"),
    (b'{"v": 2, "events": []}', "unsupported_version", "v: unsupported schema version 2"),
    (b'{"v": true, "events": []}', "wrong_type", "v: must be an integer schema version, got true"),
])
def test_message_level_rejections(value: bytes | None, code: str, text: str) -> None:
    decoded = decode_request_message(value, LIMITS)
    assert len(decoded.columns) == 0
    assert [r.reason_code for r in decoded.rejects] == [code]
    assert text in decoded.rejects[0].reason
    assert decoded.rejects[0].event_index is None and decoded.rejected_whole_message


def test_a_value_over_the_size_limit_is_rejected_before_parsing() -> None:
    value = encode_request_events([good_event(i, pad="x" * 1000) for i in range(1100)])
    assert len(value) > 1 << 20
    decoded = decode_request_message(value, LIMITS)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects] == [("too_large", None)]
    assert f"value is {len(value)} bytes > limit 1048576 (limits.max_message_bytes)" == decoded.rejects[0].reason
    assert len(decode_request_message(value, LimitSettings(max_message_bytes=2 << 20)).columns) == 1100


def test_too_many_events_in_one_message() -> None:
    limits = LimitSettings(max_events_per_message=5)
    decoded = decode_request_message(encode_request_events([good_event(i) for i in range(6)]), limits)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects] == [("too_many_events", None)]
    assert "events: 6 events > limit 5" in decoded.rejects[0].reason
    assert len(decode_request_message(encode_request_events([good_event()] * 5), limits).columns) == 5


def test_the_token_limit_is_configurable() -> None:
    limits = LimitSettings(max_tokens=100)
    decoded = decode_request_message(encode_request_event(good_event(prompt_tokens=101)), limits)
    assert decoded.rejects[0].reason == "prompt_tokens: 101 > limit 100 (limits.max_tokens)"
    assert len(decode_request_message(encode_request_event(good_event(prompt_tokens=100)), limits).columns) == 1


@pytest.mark.parametrize("size", [1, 20])
@pytest.mark.parametrize(("literal", "shown"), [("1e999", "inf"), ("-1e999", "-inf"), ("NaN", "NaN"),
                                                ("Infinity", "inf")])
def test_non_finite_numbers_reject_only_their_event(literal: str, shown: str, size: int) -> None:
    # JSON has no NaN, and orjson refuses 'NaN' and 1e999 (overflow to inf) for the whole message;
    # Python's json.dumps writes NaN/Infinity by default, so producers do send them.
    events = [good_event(i) for i in range(size)]
    text = orjson.dumps({"events": events}).decode()
    text = text.replace('"latency_ms":100.0', f'"latency_ms":{literal}', 1)
    decoded = decode_request_message(text.encode(), LIMITS)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects] == [("out_of_range", 0)]
    assert f"events[0].latency_ms: must be a finite number, got {shown}" == decoded.rejects[0].reason
    assert len(decoded.columns) == size - 1


def test_nan_in_an_optional_field_is_not_mistaken_for_absent() -> None:
    events = [good_event(i, ttft_ms=5.0) for i in range(20)] + [good_event(20)]
    text = orjson.dumps({"events": events}).decode().replace('"ttft_ms":5.0', '"ttft_ms":NaN', 1)
    decoded = decode_request_message(text.encode(), LIMITS)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects] == [("out_of_range", 0)]
    assert "ttft_ms: must be a finite number, got NaN" in decoded.rejects[0].reason


def test_several_problems_are_all_named_and_missing_fields_grouped() -> None:
    decoded = decode_request_message(b'{"events": [{"latency_ms": -1, "ts": 5, "status": "x"}]}', LIMITS)
    (rejection,) = decoded.rejects
    assert rejection.reason_code == "missing_field"
    assert rejection.reason == (
        "events[0]: required fields are missing: request_id, model, replica, prompt_tokens, "
        "completion_tokens; events[0].latency_ms: must be ≥ 0, got -1; "
        'events[0].status: must be "ok" or "error", got "x"')


# --- contract v1.1: batch fields optional -------------------------------------------------------

V11_EVENTS = [
    good_event(0),  # both batch fields: reported
    good_event(1, batch_size=_DROP, batch_capacity=_DROP),  # neither (an OTLP span)
    good_event(2, batch_size=None, batch_capacity=None),  # null is the same as absent
    good_event(3, batch_capacity=_DROP),  # a size without a capacity: no fill, no over-capacity check
    good_event(4, batch_size=_DROP, batch_capacity=64),  # a capacity alone
    good_event(5, batch_size=99, batch_capacity=_DROP),  # no capacity: 99 cannot be "over" it
]


@pytest.mark.parametrize("typed_fast_path", [True, False])
@pytest.mark.parametrize("per_event", [False, True])
def test_v1_1_batch_fields_are_optional_and_absent_means_unknown(typed_fast_path: bool, per_event: bool) -> None:
    values = ([encode_request_event(e) for e in V11_EVENTS] if per_event
              else [encode_request_events(V11_EVENTS * 3)])  # 18 events: the vectorised path
    decoded = decode_request_messages(values, LIMITS, typed_fast_path=typed_fast_path)
    assert decoded.rejects == [[] for _ in values]
    cols = decoded.columns
    n = len(V11_EVENTS)
    assert cols.batch_size.tolist()[:n] == [4, 0, 0, 4, 0, 99]
    assert cols.batch_capacity.tolist()[:n] == [32, 0, 0, 0, 64, 0]
    assert cols.batch_source.tolist()[:n] == [1, 0, 0, 1, 0, 1]
    fill = cols.batch_fill[:n]
    assert fill[0] == 4 / 32 and np.isnan(fill[1:]).all()  # never a division by an unknown capacity
    assert_columns_equal(cols.take(np.arange(n)), RequestColumns.from_rows(V11_EVENTS))


@pytest.mark.parametrize("typed_fast_path", [True, False])
def test_v1_1_present_batch_fields_are_still_checked(typed_fast_path: bool) -> None:
    events = [good_event(0, batch_capacity=_DROP, batch_size=0),
              good_event(1, batch_size=_DROP, batch_capacity=True),
              good_event(2, batch_size=40, batch_capacity=32),
              *[good_event(i, batch_size=_DROP) for i in range(3, 12)]]
    decoded = decode_request_messages([encode_request_events(events)], LIMITS, typed_fast_path=typed_fast_path)
    assert [(r.reason_code, r.event_index) for r in decoded.rejects[0]] == [
        ("out_of_range", 0), ("wrong_type", 1), ("batch_over_capacity", 2)]
    assert len(decoded.columns) == 9 and (decoded.columns.batch_size == 0).all()
    assert check_request_event(good_event(batch_size=_DROP, batch_capacity=_DROP)) is None


def test_unknown_fields_are_ignored_and_an_empty_batch_is_fine() -> None:
    event = good_event(0, future_field=[1, 2, {"x": None}], gpu="h100")
    assert len(decode_request_message(encode_request_event(event), LIMITS).columns) == 1
    empty = decode_request_message(b'{"v": 1, "events": []}', LIMITS)
    assert len(empty.columns) == 0 and empty.rejects == []


def test_single_and_batch_forms_decode_to_the_same_columns() -> None:
    events = [good_event(i, ttft_ms=float(i), status="error" if i % 3 == 0 else "ok") for i in range(30)]
    batch = decode_request_message(encode_request_events(events), LIMITS).columns
    singles = RequestColumns.concat([decode_request_message(encode_request_event(e), LIMITS).columns
                                     for e in events])
    polled = decode_request_messages([encode_request_event(e) for e in events], LIMITS).columns
    reference = RequestColumns.from_rows(events)
    for columns in (batch, singles, polled):
        assert_columns_equal(columns, reference)


def test_decoding_many_messages_maps_rows_and_rejects_to_their_message() -> None:
    values = [
        encode_request_events([good_event(0), good_event(1, latency_ms=-1), good_event(2)]),
        b"not json",
        encode_request_event(good_event(3)),
        None,
        encode_request_event(good_event(4, batch_size=99)),
    ]
    decoded = decode_request_messages(values, LIMITS)
    assert list(decoded.columns.request_id) == ["req-0", "req-2", "req-3"]
    assert decoded.message_index.tolist() == [0, 0, 2]
    assert [[r.reason_code for r in rs] for rs in decoded.rejects] == [
        ["out_of_range"], ["malformed_json"], [], ["empty"], ["batch_over_capacity"]]
    assert decoded.rejects[0][0].reason.startswith("events[1].latency_ms")
    assert decoded.rejects[4][0].reason.startswith("batch_size: 99")  # single-event form: no prefix


def test_check_request_event_is_the_decoders_verdict() -> None:
    assert check_request_event(good_event()) is None
    rejection = check_request_event(good_event(latency_ms=-3))
    assert rejection == Rejection("out_of_range", "latency_ms: must be ≥ 0, got -3", 0)
    assert check_request_event(good_event(prompt_tokens=101), LimitSettings(max_tokens=100)) is not None


def test_every_reason_code_the_decoder_emits_is_a_known_label() -> None:
    for changes, code, _ in BAD_EVENTS:
        assert code in REASON_CODES, changes


def test_encoders_write_what_the_decoder_reads() -> None:
    event = good_event(0, ttft_ms=np.float64(3.5), prompt_tokens=np.int64(7))
    assert orjson.loads(encode_request_event(event))["prompt_tokens"] == 7
    assert orjson.loads(encode_request_events([event])) == {"v": 1, "events": [orjson.loads(
        encode_request_event(event))]}
    assert decode_request_message(encode_request_events([event]), LIMITS).columns.ttft_ms.tolist() == [3.5]


# --- the vectorised paths must agree with the per-event reference ---------------------------------

def assert_columns_equal(actual: RequestColumns, expected: RequestColumns) -> None:
    assert len(actual) == len(expected)
    for name in ("ts", "latency_ms", "ttft_ms", "queue_length", "kv_cache_hit_rate"):
        np.testing.assert_array_equal(getattr(actual, name), getattr(expected, name), err_msg=name)
    for name in ("prompt_tokens", "completion_tokens", "batch_size", "batch_capacity"):
        assert getattr(actual, name).dtype == np.int64, name
        assert getattr(actual, name).tolist() == getattr(expected, name).tolist(), name
    assert actual.batch_source.dtype == np.int8
    assert actual.batch_source.tolist() == expected.batch_source.tolist()
    for name in ("request_id", "model", "replica", "cuda_error", "is_error"):
        assert list(getattr(actual, name)) == list(getattr(expected, name)), name


# Per field: values that are valid and values that are not (including the nasty ones: booleans,
# integral floats, numeric strings, non-finite, beyond int64, beyond float). _DROP = absent.
_ABSENT_OK = [_DROP, None]
VALUE_POOLS: dict[str, list[Any]] = {
    "request_id": ["a", "req-7", "模型", "", 1, True, None, _DROP, ["a"]],
    "model": ["m", "llama-3", "", 0, None, _DROP],
    "replica": ["r1", "r2", "", {}, None, _DROP],
    "ts": [1.7e9, 0, 1_700_000_000, 99_999_999_999.0, 1e11, -1, "1", True, math.inf, math.nan, None,
           _DROP, 10**400],
    "latency_ms": [0, 0.5, 120, 1e6, -3, -0.0, "5", False, math.inf, -math.inf, math.nan, None, _DROP,
                   10**30, 10**400],
    "prompt_tokens": [0, 12, 12.0, 10_000_000, 10_000_000.0, -1, 12.5, 10_000_001, True, "12", 1e30,
                      2**63, 2**64 - 1, math.inf, math.nan, None, _DROP],
    "completion_tokens": [0, 7, 7.0, -7, 0.5, False, None],
    "batch_size": [1, 4, 32.0, 64, 0, -1, 2.5, False, 2**63, 2**63 - 1, -2**63, math.nan, None],
    "batch_capacity": [32, 64, 64.0, 2**63 - 1, 2**63, 0, "32", 9.3e18, None, _DROP],
    "ttft_ms": [*_ABSENT_OK, 0, 12.5, 3, -1, "x", True, math.inf, math.nan, 10**400],
    "queue_length": [*_ABSENT_OK, 0, 7, 7.0, 2**63 - 1, -1, 1.5, True, 2**63, "3", math.inf],
    "kv_cache_hit_rate": [*_ABSENT_OK, 0, 1, 0.5, 1.0, 1.01, -0.1, "0.5", True, math.nan],
    "status": [*_ABSENT_OK, "ok", "error", "fail", "OK", 1, True, [], ""],
    "cuda_error": [*_ABSENT_OK, "cudaErrorMemoryAllocation", 2, 2.0, 0, "", -1, True, 2.5, [1], {}, 2**63,
                   math.inf],
    "v": [*_ABSENT_OK, 1, 1.0, 2, 0, "1", True, 1.5],
}
VALID_POOLS: dict[str, list[Any]] = {
    "request_id": ["a", "req-7"], "model": ["m", "llama-3"], "replica": ["r1", "r2"],
    "ts": [1.7e9, 1_700_000_000], "latency_ms": [0, 0.5, 120], "prompt_tokens": [0, 12, 12.0],
    "completion_tokens": [0, 7], "batch_size": [1, 4, 32], "batch_capacity": [32, 64],
    "ttft_ms": [*_ABSENT_OK, 12.5], "queue_length": [*_ABSENT_OK, 7], "kv_cache_hit_rate": [*_ABSENT_OK, 0.5],
    "status": [*_ABSENT_OK, "ok", "error"], "cuda_error": [*_ABSENT_OK, "cudaErrorLaunchTimeout"],
    "v": [*_ABSENT_OK, 1],
}


@st.composite
def events_from(draw: st.DrawFn, pools: dict[str, list[Any]]) -> dict[str, Any]:
    event = {name: draw(st.sampled_from(pool)) for name, pool in pools.items()}
    return {k: v for k, v in event.items() if v is not _DROP}


@st.composite
def event_batches(draw: st.DrawFn) -> list[dict[str, Any]]:
    # mostly-valid batches reach the fast path; one field of a few events drawn from the full pool
    base = draw(st.lists(events_from(VALID_POOLS), min_size=SCALAR_MAX_EVENTS + 1, max_size=24))
    spoil = draw(st.lists(st.tuples(st.integers(0, len(base) - 1), st.sampled_from(sorted(VALUE_POOLS))),
                          max_size=4))
    for index, name in spoil:
        value = draw(st.sampled_from(VALUE_POOLS[name]))
        if value is _DROP:
            base[index].pop(name, None)
        else:
            base[index][name] = value
    if draw(st.booleans()):  # an uncommon shape: every event with exactly the same keys
        keys = set(base[0])
        base = [e for e in base if set(e) == keys] or base[:1]
    return base


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_batches())
def test_fast_and_generic_vector_paths_agree_with_the_per_event_reference(events: list[dict[str, Any]]) -> None:
    expected_bad = [bool(event_problems(e, LIMITS.max_tokens)) for e in events]
    for fast in (True, False):
        columns, bad = validate_columns(events, LIMITS.max_tokens, fast=fast)
        assert bad.tolist() == expected_bad, f"fast={fast}"
        good = [e for e, b in zip(events, expected_bad, strict=True) if not b]
        assert_columns_equal(columns.take(~bad), RequestColumns.from_rows(good) if good else RequestColumns.empty())


@settings(max_examples=200, deadline=None)
@given(st.lists(events_from(VALUE_POOLS), min_size=1, max_size=20))
def test_every_event_is_either_decoded_or_rejected_with_one_reason(events: list[dict[str, Any]]) -> None:
    value = json.dumps({"events": events}).encode()  # stdlib: writes NaN/Infinity, big ints
    decoded = decode_request_message(value, LIMITS)
    if decoded.rejected_whole_message:  # only when orjson cannot write the document back
        assert decoded.rejects[0].reason_code == "malformed_json"
        return
    rejected = [r.event_index for r in decoded.rejects if r.event_index is not None]
    assert rejected == sorted(set(rejected)) and len(rejected) == len(decoded.rejects)
    assert len(decoded.columns) + len(rejected) == len(events)
    for r in decoded.rejects:
        assert r.reason_code in REASON_CODES
        assert r.reason.startswith(f"events[{r.event_index}]")
        assert r.reason_code == event_problems(events[r.event_index or 0], LIMITS.max_tokens)[0][0]


@st.composite
def poll_values(draw: st.DrawFn) -> list[bytes]:
    """A poll's worth of values: single events, batches, valid or not, as producers write them."""
    values = []
    for _ in range(draw(st.integers(1, 6))):
        events = draw(st.lists(events_from(VALID_POOLS) | events_from(VALUE_POOLS), min_size=1, max_size=12))
        doc: Any = {"events": events} if draw(st.booleans()) else events[0]
        values.append(json.dumps(doc).encode())
    return values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(poll_values())
def test_the_typed_fast_path_gives_exactly_the_general_paths_result(values: list[bytes]) -> None:
    typed = decode_request_messages(values, LIMITS)
    general = decode_request_messages(values, LIMITS, typed_fast_path=False)
    assert typed.rejects == general.rejects
    assert typed.message_index.tolist() == general.message_index.tolist()
    assert_columns_equal(typed.columns, general.columns)


def test_the_typed_fast_path_honours_a_configured_token_limit() -> None:
    limits = LimitSettings(max_tokens=50)
    values = [encode_request_events([good_event(0, prompt_tokens=50), good_event(1, prompt_tokens=51)]),
              encode_request_event(good_event(2, completion_tokens=51))]
    decoded = decode_request_messages(values, limits)
    assert list(decoded.columns.request_id) == ["req-0"]
    assert [[r.reason_code for r in rs] for rs in decoded.rejects] == [["too_many_tokens"], ["too_many_tokens"]]


# --- fuzz: nothing ever raises ----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from([f.name for f in REQUEST_FIELDS] + ["v", "events", "x"])
event_like = st.dictionaries(field_names, json_values, max_size=16)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_raise(value: bytes) -> None:
    decoded = decode_request_message(value, LIMITS)
    assert isinstance(decoded.columns, RequestColumns)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_json_never_raises(doc: Any) -> None:
    decoded = decode_request_message(orjson.dumps(doc), LIMITS)
    assert len(decoded.columns) == 0 or not decoded.rejected_whole_message


@settings(max_examples=120, deadline=None)
@given(st.one_of(event_like, st.fixed_dictionaries({"events": st.lists(event_like | json_values, max_size=12)})))
def test_arbitrary_event_shaped_json_never_raises(doc: dict[str, Any]) -> None:
    for value in (orjson.dumps(doc), json.dumps(doc).encode()):
        decoded = decode_request_message(value, LIMITS)
        if not decoded.rejected_whole_message:
            count = len(doc["events"]) if "events" in doc else 1
            assert len(decoded.columns) + len(decoded.rejects) == count


def test_required_fields_are_the_contracts() -> None:
    assert REQUIRED_FIELDS == ("request_id", "ts", "model", "replica", "latency_ms", "prompt_tokens",
                               "completion_tokens")  # v1.1: batch_size / batch_capacity optional


# --- the whole-poll typed path: one msgspec pass per poll, the reference's result ----------

# Valid events exactly as msgspec takes them (no 12.0 for an integer), batch fields absent, null or
# over capacity (64 > 32: the one rule the typed path words afterwards).
STRICT_POOLS: dict[str, list[Any]] = {
    **VALID_POOLS,
    "prompt_tokens": [0, 12, 10_000_000],
    "batch_size": [1, 4, 32, 64, None, _DROP],
    "batch_capacity": [32, 64, None, _DROP],
    "queue_length": [*_ABSENT_OK, 0, 7, 2**63 - 1],
    "cuda_error": [*_ABSENT_OK, "cudaErrorLaunchTimeout", 700],
}


@st.composite
def clean_polls(draw: st.DrawFn) -> list[bytes]:
    """A poll whose messages are all in one form and all parse as msgspec wants them."""
    messages = draw(st.lists(st.lists(events_from(STRICT_POOLS), min_size=1, max_size=12), min_size=1, max_size=8))
    if draw(st.booleans()):
        return [orjson.dumps({"v": 1, "events": events}) for events in messages]
    return [orjson.dumps(events[0]) for events in messages]


def assert_same_decode(actual: Any, expected: Any) -> None:
    assert actual.rejects == expected.rejects
    assert actual.message_index.tolist() == expected.message_index.tolist()
    assert_columns_equal(actual.columns, expected.columns)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clean_polls())
def test_a_clean_poll_is_decoded_in_one_pass_with_the_references_result(values: list[bytes]) -> None:
    runs = decode_typed_runs(values, LIMITS)
    assert (runs.maps, runs.leftovers) == (1, [])  # one C-level map, no message left to Python
    assert_same_decode(decode_request_messages(values, LIMITS),
                       decode_request_messages(values, LIMITS, typed_fast_path=False))


def test_a_large_poll_is_transposed_in_chunks_without_changing_a_row() -> None:
    # 1,300 rows: three transpose chunks of 512; over-capacity rows on both sides of a boundary
    events = [good_event(i, **({"batch_size": 40} if i in (0, 511, 512, 1299) else {}),
                         **({"ttft_ms": 1.5, "cuda_error": 700} if i % 7 == 0 else {})) for i in range(1300)]
    singles = [encode_request_event(e) for e in events]
    batches = [encode_request_events(events[i:i + 100]) for i in range(0, 1300, 100)]
    for values in (singles, batches):
        assert decode_typed_runs(values, LIMITS).maps == 1
        decoded = decode_request_messages(values, LIMITS)
        assert_same_decode(decoded, decode_request_messages(values, LIMITS, typed_fast_path=False))
        assert len(decoded.columns) == 1296
    assert [r.reason for r in decode_request_messages(batches, LIMITS).rejects[5]] == [
        "events[11].batch_size: 40 > batch_capacity 32", "events[12].batch_size: 40 > batch_capacity 32"]


@pytest.mark.parametrize("shape", ["queue-int-then-absent", "queue-int-then-null", "ttft-null", "batch-null",
                                   "errors-few", "errors-many", "cuda-none", "cuda-code-and-name"])
def test_every_column_shape_packs_as_the_reference_reads_it(shape: str) -> None:
    # columns_from_typed_events packs numbers with struct and falls back on a value that does not
    # pack (an explicit null, NaN meaning absent in an integer field); failed requests are found by
    # C scans up to a few per chunk, by a comparison of every row beyond
    changes_by_shape: dict[str, dict[str, Any]] = {
        "queue-int-then-absent": {"queue_length": 3}, "queue-int-then-null": {"queue_length": 3},
        "ttft-null": {"ttft_ms": 2.5}, "batch-null": {}, "errors-few": {}, "errors-many": {},
        "cuda-none": {"cuda_error": None}, "cuda-code-and-name": {"cuda_error": 700},
    }
    changes = changes_by_shape[shape]
    events = [good_event(i, **changes) for i in range(600)]  # two transpose chunks
    for i in (1, 300, 599):
        if shape == "queue-int-then-absent":
            del events[i]["queue_length"]
        elif shape == "queue-int-then-null":
            events[i]["queue_length"] = None
        elif shape == "ttft-null":
            events[i]["ttft_ms"] = None
        elif shape == "batch-null":
            events[i]["batch_size"] = None
        elif shape == "cuda-code-and-name":
            events[i]["cuda_error"] = "cudaErrorLaunchTimeout"
    errors = {"errors-few": range(0, 600, 40), "errors-many": range(0, 600, 3)}.get(shape, range(0))
    for i in errors:
        events[i]["status"] = "error"
    for i in range(0, 600, 7):
        events[i].setdefault("status", "ok")
    for values in ([encode_request_event(e) for e in events],
                   [encode_request_events(events[i:i + 100]) for i in range(0, 600, 100)]):
        assert decode_typed_runs(values, LIMITS).leftovers == []
        decoded = decode_request_messages(values, LIMITS)
        assert_same_decode(decoded, decode_request_messages(values, LIMITS, typed_fast_path=False))
        assert len(decoded.columns) == 600 and int(decoded.columns.is_error.sum()) == len(errors)
    for size in (20, 100, 600):  # np.fromiter, packed in one chunk, packed chunks concatenated
        columns = decode_request_messages([encode_request_event(e) for e in events[:size]], LIMITS).columns
        assert all(getattr(columns, name).flags.writeable for name in ("ts", "queue_length", "prompt_tokens",
                                                                       "batch_size", "kv_cache_hit_rate"))


_ONE = encode_request_event(good_event(0))


@pytest.mark.parametrize(("values", "leftovers", "maps"), [
    ([_ONE, None], [1], 1),
    ([_ONE, b""], [1], 1),
    ([_ONE, encode_request_events([good_event(1)]), _ONE], [], 2),  # the batch decoded alone
    ([encode_request_events([good_event(1)]), _ONE], [], 1),
    ([encode_request_event(good_event(0, prompt_tokens=12.0))], [0], 1),
    ([_ONE, encode_request_event(good_event(0, prompt_tokens=-1)), _ONE], [1], 2),
    ([_ONE, encode_request_event(good_event(0, latency_ms=-1)), _ONE], [], 1),  # judged on the columns
    ([_ONE, encode_request_event(good_event(0, pad="x" * 4096))], [0, 1], 0),  # rare: all alone
    ([encode_request_events([good_event(i) for i in range(6)]), encode_request_events([good_event(9)])], [0], 1),
    ([], [], 0),
], ids=["null", "empty", "forms-mixed", "batch-then-single", "integral-float", "invalid-event",
        "number-out-of-range", "too-large", "too-many-events", "empty-poll"])
def test_a_refused_message_ends_a_run_and_is_left_to_the_per_message_paths(values: list[bytes | None],
                                                                          leftovers: list[int], maps: int) -> None:
    limits = LimitSettings(max_message_bytes=4096, max_events_per_message=5)
    runs = decode_typed_runs(values, limits)
    assert (runs.leftovers, runs.maps) == (leftovers, maps)
    assert_same_decode(decode_request_messages(values, limits),
                       decode_request_messages(values, limits, typed_fast_path=False))


def test_one_bad_message_costs_a_poll_one_more_pass_not_its_speed() -> None:
    values = [encode_request_event(good_event(i)) for i in range(2000)]
    values[700] = encode_request_event(good_event(700, prompt_tokens=-1))
    values[1500] = b"{oops"
    runs = decode_typed_runs(values, LIMITS)
    assert (runs.maps, runs.leftovers, len(runs.events)) == (3, [700, 1500], 1998)
    decoded = decode_request_messages(values, LIMITS)
    assert_same_decode(decoded, decode_request_messages(values, LIMITS, typed_fast_path=False))
    assert decoded.rejects.rejected.keys() == {700, 1500}
    assert [r.reason_code for r in decoded.rejects[1500]] == ["malformed_json"]


def test_a_number_out_of_range_sends_its_message_to_the_general_path_without_ending_the_run() -> None:
    # msgspec checks no number's range (the poll's columns do): the run goes on, and the message's
    # reasons read the values as sent (-3, not the -3.0 msgspec made of it)
    batch = [good_event(i) for i in range(5)]
    batch[1]["latency_ms"], batch[3]["kv_cache_hit_rate"] = -3, 1.5
    values = [encode_request_event(good_event(i)) for i in range(50)]
    values[10] = encode_request_event(good_event(10, ts=1.7e12))
    values[20] = encode_request_event(good_event(20, ttft_ms=-0.5, batch_size=64))
    values[30] = encode_request_event(good_event(30, latency_ms=-0.0))  # -0.0 >= 0: fine
    batches = [encode_request_events(batch), encode_request_events([good_event(7)])]
    for poll in (values, batches):
        runs = decode_typed_runs(poll, LIMITS)
        assert (runs.maps, runs.leftovers) == (1, [])
        decoded = decode_request_messages(poll, LIMITS)
        assert_same_decode(decoded, decode_request_messages(poll, LIMITS, typed_fast_path=False))
    decoded = decode_request_messages(values, LIMITS)
    assert decoded.rejects.rejected.keys() == {10, 20} and len(decoded.columns) == 48
    assert decoded.rejects[20][0].reason == ("ttft_ms: must be ≥ 0, got -0.5; "
                                             "batch_size: 64 > batch_capacity 32")
    assert [r.reason for r in decode_request_messages(batches, LIMITS).rejects[0]] == [
        "events[1].latency_ms: must be ≥ 0, got -3", "events[3].kv_cache_hit_rate: must be ≤ 1, got 1.5"]


def test_the_number_range_check_is_the_same_row_by_row_and_on_columns() -> None:
    # a few rows are checked in Python, more with numpy: both flag exactly the same rows (None: absent,
    # NaN in the columns)
    boundary: dict[str, list[float | None]] = {
        "ts": [0.0, -0.0, 99_999_999_999.99, 1e11, -1e-300], "latency_ms": [0.0, -0.0, 1e308, -1.0],
        "ttft_ms": [None, 0.0, -0.5], "kv_cache_hit_rate": [None, 0.0, 1.0, 1.0000001, -0.0]}
    events = [good_event(i, **{name: values[i % len(values)] for name, values in boundary.items()})
              for i in range(60)]
    columns = RequestColumns.from_rows(events)
    expected = [bool(event_problems(e, LIMITS.max_tokens)) for e in events]
    assert any(expected) and not all(expected)
    for size in (1, 5, SCALAR_MAX_EVENTS, SCALAR_MAX_EVENTS + 1, 60):
        part = columns.take(np.arange(size))
        scalar = current_typed_path._numbers_out_of_range_scalar(part)
        vector = current_typed_path._numbers_out_of_range(part)
        for found in (scalar, vector):
            assert (found.tolist() if found is not None else [False] * size) == expected[:size], size


def test_a_single_event_message_with_an_events_key_is_the_batch_form_in_a_poll() -> None:
    # every required field at the top level, and "events": the batch form wins, as the reference says
    values = [encode_request_event(good_event(0)),
              encode_request_event(good_event(1, events=[good_event(2)])),
              encode_request_event(good_event(3, events=None))]
    decoded = decode_request_messages(values, LIMITS)
    assert_same_decode(decoded, decode_request_messages(values, LIMITS, typed_fast_path=False))
    assert list(decoded.columns.request_id) == ["req-0", "req-2"]
    assert [[r.reason_code for r in rs] for rs in decoded.rejects] == [[], [], ["wrong_type"]]


def test_message_rejects_store_only_rejected_messages_and_read_like_a_list() -> None:
    bad = Rejection("empty", "value is null or zero bytes")
    rejects = MessageRejects(4, {2: [bad], 3: []})
    assert len(rejects) == 4 and rejects == [[], [], [bad], []] and rejects != [[], [], [], []]
    assert rejects[-2] == [bad] and rejects[1:3] == [[], [bad]]
    assert rejects.rejected == {2: [bad]}
    rejects[0].append(bad)  # a clean message's list is a fresh one: nothing leaks into the others
    assert rejects[0] == [] and rejects[1] == []
    with pytest.raises(IndexError):
        rejects[4]
    assert rejects == MessageRejects(4, {2: [bad]})


def test_the_decode_bench_runs_every_case_for_the_current_and_a_git_revisions_decoder(tmp_path: Path) -> None:
    # keeps bench/decode_bench.py from rotting: its cases decode what they claim, and a child process
    # running another revision's package (here HEAD's) answers a round of each case
    path = Path(__file__).resolve().parents[2] / "bench" / "decode_bench.py"
    spec = importlib.util.spec_from_file_location("decode_bench_smoke", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    import skewwatch.schemas as public_api

    singles, singles_all, batches, spoilt, sparse = bench.messages(public_api, n_events=400, n_singles=50)
    cases = bench.cases_for(public_api, LIMITS, singles, singles_all, batches, spoilt, sparse)
    assert {name: run() for name, run in cases.items()} == {
        "single": 50, "single_poll": 50, "single_poll_5000": 400, "single_poll_1_bad": 50, "batch100": 400,
        "batch100_poll": 400, "batch100_poll_sparse": 400, "batch100_10pct_bad": 400, "reference_batch100": 400}
    rates = bench.measure_side_by_side({"a": lambda seconds: bench.timed(lambda: 10, seconds)}, 0.01)
    assert rates["a"] > 0
    from bench.revision import baseline_package

    try:
        package = baseline_package("HEAD", tmp_path)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git checkout here")
    child = bench.DecoderChild(package)  # refuses to start when the child imported another package
    try:
        assert child.package.resolve() == tmp_path.resolve()
        assert set(cases) < set(child.cases)
        events, cpu = child.round("batch100_poll")(0.01)
        assert events >= 5000 and cpu > 0
    finally:
        child.close()
