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
from skewwatch.pipeline.model_merge import merge_summaries
from skewwatch.pipeline.replica_step_record import (
    decode_model_step,
    encode_model_step,
    format_problem,
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


def merged(steps: list[ReplicaStep]) -> WindowSummary:
    """The record's summary: its replicas' summaries merged (stage 1 merges them on columns)."""
    return merge_summaries(steps[0].features.model, steps[0].features.window_end, [s.summary for s in steps],
                           WindowSettings())


def test_decoded_objects_equal_their_dict_round_trip_bit_for_bit() -> None:
    steps = closed_steps()
    assert len(steps) == len(KEYS) and any(s.summary.step_cuda_errors for s in steps)
    assert any(s.features.step_count == 0 for s in steps)  # the idle replica
    llama = [s for s in steps if s.features.model == "llama"]
    telemetry = [TelemetrySample(ts=158.5, replica=s.features.replica or "", source="nvml", node="n1",
                                 memory_used_bytes=7e10, memory_total_bytes=8e10) if i % 2 else None
                 for i, s in enumerate(llama)]
    stale = [["memory"] if i % 3 == 0 else [] for i in range(len(llama))]
    summary = merged(llama)
    assert summary.step_cuda_errors  # the CUDA codes travel in the merged summary
    record = encode_model_step("llama", 160.0, 3, [s.features for s in llama], summary, telemetry, stale)
    decoded = decode_model_step(record)
    assert [name for name, _ in decoded.replicas] == [s.features.replica for s in llama]
    for (_, got), step, sample in zip(decoded.replicas, llama, telemetry, strict=True):
        # the same replica step through its JSON dicts: types and values alike
        want_features = FeatureVector.from_dict(orjson.loads(orjson.dumps(step.features)))
        want_telemetry = None if sample is None else TelemetrySample.from_dict(orjson.loads(orjson.dumps(sample)))
        assert got.features == want_features and got.telemetry == want_telemetry
    same_summary(decoded.summary, WindowSummary.from_dict(orjson.loads(orjson.dumps(summary.to_dict()))))
    assert decoded.summary.features() == summary.features()
    bodies = replica_step_dicts(record)
    assert [b["telemetry_stale"] for b in bodies] == stale
    assert bodies[1]["telemetry"] == telemetry[1].to_dict()  # type: ignore[union-attr]
    assert bodies[0]["features"] == llama[0].features.to_dict()


def test_the_summary_must_merge_the_records_replicas() -> None:
    llama = [s for s in closed_steps() if s.features.model == "llama"]
    with pytest.raises(ValueError, match="must merge the record's 3 replicas"):
        encode_model_step("llama", 160.0, 0, [s.features for s in llama[:3]], merged(llama), [None] * 3, [[]] * 3)
    with pytest.raises(ValueError, match="must merge"):
        encode_model_step("llama", 160.0, 0, [llama[0].features], llama[0].summary, [None], [[]])


def test_the_record_is_smaller_than_one_json_record_per_replica() -> None:
    llama = [s for s in closed_steps() if s.features.model == "llama"]
    record = encode_model_step("llama", 160.0, 0, [s.features for s in llama], merged(llama), [None] * len(llama),
                               [[]] * len(llama))
    per_replica = sum(len(orjson.dumps({"summary": s.summary.to_dict(), "features": s.features, "telemetry": None,
                                        "telemetry_stale": []})) for s in llama)
    assert len(record) < per_replica / 2


def test_header_routes_and_other_records_have_none() -> None:
    header = read_step_header([("other", b"x"), *step_header(105.0, 2, 17, part=1)])
    assert header is not None and tuple(header) == (105.0, 2, 17, 1)
    assert read_step_header(None) is None and read_step_header([]) is None


def test_a_corrupt_record_is_refused() -> None:
    llama = [s for s in closed_steps() if s.features.model == "llama"]
    n = len(llama)
    record = encode_model_step("llama", 160.0, 0, [s.features for s in llama], merged(llama), [None] * n, [[]] * n)
    body = orjson.loads(record)
    decode_model_step(orjson.dumps(body))  # the same record again: fine

    def rebuilt(change: dict[str, Any]) -> bytes:
        return orjson.dumps({**body, **change})

    with pytest.raises(ValueError, match="not JSON"):
        decode_model_step(struct.pack(">I", 4) + b"head")  # an older, binary-framed format
    for version in (1, 2, None):
        with pytest.raises(ValueError, match="unsupported format"):
            decode_model_step(rebuilt({"v": version}))
    with pytest.raises(ValueError, match="unsupported format"):
        decode_model_step(b"[1, 2]")
    with pytest.raises(ValueError, match="version"):
        decode_model_step(rebuilt({"summary": {**body["summary"], "v": 99}}))
    with pytest.raises(ValueError, match=f"merges {n - 1} replicas, it holds {n}"):
        decode_model_step(rebuilt({"summary": {**body["summary"], "replicas": n - 1}}))
    with pytest.raises(ValueError, match="columns do not match"):
        decode_model_step(rebuilt({"features": {**body["features"], "count": body["features"]["count"][:-1]}}))
    latency = body["summary"]["latency"]
    assert len(latency[0]) >= 2

    def with_latency(change: Callable[[list[list[int]]], None]) -> bytes:
        sketch = [list(latency[0]), list(latency[1])]
        change(sketch)
        return rebuilt({"summary": {**body["summary"], "latency": sketch}})

    def unsorted(a: list[list[int]]) -> None:
        a[0][0], a[0][1] = a[0][1], a[0][0]

    def negative(a: list[list[int]]) -> None:
        a[0][0] = -1

    def zero_count(a: list[list[int]]) -> None:
        a[1][1] = 0

    for change in (unsorted, negative, zero_count):
        with pytest.raises(ValueError, match="sorted, in range, with positive counts"):
            decode_model_step(with_latency(change))


def test_model_step_inputs_takes_every_chunk_once_per_replica() -> None:
    steps = closed_steps()
    llama = [s for s in steps if s.features.model == "llama"]
    first = encode_model_step("llama", 160.0, 0, [s.features for s in llama[:4]], merged(llama[:4]), [None] * 4,
                              [[]] * 4)
    rest = llama[4:]
    second = encode_model_step("llama", 160.0, 1, [s.features for s in rest], merged(rest), [None] * len(rest),
                               [[]] * len(rest))
    a = StepAssembler()
    a.add_chunk("llama", 160.0, source=0, replicas=4, payload=first)
    a.add_chunk("llama", 160.0, source=1, replicas=len(rest), payload=second)
    a.add_chunk("llama", 160.0, source=1, replicas=len(rest), payload=second)  # a replay replaces its chunk
    assert a.pending == len(llama)
    [step] = a.complete(force_until=160.0)
    inputs, summaries, rejected = model_step_inputs(step)
    assert list(inputs) == [s.features.replica for s in llama]
    assert all(inputs[s.features.replica or ""].features == s.features for s in llama)
    assert [s.replicas for s in summaries] == [4, len(rest)] and rejected == []
    whole = merge_summaries("llama", 160.0, summaries, WindowSettings())
    assert whole.replicas == len(llama) and whole.count == merged(llama).count
    assert np.array_equal(whole.latency, merged(llama).latency)
    assert model_step_inputs(ModelStep("m", 5.0, {})) == ({}, [], [])


def test_a_record_of_another_format_is_told_apart_on_its_first_bytes_and_left_out() -> None:
    llama = [s for s in closed_steps() if s.features.model == "llama"]
    record = encode_model_step("llama", 160.0, 0, [s.features for s in llama], merged(llama), [None] * len(llama),
                               [[]] * len(llama))
    assert format_problem(record) is None
    older = struct.pack(">I", 9) + b'{"v": 2}'
    for other in (older, b'{"v":2,"model":"llama"}', b"", None):
        assert "not hand-off format 3" in (format_problem(other) or "")
    truncated = record[:-40]
    assert format_problem(truncated) is None  # its first bytes are right: refused when decoded, below
    step = ModelStep("llama", 160.0, {(0, 0): record, (1, 0): truncated, (2, 1): older})
    inputs, summaries, rejected = model_step_inputs(step)
    assert list(inputs) == [s.features.replica for s in llama] and len(summaries) == 1
    assert [chunk for chunk, _ in rejected] == [(1, 0), (2, 1)]
    assert all(reason.startswith("replica-steps record:") for _, reason in rejected)
