"""Per-replica GPU health from CUDA errors on requests and NVML faults (seed §4.3).

Seed §4.3: success 1.0; transient errors 0.9 → throttle and retry; configuration / resource
errors 0.4 → isolate the instance for 5 minutes; hardware / driver crashes 0.0 → drain now and
migrate. The classes come from :mod:`skewwatch.pipeline.cuda_errors`.

A replica's health is the **minimum score over the classes that are active**, and a class is
active from its latest error until a quiet period has passed without another one of it:

=================  =====  ========  ====================================================
class              score  action    active until (defaults, all configurable)
=================  =====  ========  ====================================================
transient          0.9    throttle  ``throttle_clean_s`` = 60 s without a transient error
configuration      0.4    isolate   ``isolate_s`` = 300 s (seed: 5 min) without one
hardware / driver  0.0    drain     ``drain_clean_s`` = 300 s without a hardware fault
=================  =====  ========  ====================================================

So recovery never comes from "the next good request": a replica drained for an illegal
address stays drained after a hundred successful requests until 300 s have passed without a
hardware fault, and an isolated replica that errs again at minute 4 is isolated 5 more minutes.
Time is event time (the step's ``window_end``), so a replay reproduces the same decisions.

Hardware faults also come from telemetry: a *new* XID in :data:`HARDWARE_XIDS` (the XID
counter grew, or a different hardware XID became the latest) and a *growth* of the volatile
uncorrected-ECC counter. A counter seen for the first time is a baseline, not a fault (it
may count errors from before the driver's last reload that have been dealt with); a counter
that goes down (driver reload) is re-baselined. Throttle reasons and temperature are evidence
only: they slow a GPU, they do not make its answers wrong. Note that a drained replica gets
no requests, so its CUDA errors stop by construction: for request-level faults the clean
period is "time the router kept it out", and if the fault is still there the first requests
after it will drain it again; telemetry faults (XID, ECC) keep being observed while drained.

>>> cfg = HealthConfig()
>>> st = HealthState()
>>> observe(st, {"cudaErrorMemoryAllocation": 2}, None, now=100.0, config=cfg)
[('configuration', 'cudaErrorMemoryAllocation', 2)]
>>> a = assess(st, now=105.0, config=cfg)
>>> a.score, a.action, a.expires_at
(0.4, 'isolate', 400.0)
>>> assess(st, now=400.0, config=cfg).score
1.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skewwatch.config_section import FrozenConfigSection, Positive, Unit
from skewwatch.pipeline.cuda_errors import (
    CLASS_ACTION,
    CLASS_RANK,
    HARDWARE_XIDS,
    ErrorClass,
    canonical_name,
    classify_cuda_error,
)
from skewwatch.schemas.telemetry_sample import TelemetrySample


class HealthConfig(FrozenConfigSection, frozen=True):
    """``[detectors.gpu_health]``: scores, quiet periods and the XID list."""

    section = "detectors.gpu_health"

    transient_score: Unit = 0.9  # seed §4.3
    configuration_score: Unit = 0.4  # seed §4.3
    hardware_score: Unit = 0.0  # seed §4.3
    throttle_clean_s: Positive = 60.0  # ours: the seed says "throttle and retry", no duration
    isolate_s: Positive = 300.0  # seed: isolate for 5 minutes
    drain_clean_s: Positive = 300.0  # ours: the seed says "drain now and migrate", no return rule
    hardware_xids: tuple[int, ...] = tuple(sorted(HARDWARE_XIDS))
    ecc_growth_drains: bool = True  # uncorrected ECC counter growth is a hardware fault
    reclassify: tuple[str, ...] = ()  # "cudaErrorLaunchTimeout=hardware", ... (operator override)

    def __post_init__(self) -> None:
        self.reclassify_map()  # raises on a bad entry

    def score(self, error_class: ErrorClass) -> float:
        return {
            ErrorClass.SUCCESS: 1.0,
            ErrorClass.TRANSIENT: self.transient_score,
            ErrorClass.CONFIGURATION: self.configuration_score,
            ErrorClass.HARDWARE: self.hardware_score,
        }[error_class]

    def quiet_period(self, error_class: ErrorClass) -> float:
        return {
            ErrorClass.SUCCESS: 0.0,
            ErrorClass.TRANSIENT: self.throttle_clean_s,
            ErrorClass.CONFIGURATION: self.isolate_s,
            ErrorClass.HARDWARE: self.drain_clean_s,
        }[error_class]

    def reclassify_map(self) -> dict[str, ErrorClass]:
        result: dict[str, ErrorClass] = {}
        for entry in self.reclassify:
            name, sep, cls = entry.partition("=")
            canonical = canonical_name(name)
            try:
                error_class = ErrorClass(cls.strip().lower())
            except ValueError:
                error_class = None
            if not sep or canonical is None or error_class is None:
                self._require(
                    False,
                    "reclassify",
                    "entries must be <cudaError name>=<success|transient|configuration|hardware>",
                )
            else:
                result[canonical] = error_class
        return result


@dataclass(slots=True)
class HealthState:
    """One replica's health memory, kept live between steps; plain data only for checkpoints
    (``to_dict`` / ``from_dict``)."""

    last_error_ts: dict[str, float] = field(default_factory=dict)  # class -> event time of its latest error
    cause: dict[str, str] = field(default_factory=dict)  # class -> what its latest error was
    errors: dict[str, int] = field(default_factory=dict)  # class -> errors since it became active
    ecc_baseline: int | None = None  # last seen ecc_uncorrected_total
    xid_count_baseline: int | None = None  # last seen xid_count_5m
    xid_last_seen: int | None = None  # last seen xid_last
    unknown_errors: dict[str, int] = field(default_factory=dict)  # unrecognised cuda_error values seen

    def to_dict(self) -> dict[str, Any]:
        return {
            "last_error_ts": dict(self.last_error_ts),
            "cause": dict(self.cause),
            "errors": dict(self.errors),
            "ecc_baseline": self.ecc_baseline,
            "xid_count_baseline": self.xid_count_baseline,
            "xid_last_seen": self.xid_last_seen,
            "unknown_errors": dict(self.unknown_errors),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthState:
        return cls(
            last_error_ts={k: float(v) for k, v in data.get("last_error_ts", {}).items()},
            cause=dict(data.get("cause", {})),
            errors={k: int(v) for k, v in data.get("errors", {}).items()},
            ecc_baseline=data.get("ecc_baseline"),
            xid_count_baseline=data.get("xid_count_baseline"),
            xid_last_seen=data.get("xid_last_seen"),
            unknown_errors={k: int(v) for k, v in data.get("unknown_errors", {}).items()},
        )


@dataclass(frozen=True, slots=True)
class HealthAssessment:
    """A replica's health at one instant."""

    score: float  # 1.0 healthy .. 0.0 drain
    error_class: ErrorClass  # the worst active class (SUCCESS when none)
    action: str | None  # throttle | isolate | drain | None
    expires_at: float | None  # when the worst class stops being active if nothing new happens
    cause: str | None  # the worst class's latest error
    active: dict[str, float] = field(default_factory=dict)  # active class -> until


HEALTHY = HealthAssessment(score=1.0, error_class=ErrorClass.SUCCESS, action=None, expires_at=None, cause=None)

Observation = tuple[str, str, int]  # (class, cause, count)


def observe(
    state: HealthState,
    cuda_errors: Mapping[str, int],
    telemetry: TelemetrySample | None,
    now: float,
    config: HealthConfig,
) -> list[Observation]:
    """Fold one step's errors into ``state``; return what was observed (non-success only)."""
    found: dict[tuple[str, str], int] = {}
    # parsed only when there is something to classify: most replicas report no error in a step
    reclassify = config.reclassify_map() if cuda_errors else {}
    for value, count in sorted(cuda_errors.items()):
        if count <= 0:
            continue
        info = classify_cuda_error(value, reclassify)
        if info.error_class is ErrorClass.SUCCESS:
            continue
        cause = info.name if info.name is not None else str(value)
        if not info.known:
            state.unknown_errors[cause] = state.unknown_errors.get(cause, 0) + count
        found[(str(info.error_class), cause)] = found.get((str(info.error_class), cause), 0) + count
    if telemetry is not None:
        for cause in _telemetry_faults(state, telemetry, config):
            found[(str(ErrorClass.HARDWARE), cause)] = found.get((str(ErrorClass.HARDWARE), cause), 0) + 1
    # expire classes whose quiet period has passed before counting new errors into them
    _expire(state, now, config)
    for (cls, cause), count in found.items():
        state.last_error_ts[cls] = now
        state.cause[cls] = cause
        state.errors[cls] = state.errors.get(cls, 0) + count
    return [(cls, cause, count) for (cls, cause), count in found.items()]


def telemetry_news(state: HealthState, telemetry: TelemetrySample) -> bool:
    """False when the sample's XID and ECC counters are the ones ``state`` last saw: observing
    it could neither find a fault nor move a baseline (most samples, most steps)."""
    xid, count, ecc = telemetry.xid_last, telemetry.xid_count_5m, telemetry.ecc_uncorrected_total
    return not (
        (count is None or count == state.xid_count_baseline)
        and (xid is None or xid == state.xid_last_seen)
        and (ecc is None or ecc == state.ecc_baseline)
    )


def _telemetry_faults(state: HealthState, telemetry: TelemetrySample, config: HealthConfig) -> list[str]:
    """New hardware faults reported by NVML since the last sample seen; updates the baselines."""
    faults: list[str] = []
    hardware_xids = config.hardware_xids  # a short tuple: membership without building a set per sample
    xid, count = telemetry.xid_last, telemetry.xid_count_5m
    if count is not None:
        prev = state.xid_count_baseline
        new_xid = count > 0 and (prev is None or count > prev or xid != state.xid_last_seen)
        state.xid_count_baseline = count
    else:
        # no counter: a change of the latest XID is the only sign of a new one
        new_xid = xid is not None and xid != state.xid_last_seen
    if new_xid and xid is not None and xid in hardware_xids:
        faults.append(f"XID {xid}")
    if xid is not None:
        state.xid_last_seen = xid
    ecc = telemetry.ecc_uncorrected_total
    if ecc is not None:
        if state.ecc_baseline is not None and ecc > state.ecc_baseline and config.ecc_growth_drains:
            faults.append(f"uncorrected ECC +{ecc - state.ecc_baseline}")
        state.ecc_baseline = ecc
    return faults


def _expire(state: HealthState, now: float, config: HealthConfig) -> None:
    for cls in list(state.last_error_ts):
        if now >= state.last_error_ts[cls] + config.quiet_period(ErrorClass(cls)):
            del state.last_error_ts[cls]
            state.cause.pop(cls, None)
            state.errors.pop(cls, None)


def assess(state: HealthState, now: float, config: HealthConfig) -> HealthAssessment:
    """Health at ``now``: the minimum score over active classes (pure; ``state`` is not changed)."""
    active: dict[str, float] = {}
    for cls, ts in state.last_error_ts.items():
        until = ts + config.quiet_period(ErrorClass(cls))
        if now < until:
            active[cls] = until
    if not active:
        return HEALTHY
    worst = max((ErrorClass(c) for c in active), key=lambda c: CLASS_RANK[c])
    score = min(config.score(ErrorClass(c)) for c in active)
    return HealthAssessment(
        score=score,
        error_class=worst,
        action=CLASS_ACTION[worst],
        expires_at=active[str(worst)],
        cause=state.cause.get(str(worst)),
        active=active,
    )
