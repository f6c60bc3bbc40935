"""batch_collapse: std(batch_size) > 2 and mean fill < 30 % -> CRITICAL, adjust_batch_policy with
the seed §4.2 controller's max_batch_size."""

from __future__ import annotations

from typing import Any

import pytest

from skewwatch.pipeline.batch_controller import BatchControllerConfig, recommend_batch_size
from skewwatch.pipeline.detectors.base import Severity
from skewwatch.pipeline.detectors.batch_collapse import BatchCollapseConfig, BatchCollapseDetector
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.telemetry import TelemetrySample


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
    from skewwatch.pipeline.events import RequestColumns
    from skewwatch.pipeline.window import PartitionWindows

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
