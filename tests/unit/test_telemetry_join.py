"""TelemetryJoin: per-GPU and per-source samples of one replica merged into one view per step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewwatch.pipeline.health import HealthConfig, HealthState, assess, observe
from skewwatch.pipeline.telemetry_join import FIELD_GROUPS, MEASUREMENT_FIELDS, TelemetryJoin
from skewwatch.schemas.telemetry_sample import TelemetrySample

GIB = float(1 << 30)
STALE = 15.0


def gpu(ts: float, index: int, source: str = "nvml", replica: str = "r1", **fields: Any) -> TelemetrySample:
    return TelemetrySample(ts=ts, replica=replica, source=source, node="n1", gpu_index=index,
                           gpu_uuid=f"GPU-{index}", **fields)


def engine(ts: float, source: str = "vllm", replica: str = "r1", **fields: Any) -> TelemetrySample:
    return TelemetrySample(ts=ts, replica=replica, source=source, **fields)


def mem(used_gib: float, total_gib: float = 80.0) -> dict[str, Any]:
    return {"memory_used_bytes": used_gib * GIB, "memory_total_bytes": total_gib * GIB}


def test_unknown_replica_gives_nothing() -> None:
    assert TelemetryJoin().view("nope", at=100.0, stale_after_s=STALE) == (None, None, [])


def test_one_sample_passes_through_with_its_age() -> None:
    join = TelemetryJoin()
    sample = gpu(98.0, 0, utilization_gpu=0.5, temperature_c=60.0, **mem(40))
    join.add(sample)
    merged, age, stale = join.view("r1", at=100.0, stale_after_s=STALE)
    assert merged is not None and age == 2.0 and stale == []
    assert merged.to_dict() == sample.to_dict()


def test_several_gpus_of_one_replica_give_the_worst_gpu() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, utilization_gpu=0.9, temperature_c=70.0, power_w=400.0, throttle_reasons=0x4,
                 xid_count_5m=0, ecc_uncorrected_total=2, **mem(70)))
    join.add(gpu(100.0, 1, utilization_gpu=0.4, temperature_c=85.0, power_w=300.0, throttle_reasons=0x20,
                 xid_count_5m=1, xid_last=79, ecc_uncorrected_total=3, **mem(20, 40)))
    merged, age, stale = join.view("r1", at=104.0, stale_after_s=STALE)
    assert merged is not None and age == 4.0 and stale == []
    # memory: the pair of the GPU with the highest ratio (70/80 < 20/40? no: 0.875 > 0.5)
    assert merged.memory_used_bytes == 70 * GIB and merged.memory_total_bytes == 80 * GIB
    assert merged.memory_ratio == pytest.approx(0.875)
    assert merged.utilization_gpu == 0.9 and merged.temperature_c == 85.0 and merged.power_w == 400.0
    assert merged.throttle_reasons == 0x24
    assert (merged.xid_last, merged.xid_count_5m) == (79, 1)
    assert merged.ecc_uncorrected_total == 5
    assert (merged.gpu_index, merged.gpu_uuid, merged.node) == (None, None, "n1")  # not one GPU


def test_latest_wins_would_lose_a_gpu_the_join_does_not() -> None:
    """The gap this module closes: the second GPU's sample used to overwrite the first one's."""
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, **mem(78)))  # the GPU under pressure reports first
    join.add(gpu(100.5, 1, **mem(10)))
    merged, _, _ = join.view("r1", at=105.0, stale_after_s=STALE)
    assert merged is not None and merged.memory_ratio == pytest.approx(78 / 80)


def test_engine_and_gpu_samples_merge_field_by_field() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, xid_count_5m=0, **mem(60)))
    join.add(engine(103.0, queue_length=5, running_requests=12, kv_cache_usage=0.7, kv_cache_hit_rate=0.4,
                    memory_reserved_bytes=50 * GIB, memory_allocated_bytes=20 * GIB))
    merged, age, stale = join.view("r1", at=105.0, stale_after_s=STALE)
    assert merged is not None and stale == []
    assert merged.memory_ratio == pytest.approx(0.75)  # from nvml, not wiped by the newer vllm sample
    assert merged.fragmentation == pytest.approx(0.6)  # from vllm
    assert (merged.queue_length, merged.running_requests, merged.kv_cache_hit_rate) == (5, 12, 0.4)
    assert merged.source == "vllm"  # an engine contributed: the engine answered
    assert merged.ts == 100.0 and age == 5.0  # the oldest field's timestamp
    assert merged.gpu_index == 0  # one GPU contributed


def test_staleness_is_per_signal() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, power_w=300.0, **mem(60)))
    join.add(engine(112.0, queue_length=3))
    at_115 = join.view("r1", at=115.0, stale_after_s=STALE)
    assert at_115[0] is not None and at_115[0].memory_ratio == 0.75 and at_115[1] == 15.0  # exactly 15 s: fresh
    merged, age, stale = join.view("r1", at=115.5, stale_after_s=STALE)
    assert merged is not None and merged.memory_ratio is None and merged.queue_length == 3
    assert merged.source == "vllm" and age == 3.5
    assert stale == ["memory_total_bytes", "memory_used_bytes", "power_w"]
    merged, age, stale = join.view("r1", at=130.0, stale_after_s=STALE)
    assert (merged, age) == (None, None) and "queue_length" in stale


def test_a_newer_sample_of_one_source_does_not_wipe_another_source_of_the_same_kind() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, source="dcgm", ecc_uncorrected_total=1, temperature_c=60.0, **mem(50)))
    join.add(gpu(101.0, 0, source="nvml", temperature_c=61.0))  # nvml without memory (call failed)
    merged, _, _ = join.view("r1", at=102.0, stale_after_s=STALE)
    assert merged is not None
    assert merged.memory_ratio == pytest.approx(50 / 80) and merged.ecc_uncorrected_total == 1  # from dcgm
    assert merged.temperature_c == 61.0  # a gauge: the newest reading


def test_gauges_take_the_newest_source_counters_a_fixed_one() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, source="nvml", ecc_uncorrected_total=4, **mem(40)))
    join.add(gpu(102.0, 0, source="dcgm", ecc_uncorrected_total=5, **mem(44)))
    merged, _, _ = join.view("r1", at=103.0, stale_after_s=STALE)
    assert merged is not None
    assert merged.memory_used_bytes == 44 * GIB  # dcgm is newer
    assert merged.ecc_uncorrected_total == 4  # nvml first in priority, even when older
    join.add(gpu(104.0, 0, source="nvml", ecc_uncorrected_total=4, **mem(41)))
    merged, _, _ = join.view("r1", at=105.0, stale_after_s=STALE)
    assert merged is not None and merged.memory_used_bytes == 41 * GIB and merged.ecc_uncorrected_total == 4


def test_view_is_as_of_event_time() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, **mem(40)))
    join.add(gpu(105.0, 0, xid_last=79, xid_count_5m=1, **mem(40)))  # arrives before step 100 is closed
    before, age, _ = join.view("r1", at=100.0, stale_after_s=STALE)
    assert before is not None and before.xid_last is None and age == 0.0
    after, _, _ = join.view("r1", at=105.0, stale_after_s=STALE)
    assert after is not None and after.xid_last == 79
    # nothing at or before `at`: nothing, and the signals reported later count as missing
    merged, age, stale = join.view("r1", at=99.0, stale_after_s=STALE)
    assert (merged, age) == (None, None) and "memory_used_bytes" in stale


def test_the_current_sample_is_authoritative_xid_leaves_the_window() -> None:
    """xid_last means 'within the last 5 minutes': when the producer stops sending it, it is gone."""
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, xid_last=79, xid_count_5m=1))
    join.add(gpu(400.0, 0, xid_count_5m=0))
    merged, _, stale = join.view("r1", at=401.0, stale_after_s=STALE)
    assert merged is not None and (merged.xid_last, merged.xid_count_5m) == (None, 0)
    assert stale == []  # "no XID in the window" is a reading, not a stale signal
    join.add(gpu(405.0, 0, power_w=100.0))  # XID events no longer watched (the call failed): unknown
    merged, _, stale = join.view("r1", at=406.0, stale_after_s=STALE)
    assert merged is not None and (merged.xid_last, merged.xid_count_5m) == (None, None)
    assert stale == ["xid_count_5m", "xid_last"]


def test_xid_last_is_the_most_recent_xid_across_gpus() -> None:
    join = TelemetryJoin()
    for t in (100.0, 105.0, 110.0):  # GPU 0 has carried two XID 79 for a while (drained already)
        join.add(gpu(t, 0, xid_last=79, xid_count_5m=2))
    join.add(gpu(100.0, 1, xid_count_5m=0))
    join.add(gpu(105.0, 1, xid_count_5m=0))
    join.add(gpu(107.0, 1, xid_last=48, xid_count_5m=1))  # the collector publishes an XID at once
    join.add(gpu(110.0, 1, xid_last=48, xid_count_5m=1))
    merged, _, _ = join.view("r1", at=110.0, stale_after_s=STALE)
    assert merged is not None and (merged.xid_last, merged.xid_count_5m) == (48, 3)
    join.add(gpu(112.0, 0, xid_last=31, xid_count_5m=3))  # then GPU 0 reports a new one
    merged, _, _ = join.view("r1", at=112.0, stale_after_s=STALE)
    assert merged is not None and (merged.xid_last, merged.xid_count_5m) == (31, 4)


def test_counters_are_held_across_a_gpu_dropping_out() -> None:
    join = TelemetryJoin()
    join.add(gpu(100.0, 0, ecc_uncorrected_total=2))
    join.add(gpu(100.0, 1, ecc_uncorrected_total=3))
    join.add(gpu(105.0, 0, ecc_uncorrected_total=2))
    join.add(gpu(105.0, 1))  # GPU 1's ECC read failed this round
    assert join.view("r1", 105.0, STALE)[0].ecc_uncorrected_total == 5  # type: ignore[union-attr]
    for t in (110.0, 115.0, 120.0, 125.0):  # GPU 1 stops publishing altogether
        join.add(gpu(t, 0, ecc_uncorrected_total=2))
    assert join.view("r1", 125.0, STALE)[0].ecc_uncorrected_total == 5  # type: ignore[union-attr]
    join.add(gpu(130.0, 0))  # and GPU 0's own read fails once: still the last reported values
    assert join.view("r1", 130.0, STALE)[0].ecc_uncorrected_total == 5  # type: ignore[union-attr]
    merged, _, stale = join.view("r1", 200.0, STALE)  # nobody fresh: no counter
    assert merged is None and "ecc_uncorrected_total" in stale


def test_gpu_dropping_out_and_returning_does_not_drain_through_the_health_rule() -> None:
    """The reason counters are held: a plain sum over fresh GPUs drops, then 'grows' back."""
    join, state, config = TelemetryJoin(), HealthState(), HealthConfig()
    timeline = {0: [0, 1, 2, 3, 4, 5, 6], 1: [0, 1, 5, 6]}  # GPU 1 silent for steps 2..4
    for step in range(7):
        t = 100.0 + 5 * step
        for index, steps in timeline.items():
            if step in steps:
                join.add(gpu(t, index, ecc_uncorrected_total=10 + index))
        merged, _, _ = join.view("r1", at=t, stale_after_s=5.0)  # short staleness: GPU 1 goes stale
        observe(state, {}, merged, now=t, config=config)
        assert assess(state, t, config).score == 1.0, (step, merged)
    join.add(gpu(135.0, 1, ecc_uncorrected_total=12))  # a real uncorrected error on GPU 1
    observe(state, {}, join.view("r1", at=135.0, stale_after_s=5.0)[0], now=135.0, config=config)
    assert assess(state, 135.0, config).action == "drain"


def test_duplicates_replace_history_is_bounded_and_old_keys_go() -> None:
    join = TelemetryJoin(history=3, retain_s=60.0, max_keys_per_replica=4)
    join.add(gpu(100.0, 0, power_w=1.0))
    join.add(gpu(100.0, 0, power_w=2.0))  # at-least-once delivery: the same timestamp again
    assert len(join) == 1 and join.view("r1", 100.0, STALE)[0].power_w == 2.0  # type: ignore[union-attr]
    for t in (101.0, 99.0, 103.0, 102.0):  # out of order
        join.add(gpu(t, 0, power_w=t))
    assert len(join) == 3 and join.view("r1", 102.5, STALE)[0].power_w == 102.0  # type: ignore[union-attr]
    assert join.view("r1", 100.5, STALE)[0] is None  # older than the history held
    for index in range(1, 6):
        join.add(gpu(103.0 + index, index, power_w=1.0))
    assert len(join._samples["r1"]) == 4  # the key heard from least recently went
    join.add(gpu(200.0, 9, power_w=1.0))  # every other key is now older than retain_s
    assert list(join._samples["r1"]) == [("nvml", "GPU-9")]
    join.add(engine(1.0, replica="r2", queue_length=1))
    assert join.replicas == ["r1", "r2"]
    join.forget("r1")
    assert join.replicas == ["r2"] and join.view("r1", 200.0, STALE) == (None, None, [])


def test_release_idle_drops_replicas_gone_quiet_by_their_newest_sample() -> None:
    join = TelemetryJoin(retain_s=600.0)
    # "left": a GPU sample long ago and an engine sample at 300: its newest sample counts, not its oldest
    join.add(gpu(100.0, 0, replica="left", power_w=1.0))
    join.add(engine(300.0, replica="left", queue_length=1))
    join.add(gpu(50.0, 0, replica="gone", power_w=1.0))
    join.add(engine(900.0, replica="live", queue_length=2))
    assert join.release_idle(now=900.0, horizon_s=700.0) == ["gone"]  # 50 < 200 <= 300
    assert join.replicas == ["left", "live"]
    assert join.release_idle(now=900.0, horizon_s=700.0) == []  # idempotent
    assert join.release_idle(now=901.0) == ["left"]  # default horizon: retain_s (300 < 301)
    assert join.replicas == ["live"] and len(join) == 1
    assert join.view("left", 300.0, STALE) == (None, None, [])  # released: nothing of it remains
    join.add(engine(902.0, replica="left", queue_length=3))  # a released replica that comes back starts afresh
    assert join.view("left", 902.0, STALE)[0].queue_length == 3  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        join.release_idle(now=1.0, horizon_s=-1.0)


def test_every_measurement_field_has_a_group() -> None:
    assert sorted(f for g in FIELD_GROUPS for f in g.fields) == sorted(MEASUREMENT_FIELDS)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        TelemetryJoin(history=0)


# ------------------------------------------------------------------ properties

_samples = st.lists(
    st.builds(
        lambda ts, source, index, used, queue, temp: TelemetrySample(
            ts=float(ts), replica="r1", source=source, gpu_index=index if source in ("nvml", "dcgm") else None,
            memory_used_bytes=None if used is None else used * GIB,
            memory_total_bytes=None if used is None else 80 * GIB,
            queue_length=queue if source not in ("nvml", "dcgm") else None, temperature_c=temp),
        st.integers(0, 60), st.sampled_from(["nvml", "dcgm", "vllm", "sglang"]), st.integers(0, 2),
        st.none() | st.integers(0, 80), st.none() | st.integers(0, 50), st.none() | st.integers(30, 90)),
    max_size=30)


@settings(max_examples=200, deadline=None)
@given(_samples, st.integers(0, 80))
def test_the_view_only_uses_fresh_samples_of_its_time(samples: list[TelemetrySample], at: int) -> None:
    join = TelemetryJoin(history=64)
    for s in samples:
        join.add(s)
    merged, age, stale = join.view("r1", at=float(at), stale_after_s=STALE)
    # the newest sample per (source, gpu) at or before `at`, when fresh
    current: dict[tuple[str, int | None], TelemetrySample] = {}
    for s in samples:
        key = (s.source, s.gpu_index)
        if s.ts <= at and (key not in current or s.ts >= current[key].ts):
            current[key] = s
    fresh = [s for s in current.values() if at - s.ts <= STALE]
    if merged is None:
        assert age is None
        assert not any(s.memory_ratio is not None or s.queue_length is not None or s.temperature_c is not None
                       for s in fresh)
        return
    assert age is not None and 0.0 <= age <= STALE and merged.ts == at - age
    assert set(stale).isdisjoint(k for k, v in merged.to_dict().items() if v is not None)
    ratios = [s.memory_ratio for s in fresh if s.memory_ratio is not None]
    if ratios:  # the worst GPU of some source; never more than any fresh GPU
        assert merged.memory_ratio is not None and merged.memory_ratio <= max(ratios)
    else:
        assert merged.memory_ratio is None
    temps = [s.temperature_c for s in fresh if s.temperature_c is not None]
    assert (merged.temperature_c is None) == (not temps)
    if temps:
        assert merged.temperature_c in temps


def _catch_up_misses(history: int, phase: float, window: Any) -> int:
    """Stage 1 catching up on a backlog (requests every second, telemetry every step_s at
    ``phase``): each 30 s slice of requests first joins the telemetry up to its newest event +
    telemetry_ahead_s, then closes the steps its watermark passed. Returns how many steps did not
    find their own sample (the newest at or before the step's end) in the join."""
    join = TelemetryJoin(history=history)
    interval, ahead = window.step_s, window.telemetry_ahead_s
    samples = [phase + interval * k for k in range(200)]
    joined = watermark = 0
    misses = 0
    slice_start = 0.0
    while slice_start < 700.0:
        slice_end = slice_start + ahead / 2  # RequestColumns.time_slices(ahead / 2): events in [start, end]
        while joined < len(samples) and samples[joined] <= slice_end + ahead:
            join.add(engine(samples[joined], queue_length=joined))
            joined += 1
        new_watermark = slice_end - window.allowed_lateness_s
        step_end = (watermark // interval + 1) * interval
        while step_end <= new_watermark:
            want = max(t for t in samples if t <= step_end)
            got = join.view("r1", step_end, STALE)[0]
            misses += got is None or got.ts != want
            step_end += interval
        watermark, slice_start = new_watermark, slice_end + 1.0
    return misses


@pytest.mark.parametrize("phase", [0.0, 0.1, 2.5, 4.9])
def test_history_for_keeps_every_step_s_sample_through_a_catch_up(phase: float) -> None:
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.telemetry_join import DEFAULT_HISTORY, history_for

    window = WindowSettings()
    assert history_for(window) == DEFAULT_HISTORY == 23 == TelemetryJoin().history
    assert history_for(WindowSettings(telemetry_ahead_s=120.0)) == 41  # 1.5 * 120 + 5 + 5 = 190 s
    assert _catch_up_misses(history_for(window, spare=0), phase, window) == 0
    assert _catch_up_misses(history_for(window, spare=0) - 3, phase, window) > 0  # and it is not loose by much


def test_identity_strings_are_shared_between_samples() -> None:
    """Each decoded message has its own copies of the replica/source/node names; the join keeps one."""
    join = TelemetryJoin()
    made = [TelemetrySample(ts=100.0 + 5 * k, replica="".join(["r", "1"]), source="".join(["nv", "ml"]),
                            node="".join(["n", "1"]), gpu_index=0, power_w=float(k)) for k in range(3)]
    assert made[0].replica is not made[1].replica  # distinct objects, as from a decoder
    for sample in made:
        join.add(sample)
    assert made[0].replica is made[1].replica is made[2].replica == "r1"
    assert made[0].source is made[2].source and made[0].node is made[2].node
    merged = join.view("r1", 111.0, STALE)[0]
    assert merged is not None and merged.power_w == 2.0 and merged.node == "n1"
