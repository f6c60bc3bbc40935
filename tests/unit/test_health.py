"""CUDA error classification (real cudaError_t names and numbers) and the health state machine."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewwatch.pipeline.cuda_errors import (
    CLASS_ACTION,
    CLASS_SCORE,
    CUDA_ERROR_CLASSES,
    CUDA_ERROR_CODES,
    CUDA_ERROR_NAMES,
    HARDWARE_XIDS,
    ErrorClass,
    classify_cuda_error,
    classify_xid,
)
from skewwatch.pipeline.health import HealthConfig, HealthState, assess, observe, telemetry_news
from skewwatch.schemas.telemetry_sample import TelemetrySample

S, T, C, H = ErrorClass.SUCCESS, ErrorClass.TRANSIENT, ErrorClass.CONFIGURATION, ErrorClass.HARDWARE

# (name, code from driver_types.h, class): the seed's examples first, then the rest we rely on
TABLE = [
    ("cudaSuccess", 0, S),
    ("cudaErrorLaunchTimeout", 702, T),
    ("cudaErrorLaunchOutOfResources", 701, T),
    ("cudaErrorMemoryAllocation", 2, C),
    ("cudaErrorInvalidValue", 1, C),
    ("cudaErrorInitializationError", 3, H),
    ("cudaErrorIllegalAddress", 700, H),
    ("cudaErrorECCUncorrectable", 214, H),
    ("cudaErrorLaunchFailure", 719, H),
    ("cudaErrorNoDevice", 100, H),
    ("cudaErrorUnknown", 999, H),
    ("cudaErrorCudartUnloading", 4, C),  # 4 was cudaErrorLaunchFailure before CUDA 10.1
    ("cudaErrorInvalidConfiguration", 9, C),
    ("cudaErrorInsufficientDriver", 35, H),
    ("cudaErrorDevicesUnavailable", 46, C),
    ("cudaErrorInvalidDeviceFunction", 98, C),
    ("cudaErrorInvalidDevice", 101, C),
    ("cudaErrorStartupFailure", 127, H),
    ("cudaErrorNoKernelImageForDevice", 209, C),
    ("cudaErrorNvlinkUncorrectable", 220, H),
    ("cudaErrorContained", 226, H),
    ("cudaErrorNotReady", 600, S),
    ("cudaErrorAssert", 710, H),
    ("cudaErrorHardwareStackError", 714, H),
    ("cudaErrorIllegalInstruction", 715, H),
    ("cudaErrorMisalignedAddress", 716, H),
    ("cudaErrorInvalidAddressSpace", 717, H),
    ("cudaErrorInvalidPc", 718, H),
    ("cudaErrorCooperativeLaunchTooLarge", 720, C),
    ("cudaErrorNotSupported", 801, C),
    ("cudaErrorSystemNotReady", 802, H),
    ("cudaErrorSystemDriverMismatch", 803, H),
    ("cudaErrorMpsServerNotReady", 807, T),
    ("cudaErrorMpsClientTerminated", 810, H),
    ("cudaErrorStreamCaptureUnsupported", 900, C),
    ("cudaErrorTimeout", 909, T),
    ("cudaErrorExternalDevice", 911, H),
    ("cudaErrorInvalidResourceConfiguration", 915, C),
    ("cudaErrorStreamDetached", 917, C),
]


@pytest.mark.parametrize(("name", "code", "error_class"), TABLE)
def test_cuda_error_table(name: str, code: int, error_class: ErrorClass) -> None:
    for value in (name, code, str(code), f" {code} ", name.lower(), name.upper()):
        info = classify_cuda_error(value)
        assert (info.name, info.code, info.error_class, info.known) == (name, code, error_class, True), value
    if name != "cudaSuccess":
        assert classify_cuda_error(name.removeprefix("cudaError")).name == name


@pytest.mark.parametrize(
    ("error_class", "score", "action"),
    [(S, 1.0, None), (T, 0.9, "throttle"), (C, 0.4, "isolate"), (H, 0.0, "drain")],
)
def test_seed_scores_and_actions(error_class: ErrorClass, score: float, action: str | None) -> None:
    assert CLASS_SCORE[error_class] == score and CLASS_ACTION[error_class] == action
    assert HealthConfig().score(error_class) == score


def test_table_is_a_bijection_between_names_and_codes() -> None:
    assert len(CUDA_ERROR_CODES) == len(CUDA_ERROR_NAMES) == len(CUDA_ERROR_CLASSES)
    assert all(CUDA_ERROR_NAMES[code] == name for name, code in CUDA_ERROR_CODES.items())


@pytest.mark.parametrize("value", ["cudaErrorWhatever", "CUDA_ERROR_OUT_OF_MEMORY", 4242, "4242", -1, True])
def test_unknown_values_are_configuration_not_ignored_not_drained(value: object) -> None:
    info = classify_cuda_error(value)  # type: ignore[arg-type]
    assert (info.error_class, info.known) == (C, False)


@pytest.mark.parametrize("value", [None, "", "  ", 0, "0", "cudaSuccess"])
def test_success_values(value: object) -> None:
    assert classify_cuda_error(value).error_class is S  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("xid", "expected"),
    [
        (48, H),
        (79, H),
        (94, H),
        (95, H),
        (64, H),
        (74, H),
        (119, H),
        (13, None),
        (31, None),
        (43, None),
        (63, None),
        (92, None),
        (None, None),
    ],
)
def test_xid_classification(xid: int | None, expected: ErrorClass | None) -> None:
    assert classify_xid(xid) == expected
    assert {48, 79, 94, 95} <= HARDWARE_XIDS


# ---------------------------------------------------------------- the health state machine


def test_assess_is_pure_and_takes_the_minimum() -> None:
    cfg = HealthConfig()
    state = HealthState()
    observe(state, {"cudaErrorLaunchTimeout": 1, "cudaErrorMemoryAllocation": 1}, None, 0.0, cfg)
    before = state.to_dict()
    a = assess(state, 10.0, cfg)
    assert (a.score, a.error_class, a.action, a.expires_at, a.cause) == (
        0.4,
        C,
        "isolate",
        300.0,
        "cudaErrorMemoryAllocation",
    )
    assert a.active == {"transient": 60.0, "configuration": 300.0}
    assert state.to_dict() == before
    assert assess(state, 299.9, cfg).score == 0.4
    assert assess(state, 300.0, cfg).score == 1.0


def test_expired_classes_are_dropped_and_counts_restart() -> None:
    cfg = HealthConfig(throttle_clean_s=10.0)
    state = HealthState()
    observe(state, {"702": 3}, None, 0.0, cfg)
    assert state.errors == {"transient": 3}
    observe(state, {"702": 1}, None, 20.0, cfg)
    assert state.errors == {"transient": 1}


def test_state_round_trips() -> None:
    cfg = HealthConfig()
    state = HealthState()
    observe(
        state,
        {"bogus": 1},
        TelemetrySample(ts=0.0, replica="r", source="nvml", ecc_uncorrected_total=1, xid_last=13, xid_count_5m=1),
        0.0,
        cfg,
    )
    assert HealthState.from_dict(state.to_dict()) == state
    assert state.unknown_errors == {"bogus": 1} and state.ecc_baseline == 1 and state.xid_last_seen == 13


def test_xid_without_counter_uses_changes_of_the_latest_xid() -> None:
    cfg = HealthConfig()
    state = HealthState()
    sample = TelemetrySample(ts=0.0, replica="r", source="dcgm", xid_last=79)
    assert observe(state, {}, sample, 0.0, cfg) == [("hardware", "XID 79", 1)]
    assert observe(state, {}, sample, 5.0, cfg) == []


def test_ecc_growth_can_be_made_evidence_only() -> None:
    cfg = HealthConfig.from_overrides({"ecc_growth_drains": "false", "hardware_xids": "79"})
    state = HealthState()
    observe(state, {}, TelemetrySample(ts=0.0, replica="r", source="nvml", ecc_uncorrected_total=1), 0.0, cfg)
    assert (
        observe(state, {}, TelemetrySample(ts=5.0, replica="r", source="nvml", ecc_uncorrected_total=3), 5.0, cfg) == []
    )
    assert cfg.hardware_xids == (79,)


_counter = st.one_of(st.none(), st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(samples=st.lists(st.tuples(st.one_of(st.none(), st.sampled_from([13, 48, 79])), _counter, _counter),
                        min_size=1, max_size=6))
def test_a_sample_without_news_changes_nothing(samples: list[tuple[int | None, int | None, int | None]]) -> None:
    """gpu_health skips observe() for a healthy replica whose sample has no news (telemetry_news)."""
    cfg = HealthConfig()
    state = HealthState()
    for i, (xid, count, ecc) in enumerate(samples):
        sample = TelemetrySample(ts=float(i), replica="r", source="nvml", xid_last=xid, xid_count_5m=count,
                                 ecc_uncorrected_total=ecc)
        if not telemetry_news(state, sample):
            quiet = HealthState.from_dict(state.to_dict())
            quiet.last_error_ts.clear()  # the skip is taken only without an active class
            before = HealthState.from_dict(quiet.to_dict())
            assert observe(quiet, {}, sample, float(i), cfg) == [] and quiet == before
        observe(state, {}, sample, float(i), cfg)
