"""GPU health: CUDA errors and NVML faults become throttle / isolate / drain (seed §4.3).

Runs :mod:`skewwatch.pipeline.health` per replica: every step it folds the newest step's
``step_cuda_errors`` and the replica's telemetry (XID, uncorrected ECC) into the replica's
health state, then reports the worst active class:

==================  ========  ==========  =================================================
class               severity  action      in force until
==================  ========  ==========  =================================================
hardware / driver   CRITICAL  ``drain``   ``drain_clean_s`` (300 s) without a hardware fault
configuration       WARNING   ``isolate`` ``isolate_s`` (300 s, seed: 5 min) without one
transient           INFO      ``throttle`` ``throttle_clean_s`` (60 s) without one
==================  ========  ==========  =================================================

Transient errors are INFO: the router already lowers the replica's weight by 10 % and retries,
nobody needs to be woken for a launch timeout; a drain is CRITICAL because capacity is lost.

One alert per replica (detector ``gpu_health``): ``open`` when the replica leaves health, a
new ``open`` with the new severity when the worst class changes (escalation, or a milder class
still active after a worse one expired), ``resolved`` when no class is active any more. The
action's ``expires_at`` is when the class would stop being active without a new error, so
a router that stops hearing from the worker still ends an isolation on time. Health scores
are read by the weights through :meth:`GpuHealthDetector.assessment`.

Model-level vectors (``replica`` None) are ignored: health belongs to a GPU.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> det = GpuHealthDetector()
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=10,
...                    step_count=3, step_cuda_errors={"700": 1})
>>> out = det.update(fv, None, now=60.0)
>>> str(out.alerts[0].severity), out.actions[0].action, out.actions[0].expires_at
('CRITICAL', 'drain', 360.0)
>>> det.assessment("m/r1", now=65.0).score
0.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skewwatch.pipeline.cuda_errors import ErrorClass
from skewwatch.pipeline.detectors.alerts import Action, Alert, DetectorOutput, Severity
from skewwatch.pipeline.detectors.base import STATE_VERSION, Detector
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.health import (
    HEALTHY,
    HealthAssessment,
    HealthConfig,
    HealthState,
    assess,
    observe,
    telemetry_news,
)
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

CLASS_SEVERITY: Mapping[ErrorClass, Severity] = {
    ErrorClass.TRANSIENT: Severity.INFO,
    ErrorClass.CONFIGURATION: Severity.WARNING,
    ErrorClass.HARDWARE: Severity.CRITICAL,
}
CLASS_LABEL: Mapping[ErrorClass, str] = {
    ErrorClass.TRANSIENT: "transient CUDA errors",
    ErrorClass.CONFIGURATION: "configuration / resource errors",
    ErrorClass.HARDWARE: "hardware / driver fault",
}


class GpuHealthDetector(Detector):
    name = "gpu_health"
    Config = HealthConfig
    config: HealthConfig
    needs_traffic = False  # XID / ECC come from telemetry, and a drained replica is silent by design

    def __init__(self, config: HealthConfig | None = None) -> None:
        super().__init__(config)
        self._state: dict[str, _ReplicaHealth] = {}  # key -> live health state and open alert class
        # keys whose health has an error class (``last_error_ts``): the only ones whose assessment
        # may be below 1.0, so the decider asks only these (see unwell_keys)
        self._unwell: set[str] = set()

    def update(self, fv: FeatureVector, telemetry: TelemetrySample | None, now: float) -> DetectorOutput:
        out = DetectorOutput()
        self.update_into(fv, telemetry, now, out.alerts, out.actions)
        return out

    def update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
        """``update`` of the replicas that can change anything: a CUDA error in the step, a fresh
        telemetry sample with news (a fault, or baselines to move or keep for the first time), or
        an error class or open alert to expire or resolve. For any other replica ``update`` is a
        no-op apart from creating an empty state, which is as good as none (``assessment`` and
        ``update`` treat both alike), so none is kept."""
        state = self._state
        update_into = self.update_into
        for fv, key, telemetry in zip(step.vectors, step.keys, step.telemetry, strict=True):
            if not fv.step_cuda_errors:
                key_state = state.get(key)
                if key_state is None:
                    if telemetry is None:
                        continue  # (with a sample: its first baselines are kept)
                elif (not key_state.health.last_error_ts and key_state.alert_class is None
                      and (telemetry is None or not telemetry_news(key_state.health, telemetry))):
                    continue
            update_into(fv, telemetry, now, alerts, actions)

    def update_into(
        self,
        fv: FeatureVector,
        telemetry: TelemetrySample | None,
        now: float,
        alerts: list[Alert],
        actions: list[Action],
    ) -> None:
        if fv.replica is None:
            return
        key_state = self._state.get(fv.key)
        if key_state is None:
            key_state = self._state[fv.key] = _ReplicaHealth()
        self._fold(key_state, fv, telemetry, now, alerts, actions)
        if key_state.health.last_error_ts:
            self._unwell.add(fv.key)
        else:
            self._unwell.discard(fv.key)

    def _fold(
        self,
        key_state: _ReplicaHealth,
        fv: FeatureVector,
        telemetry: TelemetrySample | None,
        now: float,
        alerts: list[Alert],
        actions: list[Action],
    ) -> None:
        """One replica's step: fold its errors in, then open, escalate or resolve its alert."""
        assert fv.replica is not None
        health = key_state.health
        if fv.step_cuda_errors or health.last_error_ts or (telemetry is not None and telemetry_news(health, telemetry)):
            observed = observe(health, fv.step_cuda_errors, telemetry, now, self.config)
        else:
            observed = []  # nothing to fold in and no active class to expire: observe() would be a no-op
        previous = key_state.alert_class
        if not health.last_error_ts and previous is None:
            return  # healthy before and after (observe expired what is no longer active): nothing to say
        current = assess(health, now, self.config)
        evidence = self._evidence(current, observed, fv, telemetry, health)

        if current.error_class is ErrorClass.SUCCESS:
            if previous is not None:
                prev_class = ErrorClass(previous)
                alerts.append(
                    Alert(
                        ts=now,
                        model=fv.model,
                        replica=fv.replica,
                        detector=self.name,
                        severity=CLASS_SEVERITY[prev_class],
                        state="resolved",
                        message=f"resolved: no {CLASS_LABEL[prev_class]} for its quiet period; health 1.0",
                        evidence=evidence,
                    )
                )
            key_state.alert_class = None
            return

        cls = current.error_class
        severity = CLASS_SEVERITY[cls]
        if previous != str(cls):
            change = "" if previous is None else f" (was {previous})"
            alerts.append(
                Alert(
                    ts=now,
                    model=fv.model,
                    replica=fv.replica,
                    detector=self.name,
                    severity=severity,
                    state="open",
                    message=(
                        f"{CLASS_LABEL[cls]} ({current.cause}){change}: health {current.score:g}, "
                        f"{current.action} until {current.expires_at:.0f} unless it recurs"
                    ),
                    evidence=evidence,
                )
            )
            key_state.alert_class = str(cls)
        assert current.action is not None  # every non-success class has an action
        actions.append(
            Action(
                replica=fv.replica,
                action=current.action,
                severity=severity,
                reason=f"gpu health: {CLASS_LABEL[cls]}",
                params={"health": current.score, "cause": current.cause},
                expires_at=current.expires_at,
            )
        )

    @staticmethod
    def _evidence(
        current: HealthAssessment,
        observed: list[tuple[str, str, int]],
        fv: FeatureVector,
        telemetry: TelemetrySample | None,
        health: HealthState,
    ) -> dict[str, float | int | str | None]:
        evidence: dict[str, float | int | str | None] = {
            "health": current.score,
            "class": str(current.error_class),
            "cause": current.cause,
            "until": current.expires_at,
            "step_count": fv.step_count,
            "step_errors": sum(c for _, _, c in observed),
        }
        for cls, cause, count in observed:
            evidence[f"errors.{cls}.{cause}"] = count
        for cls, until in current.active.items():
            evidence[f"active.{cls}"] = until
        if health.unknown_errors:
            evidence["unknown_error_values"] = ",".join(sorted(health.unknown_errors))
        if telemetry is not None:
            # throttling and heat are evidence only: they slow a GPU, they do not make it wrong
            evidence.update(
                {
                    "xid_last": telemetry.xid_last,
                    "xid_count_5m": telemetry.xid_count_5m,
                    "ecc_uncorrected_total": telemetry.ecc_uncorrected_total,
                    "throttle_reasons": telemetry.throttle_reasons,
                    "temperature_c": telemetry.temperature_c,
                }
            )
        return evidence

    def unwell_keys(self) -> set[str]:
        """Keys whose :meth:`assessment` may be below 1.0 (an error class not yet expired); every
        other key is :data:`HEALTHY`. Read only."""
        return self._unwell

    def assessment(self, key: str, now: float) -> HealthAssessment:
        """Health of ``model/replica`` at ``now`` (healthy when never seen)."""
        key_state = self._state.get(key)
        if key_state is None or not key_state.health.last_error_ts:
            return HEALTHY
        return assess(key_state.health, now, self.config)

    def state_dict(self) -> dict[str, Any]:
        keys = {
            key: {"health": ks.health.to_dict(), "alert_class": ks.alert_class} for key, ks in self._state.items()
        }
        return {"v": STATE_VERSION, "detector": self.name, "keys": keys}

    def load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("v") != STATE_VERSION or state.get("detector") != self.name:
            raise ValueError(f"{self.name}: cannot load state {state.get('detector')!r} v{state.get('v')!r}")
        self._state = {
            key: _ReplicaHealth(HealthState.from_dict(ks["health"]), ks.get("alert_class"))
            for key, ks in state.get("keys", {}).items()
        }
        self._unwell = {key for key, ks in self._state.items() if ks.health.last_error_ts}

    def forget(self, key: str) -> None:
        self._state.pop(key, None)
        self._unwell.discard(key)

    def open_alerts(self) -> dict[str, Severity]:
        return {
            key: CLASS_SEVERITY[ErrorClass(ks.alert_class)]
            for key, ks in self._state.items()
            if ks.alert_class is not None
        }


class _ReplicaHealth:
    """One replica's live state: its health memory and the class of its open alert (None: none)."""

    __slots__ = ("health", "alert_class")

    def __init__(self, health: HealthState | None = None, alert_class: str | None = None) -> None:
        self.health = health if health is not None else HealthState()
        self.alert_class = alert_class
