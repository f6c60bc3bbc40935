"""PartitionWindows: step/expiry, lateness, silence, snapshot/restore, agreement with the reference."""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import hypothesis
import numpy as np
import orjson
import pytest
from hypothesis import strategies as st

from skewwatch.config import WindowSettings
from skewwatch.pipeline.window import PartitionWindows, ReplicaStep, WindowSummary
from skewwatch.pipeline.window.summary import TPOT_RELATIVE_ACCURACY
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.requests.columns import RequestColumns
from tests.reference import reference_features

SETTINGS = WindowSettings()  # 60 s window, 5 s step, 5 s lateness, 90 s idle release, 1 %
QUANTILE_FIELDS = ("latency_p50", "latency_p95", "latency_p99", "ttft_p50", "ttft_p99")
# a coarser sketch: 5 % (TPOT_RELATIVE_ACCURACY)
TPOT_FIELDS = ("tpot_p50", "tpot_p90", "tpot_p99", "tpot_max", "step_tpot_max")


# -- helpers shared with test_model_merge.py ------------------------------------------------------

def event(ts: float, replica: str = "r1", model: str = "m", latency_ms: float = 100.0, **extra: Any) -> dict:
    base = {"request_id": f"{replica}-{ts}", "ts": ts, "model": model, "replica": replica,
            "latency_ms": latency_ms, "prompt_tokens": 100, "completion_tokens": 50,
            "batch_size": 4, "batch_capacity": 16}
    return {**base, **extra}


def random_events(rng: np.random.Generator, n: int, t0: float, t1: float,
                  replicas: Sequence[tuple[str, str]], batch_missing: float = 0.0) -> list[dict]:
    """Events with every optional field sometimes present, heavy-tailed latencies, errors, CUDA codes.

    ``batch_missing``: share of events whose batch is not plainly reported (contract v1.1): no batch
    fields, a size without a capacity, or a size marked derived (``batch_source`` 2).
    """
    out = []
    for i in range(n):
        model, replica = replicas[int(rng.integers(len(replicas)))]
        capacity = int(rng.integers(1, 65))
        ev = {
            "request_id": f"e{i}", "ts": float(rng.uniform(t0, t1)), "model": model, "replica": replica,
            "latency_ms": float(rng.lognormal(5.0, 1.0)) if rng.random() < 0.9 else float(rng.pareto(1.2) * 500),
            "prompt_tokens": int(rng.integers(0, 4000)), "completion_tokens": int(rng.integers(0, 1000)),
            "batch_size": int(rng.integers(1, capacity + 1)), "batch_capacity": capacity,
        }
        if rng.random() < 0.7:
            ev["ttft_ms"] = float(rng.lognormal(3.0, 0.8))
        if rng.random() < 0.5:
            ev["queue_length"] = int(rng.integers(0, 40))
        if rng.random() < 0.5:
            ev["kv_cache_hit_rate"] = float(rng.random())
        if rng.random() < 0.1:
            ev["status"] = "error"
            ev["cuda_error"] = str(rng.choice(["cudaErrorMemoryAllocation", "cudaErrorLaunchTimeout"])) \
                if rng.random() < 0.7 else 2
        if batch_missing and rng.random() < batch_missing:
            kind = rng.random()
            if kind < 0.6:
                del ev["batch_size"], ev["batch_capacity"]
            elif kind < 0.8:
                del ev["batch_capacity"]
            else:
                ev["batch_source"] = 2  # BATCH_DERIVED
        out.append(ev)
    return out


def feed(windows: PartitionWindows, events: Iterable[dict], chunk: int) -> list[ReplicaStep]:
    """Apply events in chunks of ``chunk`` (in the given order), closing steps after each."""
    events = list(events)
    steps: list[ReplicaStep] = []
    for i in range(0, len(events), chunk):
        windows.apply(RequestColumns.from_rows(events[i:i + chunk]))
        steps.extend(windows.close_steps())
    return steps


def assert_features_match(actual: FeatureVector, expected: FeatureVector, quantile_rel: float = 0.01) -> None:
    """Counts exact, means/variances to float rounding, quantiles within the sketch's accuracy."""
    a, e = actual.to_dict(), expected.to_dict()
    assert a.keys() == e.keys()
    for name in a:
        got, want = a[name], e[name]
        if want is None or got is None or isinstance(want, (str, dict)):
            assert got == want, name
        elif name in QUANTILE_FIELDS:
            assert got == pytest.approx(want, rel=quantile_rel * (1 + 1e-9), abs=1e-12), name
        elif name in TPOT_FIELDS:  # values <= 1e-3 ms/token are the sketch's zero bin
            assert got == pytest.approx(want, rel=TPOT_RELATIVE_ACCURACY * (1 + 1e-9), abs=1e-3), name
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), name


def without_tpot(fv: FeatureVector) -> FeatureVector:
    return dataclasses.replace(fv, tpot_p50=None, tpot_p90=None, tpot_p99=None, tpot_max=None, step_tpot_max=None)


def by_key(steps: Iterable[ReplicaStep]) -> dict[tuple[str, str | None], dict[float, FeatureVector]]:
    out: dict[tuple[str, str | None], dict[float, FeatureVector]] = {}
    for step in steps:
        fv = step.features
        assert fv.window_end not in out.setdefault((fv.model, fv.replica), {}), "a step emitted twice"
        out[(fv.model, fv.replica)][fv.window_end] = fv
    return out


# -- step and expiry ------------------------------------------------------------------------------

def test_an_event_counts_in_exactly_twelve_consecutive_steps() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(1002.5), event(1031.0, replica="r2")]))
    windows.advance_watermark(1200.0)
    steps = by_key(windows.close_steps())[("m", "r1")]
    ends = sorted(steps)
    assert ends[0] == 1005.0 and all(b - a == 5.0 for a, b in zip(ends, ends[1:], strict=False))
    counted = [end for end in ends if steps[end].count == 1]
    assert counted == [1005.0 + 5.0 * i for i in range(12)]  # [E-60, E) holds ts 1002.5 for E in 1005..1060
    assert all(steps[end].count == 0 for end in ends if end > 1060.0)
    assert [end for end in ends if steps[end].step_count == 1] == [1005.0]
    fv = steps[1060.0]
    assert (fv.window_start, fv.rps, fv.tokens_per_s) == (1000.0, 1 / 60, 50 / 60)
    assert steps[1065.0].latency_p50 is None and steps[1065.0].batch_size_std is None


def test_steps_close_only_up_to_the_watermark() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0), event(112.0)]))  # watermark 107
    assert [s.features.window_end for s in windows.close_steps()] == [105.0]
    assert windows.close_steps() == []  # idempotent: nothing new to close
    windows.apply(RequestColumns.from_rows([event(115.0)]))  # watermark 110
    assert [s.features.window_end for s in windows.close_steps()] == [110.0]
    assert windows.last_closed_end == 110.0


def test_watermark_never_moves_back() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(200.0)]))
    assert windows.watermark == 195.0
    windows.advance_watermark(150.0)
    windows.apply(RequestColumns.from_rows([event(199.0)]))
    assert windows.watermark == 195.0
    windows.advance_watermark(300.0)
    assert windows.watermark == 300.0


def test_a_future_event_advances_the_watermark_for_everyone() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0, replica="a")]))
    windows.apply(RequestColumns.from_rows([event(400.0, replica="b")]))  # a clock far ahead
    steps = windows.close_steps()
    assert max(s.features.window_end for s in steps) == 395.0
    late = windows.apply(RequestColumns.from_rows([event(380.0, replica="a")]))
    assert late.late == 1


# -- lateness -------------------------------------------------------------------------------------

def test_late_events_are_counted_not_applied() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(101.0), event(102.0), event(112.0)]))
    assert [s.features.count for s in windows.close_steps()] == [2]  # window ending 105 closed
    result = windows.apply(RequestColumns.from_rows([
        event(104.9, latency_ms=1e6),  # its bucket [100, 105) is closed: late
        event(105.0),  # first instant of the open bucket: on time
        event(99.0),
    ]))
    assert result == (1, 2)
    assert windows.late_total == 2
    windows.advance_watermark(115.0)
    steps = windows.close_steps()
    assert [(s.features.window_end, s.features.count, s.features.step_count) for s in steps] == \
        [(110.0, 3, 1), (115.0, 4, 1)]
    assert steps[-1].features.latency_p99 == pytest.approx(100.0, rel=0.01)  # the 1e6 ms never got in
    all_late = windows.apply(RequestColumns.from_rows([event(50.0)]))
    assert all_late == (0, 1) and windows.late_total == 3


def test_before_the_first_close_nothing_is_late() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(200.0)]))
    assert windows.apply(RequestColumns.from_rows([event(150.0)])) == (1, 0)  # out of order, not late
    steps = windows.close_steps()
    assert steps[0].features.window_end == 155.0  # steps start at the oldest open bucket
    # a first close must not declare the bucket before the first event closed too early
    fresh = PartitionWindows(SETTINGS)
    fresh.apply(RequestColumns.from_rows([event(510.0)]))  # watermark 505
    assert fresh.close_steps() == [] and fresh.last_closed_end is None
    assert fresh.apply(RequestColumns.from_rows([event(507.0)])) == (1, 0)


# -- silence and release --------------------------------------------------------------------------

def test_a_silent_replica_reports_count_zero_then_is_released() -> None:
    windows = PartitionWindows(SETTINGS)
    # r1 reports every second for 300 s; r2 only until 150.5
    events = [event(float(t), replica="r1") for t in range(100, 400)]
    events += [event(t + 0.5, replica="r2") for t in range(100, 151)]
    steps = by_key(feed(windows, sorted(events, key=lambda e: e["ts"]), chunk=7))
    r2 = steps[("m", "r2")]
    assert r2[155.0].count == 51 and r2[155.0].step_count == 1
    assert r2[160.0].step_count == 0 and r2[160.0].count > 0  # silence shows in the step first
    assert r2[215.0].count == 0 and r2[215.0].rps == 0.0 and r2[215.0].latency_p99 is None
    # last event 150.5: released after the first step E with no event in (E - 90, E], i.e. E = 245
    assert max(r2) == 245.0
    assert ("m", "r2") not in windows.keys and ("m", "r1") in windows.keys
    # r1 had a step at every end throughout
    r1_ends = sorted(steps[("m", "r1")])
    assert r1_ends == [105.0 + 5.0 * i for i in range(len(r1_ends))] and r1_ends[-1] >= 390.0


def test_released_key_comes_back_when_it_reports_again() -> None:
    windows = PartitionWindows(SETTINGS)
    feed(windows, [event(100.0, replica="r2"), event(100.0), *[event(float(t)) for t in range(101, 300, 5)]], 1)
    assert ("m", "r2") not in windows.keys
    windows.apply(RequestColumns.from_rows([event(301.0, replica="r2"), event(320.0)]))
    steps = by_key(windows.close_steps())
    assert steps[("m", "r2")][305.0].count == 1


def test_an_idle_partition_with_no_keys_just_follows_the_watermark() -> None:
    windows = PartitionWindows(SETTINGS)
    feed(windows, [event(100.0), event(400.0, replica="r9")], 1)
    windows.advance_watermark(10_000.0)
    windows.close_steps()
    assert not windows.keys and windows.last_closed_end == 10_000.0
    assert windows.apply(RequestColumns.from_rows([event(9_990.0)])).late == 1


# -- feature definitions --------------------------------------------------------------------------

def test_optional_fields_missing_is_not_zero() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([
        event(101.0, ttft_ms=20.0, queue_length=4, kv_cache_hit_rate=0.5),
        event(102.0),  # reports none of them
        event(103.0, ttft_ms=40.0, queue_length=8),
        event(104.0, replica="quiet"),
    ]))
    windows.advance_watermark(105.0)
    fv = by_key(windows.close_steps())
    r1, quiet = fv[("m", "r1")][105.0], fv[("m", "quiet")][105.0]
    assert r1.queue_length_mean == 6.0 and r1.kv_cache_hit_rate_mean == 0.5
    assert r1.ttft_p50 == pytest.approx(20.0, rel=0.01) and r1.ttft_p99 == pytest.approx(20.0, rel=0.01)
    assert quiet.ttft_p50 is None and quiet.queue_length_mean is None and quiet.kv_cache_hit_rate_mean is None
    assert quiet.latency_p50 == pytest.approx(100.0, rel=0.01)


def test_errors_and_cuda_codes() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([
        event(101.0, status="error", cuda_error="cudaErrorMemoryAllocation"),
        event(106.0, status="error", cuda_error="cudaErrorMemoryAllocation"),
        event(107.0, status="error", cuda_error=2),
        event(108.0, status="error"),
        event(109.0),
    ]))
    windows.advance_watermark(110.0)
    fv = by_key(windows.close_steps())[("m", "r1")]
    assert fv[105.0].step_cuda_errors == {"cudaErrorMemoryAllocation": 1}
    assert fv[110.0].step_cuda_errors == {"cudaErrorMemoryAllocation": 1, "2": 1}  # newest step only
    assert fv[110.0].error_rate == 4 / 5 and fv[110.0].step_count == 4


def test_batch_statistics() -> None:
    windows = PartitionWindows(SETTINGS)
    sizes, capacities = [1, 2, 3, 10], [4, 4, 8, 16]
    windows.apply(RequestColumns.from_rows([event(101.0 + i, batch_size=s, batch_capacity=c)
                                            for i, (s, c) in enumerate(zip(sizes, capacities, strict=True))]))
    windows.advance_watermark(110.0)
    fv = windows.close_steps()[-1].features
    assert fv.batch_size_mean == 4.0
    assert fv.batch_size_std == pytest.approx(float(np.std(sizes)))
    assert fv.batch_fill_mean == pytest.approx(np.mean(np.array(sizes) / np.array(capacities)))


def test_unknown_batches_are_not_zero_and_derived_ones_are_counted() -> None:
    windows = PartitionWindows(SETTINGS)
    no_batch: dict[str, Any] = {"batch_size": None, "batch_capacity": None}
    windows.apply(RequestColumns.from_rows(
        [event(101.0 + i, replica="otlp", **no_batch) for i in range(3)]
        + [event(101.0, replica="mixed", batch_size=2, batch_capacity=8),
           event(102.0, replica="mixed", **no_batch),
           event(103.0, replica="mixed", batch_size=6, batch_capacity=None),
           event(104.0, replica="mixed", batch_size=4, batch_capacity=8, batch_source=2)]))
    windows.advance_watermark(110.0)
    steps = by_key(windows.close_steps())
    silent = steps[("m", "otlp")][105.0]
    assert silent.count == 3 and silent.batch_count == 0
    assert (silent.batch_size_mean, silent.batch_size_std, silent.batch_fill_mean) == (None, None, None)
    assert silent.latency_mean == 100.0  # the rest of the vector is there
    mixed = steps[("m", "mixed")][105.0]
    assert (mixed.count, mixed.batch_count, mixed.batch_derived_count) == (4, 3, 1)
    assert mixed.batch_size_mean == 4.0 and mixed.batch_size_std == pytest.approx(np.std([2, 6, 4]))
    assert mixed.batch_fill_mean == pytest.approx((2 / 8 + 4 / 8) / 2)  # the size without capacity: no fill
    assert steps[("m", "otlp")][110.0].batch_fill_mean is None  # still none a step later


def test_unknown_batches_match_the_reference_and_survive_json_and_snapshots() -> None:
    rng = np.random.default_rng(15)
    events = random_events(rng, 2000, 1000.0, 1200.0, REPLICAS, batch_missing=0.5)
    events += [event(1000.0 + i, replica="otlp-only", batch_size=None, batch_capacity=None) for i in range(50)]
    arrival = disordered(events, rng, max_delay=4.0)
    windows = PartitionWindows(SETTINGS)
    steps = feed(windows, arrival[:1000], chunk=37)
    restored = PartitionWindows.restore(windows.snapshot(), SETTINGS)
    after = feed(windows, arrival[1000:], chunk=37)
    assert [s.features for s in feed(restored, arrival[1000:], chunk=37)] == [s.features for s in after]
    derived = 0
    for step in steps + after:
        fv = step.features
        assert_features_match(fv, reference_features(events, fv.model, fv.replica, fv.window_end, SETTINGS))
        assert WindowSummary.from_dict(orjson.loads(orjson.dumps(step.summary.to_dict()))).features() == fv
        derived += fv.batch_derived_count
    assert derived > 0
    otlp_only = [s.features for s in steps + after if s.features.replica == "otlp-only" and s.features.count]
    assert otlp_only and all(fv.batch_size_mean is None and fv.batch_count == 0 for fv in otlp_only)


# -- agreement with the reference, order independence ---------------------------------------------

REPLICAS = [("llama", "r1"), ("llama", "r2"), ("llama", "r3"), ("mistral", "m1")]


def disordered(events: list[dict], rng: np.random.Generator, max_delay: float) -> list[dict]:
    """Arrival order = event time plus a random delay below the allowed lateness."""
    arrival = np.array([e["ts"] for e in events]) + rng.uniform(0.0, max_delay, len(events))
    return [events[i] for i in np.argsort(arrival, kind="stable")]


def test_every_step_matches_the_reference() -> None:
    rng = np.random.default_rng(11)
    events = random_events(rng, 3000, 1000.0, 1300.0, REPLICAS)
    windows = PartitionWindows(SETTINGS)
    steps = feed(windows, disordered(events, rng, max_delay=4.5), chunk=50)
    assert windows.late_total == 0
    assert len(steps) > 4 * 50
    for step in steps:
        fv = step.features
        assert_features_match(fv, reference_features(events, fv.model, fv.replica, fv.window_end, SETTINGS))


def test_one_batch_or_many_chunks_give_the_same_features() -> None:
    rng = np.random.default_rng(12)
    events = random_events(rng, 2000, 1000.0, 1100.0, REPLICAS)
    whole = PartitionWindows(SETTINGS)
    whole.apply(RequestColumns.from_rows(events))
    whole.advance_watermark(1200.0)
    in_one = whole.close_steps()
    chunked = PartitionWindows(SETTINGS)
    shuffled = [events[i] for i in rng.permutation(len(events))]
    for i, size in enumerate([1, 3, 500, 17, 1479]):
        start = sum([1, 3, 500, 17, 1479][:i])
        chunked.apply(RequestColumns.from_rows(shuffled[start:start + size]))
    chunked.advance_watermark(1200.0)
    in_chunks = chunked.close_steps()
    assert len(in_one) == len(in_chunks)
    one, chunks = by_key(in_one), by_key(in_chunks)
    assert one.keys() == chunks.keys()
    for key, steps in one.items():
        assert steps.keys() == chunks[key].keys()
        for end, fv in steps.items():
            assert_features_match(fv, chunks[key][end], quantile_rel=0.0)  # same sketch counts: exact


# -- snapshot / restore ---------------------------------------------------------------------------

def snapshot_parts(data: bytes) -> tuple[Any, bytes]:
    """A snapshot's JSON header and its columns' bytes."""
    assert data[:4] == b"SWW3"
    raw = zlib.decompress(data[4:])
    (length,) = struct.unpack_from("<I", raw)
    return orjson.loads(raw[4:4 + length]), raw[4 + length:]


def as_snapshot(header: Any, body: bytes) -> bytes:
    text = orjson.dumps(header)
    return b"SWW3" + zlib.compress(struct.pack("<I", len(text)) + text + body, 1)


def test_snapshot_restore_continues_identically() -> None:
    rng = np.random.default_rng(13)
    events = disordered(random_events(rng, 2500, 1000.0, 1250.0, REPLICAS), rng, max_delay=4.0)
    events += [event(900.0)]  # one late event, so late_total is non-zero in the snapshot
    first, rest = events[:1200], events[1200:]
    original = PartitionWindows(SETTINGS)
    feed(original, first, chunk=40)
    data = original.snapshot()
    assert isinstance(data, bytes) and snapshot_parts(data)[0]["format"] == "skewwatch.partition-windows"
    restored = PartitionWindows.restore(data, SETTINGS)
    assert restored.snapshot() == data
    assert (restored.watermark, restored.last_closed_end, restored.late_total) == \
        (original.watermark, original.last_closed_end, original.late_total)
    after_original = feed(original, rest, chunk=40)
    after_restored = feed(restored, rest, chunk=40)
    assert len(after_original) == len(after_restored) > 0
    for a, b in zip(after_original, after_restored, strict=True):
        assert a.features == b.features
        assert a.summary.to_dict() == b.summary.to_dict()
    assert original.late_total == restored.late_total == 1


def test_restore_refuses_other_settings_and_garbage() -> None:
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([event(100.0), event(101.0, replica="r2")]))
    data = windows.snapshot()
    with pytest.raises(ValueError, match="step_s"):
        PartitionWindows.restore(data, WindowSettings(step_s=10.0))
    with pytest.raises(ValueError, match="relative_accuracy"):
        PartitionWindows.restore(data, WindowSettings(sketch_relative_accuracy=0.02))
    header, body = snapshot_parts(data)
    bad_late = as_snapshot({**header, "late_total": "x"}, body)
    truncated = as_snapshot(header, body[:-8])
    slots_at = len(body) - 4 * header["entries"]  # the slots (uint16) come before the counts (uint16)
    bad_slot = as_snapshot(header, body[:slots_at] + struct.pack("<H", 60_000) + body[slots_at + 2:])
    json_form = b"SWW1" + zlib.compress(orjson.dumps({**header, "v": 2}), 1)  # an earlier layout: refused
    for bad in (b"", b"not json", data[:4] + b"garbage", data[:-10], as_snapshot([], b""),
                as_snapshot({"format": "x"}, body), bad_late, truncated, bad_slot, json_form,
                as_snapshot({**header, "v": 3}, body)):
        with pytest.raises(ValueError):
            PartitionWindows.restore(bad, SETTINGS)
    assert PartitionWindows.restore(as_snapshot(header, body), SETTINGS).snapshot() == data
    empty = PartitionWindows(SETTINGS)
    assert PartitionWindows.restore(empty.snapshot(), SETTINGS).watermark is None


def test_window_summary_json_round_trip() -> None:
    rng = np.random.default_rng(14)
    windows = PartitionWindows(SETTINGS)
    steps = feed(windows, sorted(random_events(rng, 500, 0.0, 100.0, REPLICAS), key=lambda e: e["ts"]), 25)
    for step in steps[-8:]:
        wire = orjson.loads(orjson.dumps(step.summary.to_dict()))
        back = WindowSummary.from_dict(wire)
        assert back.to_dict() == step.summary.to_dict()
        assert back.features() == step.features
    with pytest.raises(ValueError):
        WindowSummary.from_dict({**steps[-1].summary.to_dict(), "latency": [[5, 3], [1, 1]]})  # unsorted
    with pytest.raises(ValueError):
        WindowSummary.from_dict({"v": 1})


# -- settings and memory --------------------------------------------------------------------------

def test_window_must_be_whole_steps() -> None:
    with pytest.raises(ValueError):
        PartitionWindows(WindowSettings(length_s=62.0, step_s=5.0))
    windows = PartitionWindows(WindowSettings(length_s=30.0, step_s=10.0))
    windows.apply(RequestColumns.from_rows([event(101.0)]))
    windows.advance_watermark(200.0)
    counts = [(s.features.window_end, s.features.count) for s in windows.close_steps()]
    assert [end for end, c in counts if c] == [110.0, 120.0, 130.0]


def _window_bytes_per_replica(events: list[dict], replicas: int) -> float:
    """tracemalloc bytes per replica held by one partition's windows after ``events``, applied as
    small polls of 2 events per replica (the worst case for open-bucket parts) with steps closed
    after each."""
    poll = 2 * replicas
    batches = [RequestColumns.from_rows(events[i:i + poll]) for i in range(0, len(events), poll)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        windows = PartitionWindows(SETTINGS)
        for cols in batches:
            windows.apply(cols)
            windows.close_steps()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(windows.keys) == replicas and windows.last_closed_end == 70.0
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")) / replicas


def test_memory_per_active_replica_is_small() -> None:
    """Issue target: <= 16 KiB per active replica at a few requests per second.

    200 replicas at 4 req/s, LLM-shaped: heavy-tailed output lengths, latency = TTFT + output
    tokens x a time per output token that varies within a replica by a log-normal factor (so the
    latency, TTFT and TPOT sketches all hold realistic spreads), measured with tracemalloc (which
    also sees numpy's small-buffer cache and the partition's fixed arrays: shared overheads that
    200 replicas amortise; at 50 the same traffic measures ~16.0 KiB, at 10,000 `bench/scale.py`
    measures ~7 KiB).
    """
    rng = np.random.default_rng(15)
    replicas = [("m", f"r{i}") for i in range(200)]
    events = sorted(random_events(rng, 200 * 4 * 80, 0.0, 80.0, replicas), key=lambda e: e["ts"])
    for ev in events:  # latency from the output length, as an engine's is
        tokens = int(min(rng.lognormal(5.0, 1.0), 4000))
        ttft = float(rng.lognormal(4.0, 0.8))
        ev.update(completion_tokens=tokens, ttft_ms=ttft,
                  latency_ms=ttft + tokens * 30.0 * float(rng.lognormal(0.0, 0.3)))
    per_replica = _window_bytes_per_replica(events, len(replicas))
    assert per_replica <= 16 * 1024, f"{per_replica:.0f} bytes per replica"


def test_memory_per_active_replica_worst_case() -> None:
    """Adversarial bound: latencies drawn independently of output lengths, so the TPOT
    (latency / tokens) of the events spreads over ~7 decades and nearly every event gets an entry of
    its own in the TPOT sketch (as well as the latency one). No engine's traffic looks like this; it
    bounds what the sketches can cost, not the 16 KiB target, which the test above checks."""
    rng = np.random.default_rng(15)
    replicas = [("m", f"r{i}") for i in range(50)]
    events = sorted(random_events(rng, 50 * 4 * 80, 0.0, 80.0, replicas), key=lambda e: e["ts"])
    per_replica = _window_bytes_per_replica(events, len(replicas))
    assert per_replica <= 20 * 1024, f"{per_replica:.0f} bytes per replica"


def test_close_steps_before_any_event_is_empty() -> None:
    windows = PartitionWindows(SETTINGS)
    assert windows.close_steps() == []
    windows.advance_watermark(1000.0)
    assert windows.close_steps() == [] and windows.last_closed_end is None
    assert windows.apply(RequestColumns.empty()) == (0, 0)


# -- property: any arrival order within the lateness, any chunking ---------------------------------

@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 120), chunk=st.integers(1, 50),
                  span=st.sampled_from([3.0, 30.0, 200.0]))
def test_property_steps_match_reference(seed: int, n: int, chunk: int, span: float) -> None:
    rng = np.random.default_rng(seed)
    missing = float(rng.choice([0.0, 0.3, 1.0]))  # v1.1: some or all events without a (reported) batch
    events = random_events(rng, n, 500.0, 500.0 + span, REPLICAS[:3], batch_missing=missing)
    if rng.random() < 0.5:  # timestamps exactly on step boundaries
        for e in events[::3]:
            e["ts"] = 5.0 * round(e["ts"] / 5.0)
    windows = PartitionWindows(SETTINGS)
    steps = feed(windows, disordered(events, rng, max_delay=SETTINGS.allowed_lateness_s * 0.99), chunk)
    windows.advance_watermark(max(e["ts"] for e in events) + 200.0)
    steps += windows.close_steps()
    assert windows.late_total == 0 and not windows.keys  # all released at the end
    seen = by_key(steps)
    for (model, replica), by_end in seen.items():
        assert all(end % 5.0 == 0.0 for end in by_end)  # (by_key already refused repeats)
        for end, fv in by_end.items():
            assert_features_match(fv, reference_features(events, model, replica, end, SETTINGS))
    for e in events:  # every event was reported by exactly 12 steps of its key
        key_steps = seen[(e["model"], e["replica"])]
        holding = [end for end, fv in key_steps.items() if end - 60.0 <= e["ts"] < end]
        assert len(holding) == 12


def test_tpot_and_recent_prompt_features() -> None:
    """TPOT per event = (latency - ttft) / (completion tokens - 1): the tokens after the first, which
    comes at the TTFT (latency / tokens without ttft); events without completion tokens, and those
    with one token and a ttft, have none. recent_* cover the newest 20 s of the window only."""
    windows = PartitionWindows(SETTINGS)
    windows.apply(RequestColumns.from_rows([
        event(1001.0, latency_ms=1090.0, ttft_ms=100.0, completion_tokens=100, prompt_tokens=10),  # 10 ms/token
        event(1002.0, latency_ms=500.0, completion_tokens=10, prompt_tokens=10),  # no ttft: 50 ms/token
        event(1003.0, latency_ms=50.0, completion_tokens=0, prompt_tokens=10),  # no TPOT at all
        # one token, at its TTFT: no decode step (counting every token, it read 2,900 ms/token)
        event(1004.0, latency_ms=3000.0, ttft_ms=100.0, completion_tokens=1, prompt_tokens=10),
        event(1050.0, latency_ms=5000.0, ttft_ms=200.0, completion_tokens=17, prompt_tokens=3000),  # 300
        event(1051.0, latency_ms=290.0, ttft_ms=100.0, completion_tokens=20, prompt_tokens=1000),  # 10
    ]))
    windows.advance_watermark(1060.0)
    fv = by_key(windows.close_steps())[("m", "r1")][1055.0]
    assert fv.count == 6
    assert fv.tpot_p50 == pytest.approx(10.0, rel=0.05) and fv.tpot_p99 == pytest.approx(50.0, rel=0.05)
    assert fv.tpot_max == pytest.approx(300.0, rel=0.05)
    assert (fv.recent_count, fv.recent_prompt_tokens_mean, fv.recent_prompt_tokens_var) == (2, 2000.0, 1e6)
    assert fv.prompt_tokens_mean == pytest.approx(4040 / 6)  # the whole window still holds the four short prompts
    empty = by_key(windows.close_steps())  # nothing new closed
    assert empty == {}
    windows.advance_watermark(1120.0)
    later = by_key(windows.close_steps())[("m", "r1")]
    assert later[1075.0].recent_count == 0 and later[1075.0].recent_prompt_tokens_mean is None
    # the 1050/1051 events are still in the window (10 and 300 ms/token; rank floor(q * (n - 1)))
    assert later[1075.0].count == 2 and later[1075.0].tpot_p50 == pytest.approx(10.0, rel=0.05)
    assert later[1115.0].count == 0 and later[1115.0].tpot_p50 is None
