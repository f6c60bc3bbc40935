"""gpu_health (seed §4.3): CUDA errors and NVML faults -> throttle / isolate / drain, recovering
after quiet periods, never on the next good request."""

from __future__ import annotations

from typing import Any

import pytest

from skewwatch.config import ConfigError
from skewwatch.pipeline.detectors.alerts import Severity
from skewwatch.pipeline.detectors.gpu_health import GpuHealthDetector
from skewwatch.pipeline.health import HealthConfig
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample


def fv(t: float, errors: dict[str, int] | None = None, replica: str | None = "r1") -> FeatureVector:
    return FeatureVector(
        model="m",
        replica=replica,
        window_start=t - 60,
        window_end=t,
        count=50,
        step_count=5,
        step_cuda_errors=errors or {},
    )


def tel(t: float, **kw: Any) -> TelemetrySample:
    return TelemetrySample(ts=t, replica="r1", source="nvml", **kw)


def run(det: GpuHealthDetector, steps: dict[float, dict[str, int]], until: float, telemetry: Any = None) -> list[Any]:
    """Feed every 5 s from 0 to ``until``; ``steps`` says which steps carry errors."""
    alerts = []
    t = 0.0
    while t <= until:
        sample = telemetry(t) if telemetry else None
        out = det.update(fv(t, steps.get(t)), sample, t)
        alerts += [(t, a.state, a.severity) for a in out.alerts]
        t += 5.0
    return alerts


@pytest.mark.parametrize(
    ("error", "severity", "action", "score", "period"),
    [
        ("cudaErrorLaunchTimeout", Severity.INFO, "throttle", 0.9, 60.0),
        ("701", Severity.INFO, "throttle", 0.9, 60.0),
        ("cudaErrorMemoryAllocation", Severity.WARNING, "isolate", 0.4, 300.0),
        ("cudaErrorInvalidValue", Severity.WARNING, "isolate", 0.4, 300.0),
        ("cudaErrorIllegalAddress", Severity.CRITICAL, "drain", 0.0, 300.0),
        ("214", Severity.CRITICAL, "drain", 0.0, 300.0),
    ],
)
def test_each_class_acts_and_recovers_after_its_quiet_period(
    error: str, severity: Severity, action: str, score: float, period: float
) -> None:
    det = GpuHealthDetector()
    out = det.update(fv(100.0, {error: 2}), None, 100.0)
    (alert,) = out.alerts
    assert (alert.state, alert.severity) == ("open", severity)
    (act,) = out.actions
    assert (act.action, act.severity, act.params["health"], act.expires_at) == (action, severity, score, 100.0 + period)
    # good requests do not bring it back
    out = det.update(fv(105.0), None, 105.0)
    assert out.alerts == [] and [a.action for a in out.actions] == [action]
    assert det.assessment("m/r1", 100.0 + period - 5.0).score == score
    out = det.update(fv(100.0 + period), None, 100.0 + period)
    assert [(a.state, a.severity) for a in out.alerts] == [("resolved", severity)]
    assert out.actions == [] and det.assessment("m/r1", 100.0 + period).score == 1.0


def test_a_new_error_extends_the_isolation() -> None:
    det = GpuHealthDetector()
    alerts = run(det, {0.0: {"2": 1}, 200.0: {"2": 1}}, until=600.0)
    assert alerts == [(0.0, "open", Severity.WARNING), (500.0, "resolved", Severity.WARNING)]


def test_health_is_the_minimum_over_active_classes_and_the_alert_follows_the_worst() -> None:
    det = GpuHealthDetector()
    alerts = run(det, {0.0: {"cudaErrorIllegalAddress": 1}, 290.0: {"cudaErrorLaunchTimeout": 1}}, until=400.0)
    # drain until 300; the throttle from 290 is still active then (until 350): a milder open alert
    assert alerts == [
        (0.0, "open", Severity.CRITICAL),
        (300.0, "open", Severity.INFO),
        (350.0, "resolved", Severity.INFO),
    ]
    det = GpuHealthDetector()
    run(det, {0.0: {"cudaErrorIllegalAddress": 1}, 290.0: {"cudaErrorLaunchTimeout": 1}}, until=295.0)
    assert det.assessment("m/r1", 295.0).score == 0.0
    assert det.assessment("m/r1", 320.0).score == 0.9
    assert det.assessment("m/r1", 350.0).score == 1.0


def test_escalation_reopens_with_the_higher_severity() -> None:
    det = GpuHealthDetector()
    det.update(fv(0.0, {"cudaErrorLaunchTimeout": 1}), None, 0.0)
    out = det.update(fv(5.0, {"cudaErrorECCUncorrectable": 1}), None, 5.0)
    assert [(a.state, a.severity) for a in out.alerts] == [("open", Severity.CRITICAL)]
    assert "was transient" in out.alerts[0].message
    assert [a.action for a in out.actions] == ["drain"]


def test_hardware_xid_drains_once_per_new_xid() -> None:
    det = GpuHealthDetector()

    def sample(t: float) -> TelemetrySample:
        return tel(t, xid_last=79, xid_count_5m=1 if t >= 10.0 else 0)

    alerts = run(det, {}, until=400.0, telemetry=sample)
    # the same XID sample repeated is not a new fault: drain ends 300 s after it first appeared
    assert alerts == [(10.0, "open", Severity.CRITICAL), (310.0, "resolved", Severity.CRITICAL)]


def test_xid_counter_growth_refreshes_the_drain() -> None:
    det = GpuHealthDetector()
    det.update(fv(0.0), tel(0.0, xid_last=48, xid_count_5m=1), 0.0)
    det.update(fv(100.0), tel(100.0, xid_last=48, xid_count_5m=2), 100.0)
    assert det.assessment("m/r1", 350.0).score == 0.0
    assert det.assessment("m/r1", 400.0).score == 1.0


@pytest.mark.parametrize("xid", [13, 31, 43, 63, 92])
def test_application_and_warning_xids_are_evidence_only(xid: int) -> None:
    det = GpuHealthDetector()
    assert det.update(fv(0.0), tel(0.0, xid_last=xid, xid_count_5m=3), 0.0).alerts == []


def test_uncorrected_ecc_growth_drains_but_a_first_reading_is_a_baseline() -> None:
    det = GpuHealthDetector()
    assert det.update(fv(0.0), tel(0.0, ecc_uncorrected_total=5), 0.0).alerts == []
    out = det.update(fv(5.0), tel(5.0, ecc_uncorrected_total=6), 5.0)
    assert [a.severity for a in out.alerts] == [Severity.CRITICAL]
    assert out.alerts[0].evidence["cause"] == "uncorrected ECC +1"
    det2 = GpuHealthDetector()
    det2.update(fv(0.0), tel(0.0, ecc_uncorrected_total=5), 0.0)
    assert det2.update(fv(5.0), tel(5.0, ecc_uncorrected_total=0), 5.0).alerts == []  # driver reload
    assert det2.update(fv(10.0), tel(10.0, ecc_uncorrected_total=0), 10.0).alerts == []


def test_throttling_and_temperature_are_evidence_only() -> None:
    det = GpuHealthDetector()
    assert det.update(fv(0.0), tel(0.0, throttle_reasons=0x40, temperature_c=95.0), 0.0).alerts == []
    out = det.update(fv(5.0, {"2": 1}), tel(5.0, throttle_reasons=0x40, temperature_c=95.0), 5.0)
    assert out.alerts[0].evidence["temperature_c"] == 95.0 and out.alerts[0].evidence["throttle_reasons"] == 0x40


def test_unknown_errors_isolate_and_are_named_in_the_evidence() -> None:
    out = GpuHealthDetector().update(fv(0.0, {"cudaErrorFromCuda27": 1}), None, 0.0)
    assert out.actions[0].action == "isolate"
    assert out.alerts[0].evidence["unknown_error_values"] == "cudaErrorFromCuda27"


def test_success_values_and_zero_counts_are_not_errors() -> None:
    det = GpuHealthDetector()
    out = det.update(
        fv(0.0, {"cudaSuccess": 9, "0": 3, "cudaErrorNotReady": 1, "cudaErrorIllegalAddress": 0}), None, 0.0
    )
    assert out.alerts == [] and out.actions == []


def test_reclassify_override() -> None:
    config = HealthConfig.from_overrides({"reclassify": "cudaErrorLaunchTimeout=hardware", "drain_clean_s": "600"})
    out = GpuHealthDetector(config).update(fv(0.0, {"cudaErrorLaunchTimeout": 1}), None, 0.0)
    assert out.actions[0].action == "drain" and out.actions[0].expires_at == 600.0


@pytest.mark.parametrize("entry", ["cudaErrorNope=hardware", "cudaErrorLaunchTimeout=broken", "justaname"])
def test_bad_reclassify_is_rejected(entry: str) -> None:
    with pytest.raises(ConfigError, match="gpu_health.reclassify"):
        HealthConfig.from_overrides({"reclassify": entry})


def test_model_level_vectors_are_ignored() -> None:
    det = GpuHealthDetector()
    assert det.update(fv(0.0, {"700": 5}, replica=None), None, 0.0).alerts == []
    assert det.state_dict()["keys"] == {}


def test_a_step_at_once_is_update_per_replica() -> None:
    """``update_step`` (the decider's path, which skips replicas with nothing to fold in) gives the
    alerts, actions and assessments of ``update`` on every replica, and the same state for every
    replica that has any (a skipped replica keeps none instead of an empty one)."""
    import random

    from skewwatch.pipeline.detectors.step_columns import StepColumns

    rng = random.Random(5)
    errors = ["cudaErrorLaunchTimeout", "cudaErrorMemoryAllocation", "cudaErrorIllegalAddress", "999"]
    replicas = [f"r{i}" for i in range(30)]
    stepwise, per_replica = GpuHealthDetector(), GpuHealthDetector()
    opened = 0
    for k in range(120):
        t = 5.0 * k
        vectors, samples = [], []
        for replica in replicas:
            cuda = {rng.choice(errors): rng.randint(1, 3)} if rng.random() < 0.03 else {}
            vectors.append(FeatureVector(model="m", replica=replica, window_start=t - 60, window_end=t, count=50,
                                         step_count=5, step_cuda_errors=cuda))
            samples.append(None if rng.random() < 0.7 else TelemetrySample(
                ts=t, replica=replica, source="nvml", xid_last=rng.choice([None, 13, 48, 79]),
                xid_count_5m=rng.choice([None, 0, 1, 2]), ecc_uncorrected_total=rng.choice([None, 0, 0, 1])))
        got_alerts: list[Any] = []
        got_actions: list[Any] = []
        stepwise.update_step(StepColumns(vectors, samples), t, got_alerts, got_actions)
        want_alerts: list[Any] = []
        want_actions: list[Any] = []
        for vector, sample in zip(vectors, samples, strict=True):
            out = per_replica.update(vector, sample, t)
            want_alerts += out.alerts
            want_actions += out.actions
        assert [a.to_dict() for a in got_alerts] == [a.to_dict() for a in want_alerts]
        assert [a.to_dict() for a in got_actions] == [a.to_dict() for a in want_actions]
        for replica in replicas:
            assert stepwise.assessment(f"m/{replica}", t) == per_replica.assessment(f"m/{replica}", t)
        unwell = {key for key in per_replica.state_dict()["keys"] if per_replica.assessment(key, t).score < 1.0}
        assert unwell <= stepwise.unwell_keys()
        opened += sum(a.state == "open" for a in got_alerts)
    kept = stepwise.state_dict()["keys"]
    assert kept and all(per_replica.state_dict()["keys"][key] == state for key, state in kept.items())
    assert opened > 5  # the faults did happen
