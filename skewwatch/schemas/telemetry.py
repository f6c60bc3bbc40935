"""Decode and encode ``llm.gpu-telemetry`` records (contract gpu-telemetry.v1).

GPU nodes publish one sample per GPU per interval, field names one to one with NVML / DCGM
exporter / engine metrics (docs/design.md, "GPU telemetry"); a bad sample
is rejected with the same reason codes and wording as a bad request event (the worker dead-letters
it and counts ``skewwatch_rejected_total{reason=...}``), and decoding never raises. Telemetry is a
few samples per GPU per second, so this decoder checks field by field in plain Python.

>>> sample = TelemetrySample(ts=1.7e9, replica="r1", source="nvml", utilization_gpu=0.5)
>>> decode_telemetry(encode_telemetry(sample)) == sample
True
>>> decode_telemetry(b'{"ts": 1.7e9, "replica": "r1", "source": "nvml", "utilization_gpu": 50}').reason
'utilization_gpu: must be ≤ 1, got 50'
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from skewwatch.schemas.fields import (
    TS_MAX_S,
    FieldSpec,
    Problem,
    check_integer,
    check_number,
    check_string,
    check_version,
    missing_problem,
    parse_json,
)
from skewwatch.schemas.limits import DEFAULT_LIMITS, InputLimits
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.telemetry_sample import TelemetrySample

_ANY = -float("inf")  # minimum of a number that may be negative (temperature)

TELEMETRY_FIELDS: Final[tuple[FieldSpec, ...]] = (
    FieldSpec("ts", "number", True, exclusive_maximum=TS_MAX_S),
    FieldSpec("replica", "string", True),
    FieldSpec("source", "string", True),
    FieldSpec("node", "string", False),
    FieldSpec("gpu_index", "integer", False),
    FieldSpec("gpu_uuid", "string", False),
    FieldSpec("memory_used_bytes", "number", False),
    FieldSpec("memory_total_bytes", "number", False),
    FieldSpec("utilization_gpu", "number", False, maximum=1.0),
    FieldSpec("power_w", "number", False),
    FieldSpec("temperature_c", "number", False, minimum=_ANY),
    FieldSpec("throttle_reasons", "integer", False),
    FieldSpec("ecc_uncorrected_total", "integer", False),
    FieldSpec("xid_last", "integer", False),
    FieldSpec("xid_count_5m", "integer", False),
    FieldSpec("queue_length", "integer", False),
    FieldSpec("running_requests", "integer", False),
    FieldSpec("kv_cache_usage", "number", False, maximum=1.0),
    FieldSpec("kv_cache_hit_rate", "number", False, maximum=1.0),
    FieldSpec("preemptions_total", "integer", False),
    FieldSpec("memory_reserved_bytes", "number", False),
    FieldSpec("memory_allocated_bytes", "number", False),
    FieldSpec("batch_capacity", "integer", False, minimum=1),  # v1.1: the engine's max running batch
    # v1.3: live per-token latencies since the previous sample (delta of the engine's histograms)
    FieldSpec("tpot_count", "integer", False),
    FieldSpec("tpot_mean_s", "number", False),
    FieldSpec("tpot_p50_s", "number", False),
    FieldSpec("tpot_p99_s", "number", False),
    FieldSpec("ttft_count", "integer", False),
    FieldSpec("ttft_mean_s", "number", False),
    FieldSpec("ttft_p50_s", "number", False),
    FieldSpec("ttft_p99_s", "number", False),
)
_MAX_PROBLEMS_SHOWN = 5


def _check(spec: FieldSpec, value: Any) -> Problem | None:
    if spec.kind == "string":
        return check_string(spec.name, value, allow_empty=not spec.required)
    if spec.kind == "number":
        return check_number(spec, value)
    return check_integer(spec, value)


def decode_telemetry(value: bytes | None, limits: InputLimits | None = None) -> TelemetrySample | Rejection:
    """One ``llm.gpu-telemetry`` value -> the sample, or why it was rejected. Never raises.

    Absent and null measurements are "not reported" (None). Unknown fields are ignored.
    """
    limits = limits or DEFAULT_LIMITS
    if value is None or len(value) == 0:
        return Rejection.message_level("empty", "value is null or zero bytes")
    if len(value) > limits.max_message_bytes:
        return Rejection.message_level(
            "too_large", f"value is {len(value)} bytes > limit {limits.max_message_bytes} "
                         "(limits.max_message_bytes)")
    doc, rejection = parse_json(value)
    if rejection is not None:
        return rejection
    if type(doc) is not dict:
        return Rejection.message_level("not_an_object", "telemetry sample must be a JSON object")
    version = doc.get("v")
    if version is not None:
        problem = check_version("v", version)
        if problem is not None:
            return Rejection.message_level(*problem)
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for spec in TELEMETRY_FIELDS:
        field_value = doc.get(spec.name)
        if field_value is None:
            if spec.required:
                problems.append(missing_problem(spec.name, doc))
            continue
        problem = _check(spec, field_value)
        if problem is not None:
            problems.append(problem)
        elif spec.kind == "integer":
            values[spec.name] = int(field_value)  # 12.0 -> 12
        elif spec.kind == "number":
            values[spec.name] = float(field_value)
        else:
            values[spec.name] = field_value
    if problems:
        text = "; ".join(text for _, text in problems[:_MAX_PROBLEMS_SHOWN])
        if len(problems) > _MAX_PROBLEMS_SHOWN:
            text += f"; ...(+{len(problems) - _MAX_PROBLEMS_SHOWN} more)"
        return Rejection.message_level(problems[0][0], text)
    return TelemetrySample(**values)


def encode_telemetry(sample: TelemetrySample) -> bytes:
    """The wire form: unknown (None) measurements left out; NaN/inf written as null (not reported)."""
    return orjson.dumps(sample.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY)


__all__ = ["TELEMETRY_FIELDS", "decode_telemetry", "encode_telemetry"]
