"""Injected faults: on the right replica and window only, clearly across the detector's rule, labelled."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np
import pytest

from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import CUDA_ERROR_CLASSES, CUDA_ERRORS, FaultError, Injection, read_labels, write_labels
from skewwatch.sim.generate_command import build_injections, generate_command
from skewwatch.sim.generator import GeneratorConfig, generate_chunks, labels
from skewwatch.sim.trace import load_trace

T0 = 1_700_000_000.0
AT, FOR, DURATION = 120.0, 120.0, 330.0
STEP_ENDS = np.arange(T0 + 60, T0 + DURATION - 5, 5.0)
INSIDE = STEP_ENDS[(STEP_ENDS >= T0 + AT + 60) & (STEP_ENDS <= T0 + AT + FOR)]  # windows wholly in the fault
BEFORE = STEP_ENDS[STEP_ENDS <= T0 + AT]
AFTER = STEP_ENDS[STEP_ENDS >= T0 + AT + FOR + 60 + 15]  # + the slowest faulty request's latency


def run(kind: str, seed: int = 0, trace: str = "conv", params: dict[str, float | str] | None = None
        ) -> tuple[RequestColumns, list[TelemetrySample]]:
    config = GeneratorConfig(replicas=3, seed=seed, trace=load_trace(trace),
                             injections=(Injection(kind, "r1", AT, FOR, params or {}),))
    chunks = list(generate_chunks(config, T0, DURATION))
    return (RequestColumns.concat([c.requests for c in chunks]), [s for c in chunks for s in c.telemetry])


def window(cols: RequestColumns, replica: str, end: float) -> RequestColumns:
    return cols.take((cols.replica == replica) & (cols.ts >= end - 60) & (cols.ts < end))


def tail_ratio(w: RequestColumns) -> float:
    return float(np.percentile(w.latency_ms, 99) / np.percentile(w.latency_ms, 50))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_tail_crosses_p99_over_3x_p50_only_on_its_replica(seed: int) -> None:
    cols, _ = run("long_tail", seed)
    clean_p50 = float(np.percentile(window(cols, "r0", T0 + 60).latency_ms, 50))
    for end in INSIDE:
        w = window(cols, "r1", end)
        assert tail_ratio(w) > 4.5  # rule: > 3, clearly
        assert float(np.percentile(w.latency_ms, 50)) < 1.25 * clean_p50  # P50 barely moves
    for end in np.concatenate([BEFORE, AFTER]):
        assert tail_ratio(window(cols, "r1", end)) < 2.5
    for end in STEP_ENDS:
        assert tail_ratio(window(cols, "r0", end)) < 2.5 and tail_ratio(window(cols, "r2", end)) < 2.5


def test_slow_replica_is_slower_but_not_a_long_tail() -> None:
    cols, _ = run("slow_replica", params={"factor": 3.0})
    for end in INSIDE:
        w, clean = window(cols, "r1", end), window(cols, "r0", end)
        assert w.latency_ms.mean() > 2.3 * clean.latency_ms.mean()
        assert tail_ratio(w) < 2.5


def test_batch_collapse_has_std_over_2_and_fill_under_30_percent() -> None:
    cols, telemetry = run("batch_collapse")
    for end in INSIDE:
        w = window(cols, "r1", end)
        assert w.batch_size.std() > 2.5 and w.batch_fill.mean() < 0.2
        assert w.batch_size.max() <= w.batch_capacity.min()
    queue = [window(cols, "r1", end).queue_length.mean() for end in INSIDE]
    assert queue[-1] > queue[0] > 20  # the queue grows while the scheduler is stuck
    for end in np.concatenate([BEFORE, AFTER]):
        assert window(cols, "r1", end).batch_fill.mean() > 0.4
    for end in STEP_ENDS:
        assert window(cols, "r0", end).batch_fill.mean() > 0.4
    low_util = [s.utilization_gpu for s in telemetry if s.replica == "r1" and T0 + AT + 5 <= s.ts <= T0 + AT + FOR]
    assert low_util and max(u for u in low_util if u is not None) < 0.45


@pytest.mark.parametrize("trace", ["conv", "code"])
def test_context_burst_variance_grows_over_400_percent_on_long_prompts(trace: str) -> None:
    cols, _ = run("context_burst", trace=trace)
    for replica, expect in (("r1", True), ("r0", False), ("r2", False)):
        for end in STEP_ENDS[STEP_ENDS >= T0 + 120]:
            now, before = window(cols, replica, end), window(cols, replica, end - 60)
            growth = now.prompt_tokens.var() / before.prompt_tokens.var() - 1.0
            fires = growth > 4.0 and now.prompt_tokens.mean() > 2048
            if replica == "r1" and T0 + AT + 10 <= end <= T0 + AT + 60:
                assert fires and growth > 5.0, (end - T0, growth)  # within 10 s of the burst's start
            elif not expect:
                assert not fires
    burst = cols.take((cols.replica == "r1") & (cols.ts >= T0 + AT + 2) & (cols.ts < T0 + AT + FOR))
    assert burst.prompt_tokens.mean() > 2048 * 4 and burst.prompt_tokens.std() > 4000


@pytest.mark.parametrize("cls", ["transient", "resource", "hardware"])
def test_gpu_fault_errors_of_the_class_only_in_the_window(cls: str) -> None:
    cols, telemetry = run("gpu_fault", params={"class": cls})
    arrival = cols.ts - cols.latency_ms / 1000
    errors = cols.take(cols.is_error)
    assert set(errors.replica.tolist()) == {"r1"}
    assert set(errors.cuda_error.tolist()) <= set(CUDA_ERROR_CLASSES[cls])
    err_arrival = arrival[cols.is_error]
    assert (err_arrival >= T0 + AT).all() and (err_arrival < T0 + AT + FOR).all()
    in_window = (cols.replica == "r1") & (arrival >= T0 + AT) & (arrival < T0 + AT + FOR)
    assert 0.15 < cols.is_error[in_window].mean() < 0.35
    xids = {s.ts - T0: s.xid_last for s in telemetry if s.replica == "r1"}
    if cls == "hardware":
        assert {t for t, x in xids.items() if x == 79} == {t for t in xids if AT < t <= AT + FOR}
    else:
        assert set(xids.values()) == {None}
    assert {s.xid_last for s in telemetry if s.replica != "r1"} == {None}


def test_gpu_fault_can_send_integer_codes_and_one_exact_error() -> None:
    cols, _ = run("gpu_fault", params={"error": "cudaErrorECCUncorrectable", "codes": 1})
    assert set(cols.cuda_error[cols.is_error].tolist()) == {CUDA_ERRORS["cudaErrorECCUncorrectable"]}


def test_kv_pressure_fragmentation_mode() -> None:
    cols, telemetry = run("kv_pressure")
    for end in INSIDE:
        assert window(cols, "r1", end).kv_cache_hit_rate.mean() < 0.45  # rule: < 0.65
    for end in np.concatenate([BEFORE, AFTER]):
        assert window(cols, "r1", end).kv_cache_hit_rate.mean() > 0.7
    for s in telemetry:
        frag = s.fragmentation
        assert frag is not None
        inside = s.replica == "r1" and T0 + AT < s.ts <= T0 + AT + FOR
        assert (frag > 0.5) if inside else (frag < 0.2), (s.replica, s.ts - T0, frag)  # rule: > 0.4


def test_kv_pressure_underutilized_mode() -> None:
    cols, _ = run("kv_pressure", params={"mode": "underutilized"})
    for end in INSIDE:
        w = window(cols, "r1", end)
        assert w.kv_cache_hit_rate.mean() > 0.9  # rule: > 0.85
        assert w.completion_tokens.sum() / 60.0 < 100  # rule: < 120 tokens/s
    assert window(cols, "r0", INSIDE[0]).completion_tokens.sum() / 60.0 > 300


def test_replica_silence_reports_nothing_in_the_window() -> None:
    cols, telemetry = run("replica_silence")
    r1 = cols.ts[cols.replica == "r1"]
    assert not ((r1 >= T0 + AT) & (r1 < T0 + AT + FOR)).any()
    assert (r1 < T0 + AT).sum() > 300 and (r1 >= T0 + AT + FOR).sum() > 300
    sample_ts = {s.ts - T0 for s in telemetry if s.replica == "r1"}
    assert not {t for t in sample_ts if AT < t < AT + FOR + 5}
    assert len({s.ts for s in telemetry if s.replica == "r0"}) == int(DURATION // 5)


def test_labels_match_the_injections(tmp_path: Path) -> None:
    config = GeneratorConfig(models=("a", "b"), replicas=2, injections=(
        Injection("long_tail", "r1", 30, 60), Injection("gpu_fault", "r3", 90, 30, {"class": "hardware"})))
    expected = [
        {"replica": "r1", "kind": "long_tail", "start": T0 + 30, "end": T0 + 90, "model": "a", "params": {}},
        {"replica": "r3", "kind": "gpu_fault", "start": T0 + 90, "end": T0 + 120, "model": "b",
         "params": {"class": "hardware"}},
    ]
    assert labels(config, T0) == expected
    write_labels(tmp_path / "l.json", labels(config, T0))
    assert read_labels(tmp_path / "l.json") == expected


def test_bad_injections_are_refused_with_a_reason() -> None:
    with pytest.raises(FaultError, match="unknown fault kind"):
        Injection("meltdown", "r0", 0, 10)
    with pytest.raises(FaultError, match="unknown parameter 'sharee'"):
        Injection("long_tail", "r0", 0, 10, {"sharee": 0.1})
    with pytest.raises(FaultError, match="gpu_fault.class"):
        Injection("gpu_fault", "r0", 0, 10, {"class": "cosmic"})
    with pytest.raises(FaultError, match="expected a number"):
        Injection("long_tail", "r0", 0, 10, {"share": "lots"})
    with pytest.raises(FaultError, match="--for > 0"):
        Injection("long_tail", "r0", 0, 0)


def test_cli_pairs_repeated_inject_options() -> None:
    out = build_injections(("long_tail", "gpu_fault:share=0.5"), ("r0", "r2"), (10.0, 20.0), (30.0, 40.0),
                           ("class=hardware",))
    assert [(i.kind, i.replica, i.at_s, i.for_s) for i in out] == [("long_tail", "r0", 10, 30),
                                                                   ("gpu_fault", "r2", 20, 40)]
    assert out[0].params == {} and out[1].params == {"class": "hardware", "share": 0.5}
    with pytest.raises(click.UsageError, match="--replica once per --inject"):
        build_injections(("long_tail",), (), (), (), ())
    with pytest.raises(click.UsageError, match="no --inject kind takes it"):
        build_injections(("long_tail",), ("r0",), (), (), ("class=hardware",))


def test_generate_takes_the_demos_quoted_injection_and_the_separate_options_alike() -> None:
    def injections(*args: str) -> list[tuple[str, str, float, float, dict[str, object]]]:
        params = generate_command.make_context("generate", list(args)).params
        built = build_injections(params["inject_kinds"], params["inject_replicas"], params["inject_at"],
                                 params["inject_for"], params["inject_params"])
        return [(i.kind, i.replica, i.at_s, i.for_s, dict(i.params)) for i in built]

    separate = injections("--inject", "long_tail", "--replica", "r1", "--at", "30", "--for", "60",
                          "--inject", "gpu_fault", "--replica", "r2", "--at", "40", "--for", "50",
                          "--param", "class=hardware")
    assert separate == [("long_tail", "r1", 30, 60, {}), ("gpu_fault", "r2", 40, 50, {"class": "hardware"})]
    assert injections("--inject", "long_tail --replica r1 --at 30 --for 60",
                      "--inject=gpu_fault --replica r2 --at 40 --for 50 --param class=hardware") == separate
    assert injections("--inject", "long_tail --replica r1 --at 30 --for 60",  # the two forms mixed
                      "--inject", "gpu_fault", "--replica", "r2", "--at", "40", "--for", "50",
                      "--param", "class=hardware") == separate


def test_ttft_drift_ramps_ttft_to_factor_and_leaves_decode_alone() -> None:
    """The generator: TTFT x1 at the fault's start, x2 from ramp_s on; decode time unchanged."""
    cols, _ = run("ttft_drift", params={"factor": 2.0, "ramp_s": 60.0})
    clean = window(cols, "r0", T0 + AT + FOR)
    late = window(cols, "r1", T0 + AT + FOR)  # the fault's last minute: the ramp is over
    before = window(cols, "r1", T0 + AT)
    ratio = float(np.median(late.ttft_ms) / np.median(before.ttft_ms))
    assert 1.7 < ratio < 2.4
    assert 0.8 < float(np.median(clean.ttft_ms) / np.median(before.ttft_ms)) < 1.25
    decode = float(np.median(late.latency_ms - late.ttft_ms) / np.median(before.latency_ms - before.ttft_ms))
    assert 0.75 < decode < 1.35
    for end in AFTER:
        w = window(cols, "r1", end)
        assert float(np.median(w.ttft_ms) / np.median(before.ttft_ms)) < 1.3


def test_throughput_drop_cuts_tokens_per_s_and_keeps_latency() -> None:
    cols, _ = run("throughput_drop", params={"drop": 0.4})
    for end in INSIDE:
        w, before = window(cols, "r1", end), window(cols, "r1", T0 + AT)
        tokens = (w.completion_tokens.sum() / len(w)) / (before.completion_tokens.sum() / len(before))
        assert 0.45 < tokens < 0.75  # 40 % fewer tokens per request: tokens/s at the same rate
        assert 0.75 < float(np.median(w.latency_ms) / np.median(before.latency_ms)) < 1.3


@pytest.mark.parametrize("bad", [{"drop": 1.0}, {"drop": -0.1}])
def test_throughput_drop_needs_a_drop_in_0_1(bad: dict[str, float]) -> None:
    with pytest.raises(FaultError, match="throughput_drop"):
        Injection("throughput_drop", "r1", 0, 10, bad)
