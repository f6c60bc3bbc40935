"""batch_collapse: std(batch_size) > 2 and mean fill < 30 % -> CRITICAL, adjust_batch_policy with
the seed §4.2 controller's max_batch_size."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from skewwatch.pipeline.batch_controller import BatchControllerConfig, recommend_batch_size
from skewwatch.pipeline.detectors.alerts import Severity
from skewwatch.pipeline.detectors.batch_collapse import BatchCollapseConfig, BatchCollapseDetector
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


def fv(t: float, std: float | None, fill: float | None, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"count": 100, "batch_size_mean": 6.0, "latency_p95": 100.0, "queue_length_mean": 12.0}
    values.update(kw)
    return FeatureVector(
        model="m", replica="r1", window_start=t - 60, window_end=t, batch_size_std=std, batch_fill_mean=fill, **values
    )


def test_fires_on_the_seed_rule_immediately() -> None:
    out = BatchCollapseDetector().update(fv(60.0, 2.01, 0.29), None, 60.0)
    (alert,) = out.alerts
    assert (alert.severity, alert.state, alert.detector) == (Severity.CRITICAL, "open", "batch_collapse")
    assert alert.evidence["batch_size_std"] == 2.01 and alert.evidence["batch_fill_mean"] == 0.29
    (action,) = out.actions
    assert action.action == "adjust_batch_policy" and action.params == {"max_batch_size": 12}


@pytest.mark.parametrize(("std", "fill"), [(2.0, 0.2), (1.0, 0.1), (3.0, 0.30), (3.0, 0.5), (None, 0.1), (3.0, None)])
def test_does_not_fire_at_or_just_outside_the_thresholds(std: float | None, fill: float | None) -> None:
    det = BatchCollapseDetector()
    assert not any(det.update(fv(60.0 + 5 * i, std, fill), None, 60.0 + 5 * i).alerts for i in range(5))


def test_empty_window_is_not_judged() -> None:
    assert BatchCollapseDetector().update(fv(60.0, 5.0, 0.1, count=0), None, 60.0).alerts == []


def test_resolves_after_two_clean_steps_and_params_follow_the_controller() -> None:
    det = BatchCollapseDetector()
    det.update(fv(60.0, 3.0, 0.1), None, 60.0)
    out = det.update(fv(65.0, 3.0, 0.1, queue_length_mean=20.0), None, 65.0)
    assert out.actions[0].params == {"max_batch_size": 20}
    out = det.update(fv(70.0, 1.0, 0.5), None, 70.0)  # clearing: last recommendation stays in force
    assert out.alerts == [] and out.actions[0].params == {"max_batch_size": 20}
    out = det.update(fv(75.0, 1.0, 0.5), None, 75.0)
    assert [a.state for a in out.alerts] == ["resolved"] and out.actions == []


def test_gpu_utilisation_comes_from_telemetry() -> None:
    tel = TelemetrySample(ts=60.0, replica="r1", source="nvml", utilization_gpu=0.3)
    out = BatchCollapseDetector().update(fv(60.0, 3.0, 0.1, queue_length_mean=20.0, latency_p95=150.0), tel, 60.0)
    assert out.actions[0].params == {"max_batch_size": 14}  # int(20 * 0.7)
    assert out.alerts[0].evidence["gpu_utilization"] == 0.3


def test_queue_length_falls_back_to_telemetry_then_batch_size() -> None:
    tel = TelemetrySample(ts=60.0, replica="r1", source="vllm", queue_length=7)
    out = BatchCollapseDetector().update(fv(60.0, 3.0, 0.1, queue_length_mean=None), tel, 60.0)
    assert out.actions[0].params == {"max_batch_size": 7}
    assert out.alerts[0].evidence["queue_source"] == "telemetry"
    out = BatchCollapseDetector().update(fv(60.0, 3.0, 0.1, queue_length_mean=None), None, 60.0)
    assert out.actions[0].params == {"max_batch_size": 6}
    assert out.alerts[0].evidence["queue_source"] == "batch_size_mean"


@pytest.mark.parametrize(
    ("queue", "util", "p95", "expected"),
    [
        (10, 0.3, 150.0, 7),  # shrink: int(10 * 0.7)
        (10, 0.3, 120.0, 10),  # P95 not > 120: base
        (10, 0.4, 150.0, 10),  # util not < 0.4: base
        (10, 0.9, 60.0, 13),  # grow: int(10 * 1.3)
        (10, 0.85, 60.0, 10),  # util not > 0.85
        (10, 0.9, 80.0, 10),  # P95 not < 80
        (50, 0.9, 60.0, 41),  # base clamped to 32, int(32 * 1.3)
        (0, 0.5, 100.0, 1),  # base clamped to 1
        (1, 0.3, 150.0, 1),  # the seed's int(0.7) = 0, guarded to 1
        (10.9, None, None, 10),  # unknown util / P95: base (truncated like the seed)
    ],
)
def test_seed_controller(queue: float, util: float | None, p95: float | None, expected: int) -> None:
    assert recommend_batch_size(queue, util, p95) == expected


def test_controller_growth_is_capped_at_64() -> None:
    config = BatchControllerConfig(queue_cap=60.0)
    assert recommend_batch_size(60, 0.9, 50.0, config) == 64
    assert BatchCollapseConfig.from_overrides({"queue_cap": "60"}).controller == config


def test_thresholds_are_configurable() -> None:
    det = BatchCollapseDetector(BatchCollapseConfig.from_overrides({"std_threshold": "1", "fill_threshold": "0.5"}))
    assert len(det.update(fv(60.0, 1.5, 0.4), None, 60.0).alerts) == 1


def test_silent_when_no_event_had_a_batch_size_contract_v1_1() -> None:
    """OTLP events without batch fields and no telemetry to derive them: the window's batch
    statistics are None, so the detector makes no claim rather than guess (no alert, no action)."""
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.schemas.requests.columns import RequestColumns

    windows = PartitionWindows(WindowSettings())
    rows = [{"request_id": f"q{i}", "ts": 100.0 + i * 0.5, "model": "m", "replica": "r1", "latency_ms": 50.0 + i,
             "prompt_tokens": 10, "completion_tokens": 5} for i in range(200)]  # no batch_size/batch_capacity
    windows.apply(RequestColumns.from_rows(rows))
    windows.advance_watermark(300.0)
    det = BatchCollapseDetector()
    vectors = [step.features for step in windows.close_steps()]
    judged = [v for v in vectors if v.count > 0]
    assert len(judged) > 10 and all(v.batch_size_std is None and v.batch_fill_mean is None for v in judged)
    for v in vectors:
        out = det.update(v, None, v.window_end)
        assert out.alerts == [] and out.actions == []


# --- option stuck_rule: a scheduler stuck at batch 1-2 while the queue grows (off by default)

STUCK = BatchCollapseConfig(stuck_rule=True, seed_rule=False)


def tel(t: float, queue: int, running: int, kv_usage: float = 0.1, frag: float = 0.1,
        capacity: int | None = 32) -> TelemetrySample:
    return TelemetrySample(ts=t, replica="r1", source="vllm", queue_length=queue, running_requests=running,
                           kv_cache_usage=kv_usage, batch_capacity=capacity, memory_reserved_bytes=10e9,
                           memory_allocated_bytes=10e9 * (1 - frag))


def test_stuck_rule_fires_on_a_queue_beside_a_small_batch_with_memory_to_spare() -> None:
    det = BatchCollapseDetector(STUCK)
    out = det.update(fv(60.0, 0.5, 0.3), tel(60.0, queue=30, running=2), 60.0)
    (alert,) = out.alerts
    assert alert.state == "open" and alert.evidence["stuck"] == 1 and alert.evidence["stuck_source"] == "telemetry"
    assert "stuck scheduler" in alert.message and alert.evidence["stuck_fill"] == 2 / 32
    assert out.actions[0].action == "adjust_batch_policy"


def test_throttle_option_asks_the_router_to_throttle_while_the_alert_is_open() -> None:

    plain = BatchCollapseDetector(STUCK).update(fv(60.0, 0.5, 0.3), tel(60.0, queue=30, running=2), 60.0)
    assert [a.action for a in plain.actions] == ["adjust_batch_policy"]  # off by default
    det = BatchCollapseDetector(msgspec.structs.replace(STUCK, throttle=True))
    out = det.update(fv(60.0, 0.5, 0.3), tel(60.0, queue=30, running=2), 60.0)
    assert [a.action for a in out.actions] == ["adjust_batch_policy", "throttle"]
    throttle = out.actions[1]
    assert throttle.replica == "r1" and throttle.params == {} and throttle.severity == out.alerts[0].severity
    # the scheduler recovers: once the alert resolves, neither action is sent
    t = 60.0
    while det.open_alerts():
        t += 5.0
        out = det.update(fv(t, 0.5, 0.3), tel(t, queue=0, running=20), t)
    assert out.alerts[-1].state == "resolved" and out.actions == []


def test_stuck_rule_is_off_by_default_and_the_seed_rule_is_unchanged() -> None:
    det = BatchCollapseDetector()
    assert not det.update(fv(60.0, 0.5, 0.05), tel(60.0, queue=300, running=1), 60.0).alerts
    both = BatchCollapseDetector(BatchCollapseConfig(stuck_rule=True))  # seed rule still judges too
    assert both.update(fv(60.0, 3.0, 0.1), tel(60.0, queue=0, running=20), 60.0).alerts


@pytest.mark.parametrize(
    ("queue", "running", "kv_usage", "frag", "why"),
    [
        (7, 2, 0.1, 0.1, "queue under stuck_queue_min"),
        (30, 13, 0.3, 0.1, "batch at 40 % of capacity: admitting"),
        (30, 32, 0.9, 0.1, "full batch: a healthy engine under load"),
        (30, 2, 0.6, 0.1, "two long prompts hold 60 % of the KV cache: room for 1.3 more (context_burst)"),
        (30, 8, 0.35, 0.6, "fragmented allocator (kv_pressure)"),
    ],
)
def test_stuck_rule_stays_quiet_when_something_else_explains_the_small_batch(
        queue: int, running: int, kv_usage: float, frag: float, why: str) -> None:
    det = BatchCollapseDetector(STUCK)
    for i in range(5):
        t = 60.0 + 5 * i
        assert not det.update(fv(t, 0.5, 0.2), tel(t, queue, running, kv_usage, frag), t).alerts, why


def test_stuck_rule_without_telemetry_reads_the_window_and_capacity_from_events() -> None:
    det = BatchCollapseDetector(STUCK)
    assert det.update(fv(60.0, 1.0, 0.1, queue_length_mean=20.0), None, 60.0).alerts[0].evidence["stuck_source"] \
        == "events"
    quiet = BatchCollapseDetector(STUCK)
    assert not quiet.update(fv(60.0, 1.0, 0.1, queue_length_mean=2.0), None, 60.0).alerts
    # telemetry without batch_capacity: capacity = batch_size_mean / batch_fill_mean = 6 / 0.1875 = 32
    derived = BatchCollapseDetector(STUCK)
    out = derived.update(fv(60.0, 1.0, 0.1875), tel(60.0, queue=30, running=2, capacity=None), 60.0)
    assert out.alerts[0].evidence["stuck_fill"] == pytest.approx(2 / 32)


def test_stuck_rule_config_is_validated() -> None:
    from skewwatch.config import ConfigError

    with pytest.raises(ConfigError, match="seed_rule"):
        BatchCollapseConfig.from_overrides({"seed_rule": "false"})
    with pytest.raises(ConfigError, match="stuck_fill_max"):
        BatchCollapseConfig.from_overrides({"stuck_rule": "true", "stuck_fill_max": "0"})


def _fleet_steps(injections: tuple[Any, ...], load: float, seed: int) -> list[tuple[FeatureVector, Any]]:
    """Per-replica feature vectors and the step's telemetry of a short fleet-simulator run."""
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.sim.fleet import FleetConfig, FleetSimulator

    sim = FleetSimulator(FleetConfig(replicas=4, load=load, seed=seed, injections=injections), 1_700_000_000.0, 240)
    windows = PartitionWindows(WindowSettings())
    steps = []
    for chunk in sim.chunks():
        windows.apply(chunk.requests)
        windows.advance_watermark(chunk.end_ts)
        samples = {s.replica: s for s in chunk.telemetry}
        steps += [(s.features, samples.get(s.features.replica or "")) for s in windows.close_steps()]
    return steps


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_stuck_rule_on_the_fleet_simulator_catches_the_fault_within_15_s_and_nothing_else(load: float) -> None:
    from skewwatch.sim.faults import Injection

    t0 = 1_700_000_000.0
    faults = (Injection("batch_collapse", "r1", 120, 90), Injection("context_burst", "r2", 120, 90),
              Injection("kv_pressure", "r3", 120, 90))
    det = BatchCollapseDetector(STUCK)
    opened: dict[str, float] = {}
    for features, sample in _fleet_steps(faults, load, seed=4):
        for alert in det.update(features, sample, features.window_end).alerts:
            if alert.state == "open":
                opened.setdefault(alert.replica or "", alert.ts - t0)
    assert set(opened) == {"r1"}, opened  # not r0 (clean), r2 (long prompts), r3 (fragmented KV)
    assert 120 < opened["r1"] <= 135
