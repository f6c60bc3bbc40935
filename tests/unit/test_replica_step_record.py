"""The stage 1 -> stage 2 record (skewwatch.pipeline.replica_step_record): one record per input partition, model
and step, decoding to exactly the objects stage 1 closed (what their to_dict/from_dict gives)."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from skewwatch.config import WindowSettings
from skewwatch.pipeline.replica_step_record import (
    decode_model_step,
    encode_model_step,
    model_step_inputs,
    read_step_header,
    replica_step_dicts,
    step_header,
)
from skewwatch.pipeline.step_completion import ModelStep, StepAssembler
from skewwatch.pipeline.window import PartitionWindows, ReplicaStep, WindowSummary
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample

KEYS = [("llama", f"r{i}") for i in range(7)] + [("mistral", "m1"), ("mistral", "idle")]


def closed_steps(seed: int = 3) -> list[ReplicaStep]:
    """Every kind of row: many events, a few, none in the newest step (idle), errors with CUDA codes,
    optional fields on some events only."""
    rng = np.random.default_rng(seed)
    windows = PartitionWindows(WindowSettings())
    rows: list[dict[str, Any]] = []
    for i in range(600):
        model, replica = KEYS[int(rng.integers(len(KEYS) - 1))] if i else KEYS[-1]
        ts = 100.0 if replica == "idle" else float(rng.uniform(100.0, 160.0))
        ev: dict[str, Any] = {"request_id": f"e{i}", "ts": ts, "model": model, "replica": replica,
                              "latency_ms": float(rng.lognormal(5.0, 1.0)), "prompt_tokens": int(rng.integers(0, 4000)),
                              "completion_tokens": int(rng.integers(0, 900))}
        if i % 3:
            ev["batch_size"], ev["batch_capacity"] = int(rng.integers(1, 9)), 8
        if i % 2:
            ev["ttft_ms"] = float(rng.lognormal(3.0, 0.8))
        if i % 5 == 0:
            ev["queue_length"], ev["kv_cache_hit_rate"] = int(rng.integers(0, 9)), float(rng.uniform())
        if i % 11 == 0:
            ev["status"], ev["cuda_error"] = "error", "cudaErrorLaunchTimeout"
        rows.append(ev)
    windows.apply(RequestColumns.from_rows(sorted(rows, key=lambda e: e["ts"])))
    windows.advance_watermark(165.0)
    return [s for s in windows.close_steps() if s.features.window_end == 160.0]


def same_summary(got: WindowSummary, want: WindowSummary) -> None:
    for f in dataclasses.fields(WindowSummary):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f.name
            assert a.tobytes() == b.tobytes(), f.name  # bit for bit
        else:
            assert type(a) is type(b) and a == b, (f.name, a, b)


def test_decoded_objects_equal_their_dict_round_trip_bit_for_bit() -> None:
    steps = closed_steps()
    assert len(steps) == len(KEYS) and any(s.summary.step_cuda_errors for s in steps)
    assert any(s.features.step_count == 0 for s in steps)  # the idle replica
    telemetry = [TelemetrySample(ts=158.5, replica=s.features.replica or "", source="nvml", node="n1",
                                 memory_used_bytes=7e10, memory_total_bytes=8e10) if i % 2 else None
                 for i, s in enumerate(steps)]
    stale = [["memory"] if i % 3 == 0 else [] for i in range(len(steps))]
    record = encode_model_step("llama", 160.0, 3, steps, telemetry, stale)
    decoded = decode_model_step(record)
    assert [name for name, _ in decoded] == [s.features.replica for s in steps]
    for (_, got), step, sample in zip(decoded, steps, telemetry, strict=True):
        # the same replica step through its JSON dicts: types, dtypes and values alike
        want_summary = WindowSummary.from_dict(orjson.loads(orjson.dumps(step.summary.to_dict())))
        want_features = FeatureVector.from_dict(orjson.loads(orjson.dumps(step.features)))
        want_telemetry = None if sample is None else TelemetrySample.from_dict(orjson.loads(orjson.dumps(sample)))
        same_summary(got.summary, want_summary)
        assert got.features == want_features and got.telemetry == want_telemetry
        assert got.summary.features() == want_summary.features()
    bodies = replica_step_dicts(record)
    assert [b["telemetry_stale"] for b in bodies] == stale
    assert bodies[1]["telemetry"] == telemetry[1].to_dict()  # type: ignore[union-attr]
    assert bodies[0]["features"] == steps[0].features.to_dict()


def test_the_record_is_smaller_than_one_json_record_per_replica() -> None:
    steps = closed_steps()
    record = encode_model_step("llama", 160.0, 0, steps, [None] * len(steps), [[]] * len(steps))
    per_replica = sum(len(orjson.dumps({"summary": s.summary.to_dict(), "features": s.features, "telemetry": None,
                                        "telemetry_stale": []})) for s in steps)
    assert len(record) < per_replica


def test_header_routes_and_other_records_have_none() -> None:
    header = read_step_header([("other", b"x"), *step_header(105.0, 2, 17, part=1)])
    assert header is not None and tuple(header) == (105.0, 2, 17, 1)
    assert read_step_header(None) is None and read_step_header([]) is None


def test_a_corrupt_record_is_refused() -> None:
    steps = closed_steps()
    record = encode_model_step("llama", 160.0, 0, steps, [None] * len(steps), [[]] * len(steps))
    (length,) = struct.unpack_from(">I", record)
    head = orjson.loads(record[4:4 + length])

    def rebuilt(change: dict[str, Any], tail: bytes | None = None) -> bytes:
        new = orjson.dumps({**head, **change})
        return struct.pack(">I", len(new)) + new + (record[4 + length:] if tail is None else tail)

    with pytest.raises(ValueError, match="format"):
        decode_model_step(rebuilt({"v": 1}))
    with pytest.raises(ValueError, match="version"):
        decode_model_step(rebuilt({"summary": {**head["summary"], "v": 99}}))
    with pytest.raises(ValueError, match="out of bounds"):
        decode_model_step(rebuilt({}, tail=b""))
    sketches = head["summary"]["sparse"]  # every sketch field's (2, entries), latency first
    assert head["summary"]["fields"]["latency"] == {"kind": "sparse", "index": 0}
    original = np.frombuffer(record, dtype=np.int32, count=sketches["nbytes"] // 4,
                             offset=4 + length + sketches["at"]).reshape(2, -1)

    def with_sketches(change: Callable[[np.ndarray], None]) -> bytes:
        changed = original.copy()
        change(changed)
        tail = bytearray(record[4 + length:])
        tail[sketches["at"]:sketches["at"] + sketches["nbytes"]] = changed.tobytes()
        return rebuilt({}, tail=bytes(tail))

    row = next(i for i, n in enumerate(sketches["lengths"][0]) if n >= 2)  # a latency sketch of 2+ slots
    at = sum(sketches["lengths"][0][:row])

    def unsorted(a: np.ndarray) -> None:
        a[0, at:at + 2] = a[0, at:at + 2][::-1].copy()  # its first two slots swapped

    def negative(a: np.ndarray) -> None:
        a[0, 0] = -1

    def zero_count(a: np.ndarray) -> None:
        a[1, 5] = 0

    for change in (unsorted, negative, zero_count):
        with pytest.raises(ValueError, match="sorted, in range, with positive counts"):
            decode_model_step(with_sketches(change))
    decode_model_step(with_sketches(lambda a: None))  # the same bytes again: fine
    with pytest.raises(ValueError, match="lengths"):
        decode_model_step(rebuilt({"summary": {**head["summary"],
                                               "sparse": {**sketches, "lengths": sketches["lengths"][:-1] + [[1]]}}}))


def test_model_step_inputs_takes_every_chunk_once_per_replica() -> None:
    steps = closed_steps()
    llama = [s for s in steps if s.features.model == "llama"]
    first = encode_model_step("llama", 160.0, 0, llama[:4], [None] * 4, [[]] * 4)
    second = encode_model_step("llama", 160.0, 1, llama[3:], [None] * (len(llama) - 3), [[]] * (len(llama) - 3))
    a = StepAssembler()
    a.add_chunk("llama", 160.0, source=0, replicas=4, payload=first)
    a.add_chunk("llama", 160.0, source=1, replicas=len(llama) - 3, payload=second)
    assert a.pending == len(llama) + 1  # r3 is held twice (a replay across a rebalance) ...
    [step] = a.complete(force_until=160.0)
    inputs = model_step_inputs(step)
    assert list(inputs) == [s.features.replica for s in llama]  # ... and decoded once
    assert all(inputs[s.features.replica or ""].features == s.features for s in llama)
    assert model_step_inputs(ModelStep("m", 5.0, {})) == {}
