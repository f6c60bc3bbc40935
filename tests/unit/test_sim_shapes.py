"""Traffic shapes and relative faults: the Mooncake trace, rate scaling, faults that mean the same on every
trace, the quiet and low-rate pools, and the engines' live latency signals."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from skewwatch.collect.histogram import TPOT_BUCKETS_S, histogram_quantile
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry import decode_telemetry, encode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import Injection
from skewwatch.sim.fleet import LIVE_ENGINE_FIELDS, FleetConfig, FleetSimulator
from skewwatch.sim.generator import GeneratorConfig, generate_chunks
from skewwatch.sim.shapes import BASE_LOAD, SHAPES, make_shape
from skewwatch.sim.trace import ColumnMapping, TraceError, load_trace, read_trace

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0


def run(config: FleetConfig, duration: float) -> tuple[FleetSimulator, RequestColumns, list[TelemetrySample]]:
    sim = FleetSimulator(config, T0, duration)
    chunks = list(sim.chunks())
    return sim, RequestColumns.concat([c.requests for c in chunks]), [s for c in chunks for s in c.telemetry]


def arrivals(cols: RequestColumns) -> np.ndarray:
    return np.asarray(cols.ts - cols.latency_ms / 1000.0)


# ------------------------------------------------------------------ the Mooncake trace


def test_mooncake_trace_loads_with_its_own_columns_in_milliseconds() -> None:
    t = load_trace("mooncake")
    assert len(t) == 3993 and t.source == "mooncake"  # as SOURCE.md states
    assert 1000 < t.duration_s < 1050  # ~1,022 s: timestamp_ms read as milliseconds
    assert 3.5 < t.mean_rate < 4.2
    assert 15_000 < t.prompt_tokens.mean() < 15_700 and np.median(t.prompt_tokens) == 11_587
    assert 140 < t.completion_tokens.mean() < 160
    assert t.offset_s[0] == 0.0 and np.all(np.diff(t.offset_s) >= 0)
    assert t.prompt_quantile(0.9) == pytest.approx(38_611, rel=1e-3)


def test_bundled_traces_are_inside_the_package_with_their_licences() -> None:
    data = REPO / "skewwatch" / "data"
    source = (data / "SOURCE.md").read_text(encoding="utf-8")
    assert "MooncakeTrace_synthetic.csv" in source and "Apache License" in source and "FAST 2025" in source
    assert "Apache License" in (data / "LICENSE-Apache-2.0.txt").read_text(encoding="utf-8")
    assert (data / "MooncakeTrace_synthetic.csv").stat().st_size > 50_000


def test_timestamp_units_in_a_column_mapping() -> None:
    text = "t,p,c\n0,10,1\n1500,20,2\n3000,30,3\n"
    assert read_trace(text, ColumnMapping(ts="t", prompt="p", completion="c", ts_unit="ms")).duration_s == 3.0
    assert read_trace(text, ColumnMapping.parse("ts=t,prompt=p,completion=c")).duration_s == 3000.0
    with pytest.raises(TraceError, match="ts_unit 'h'"):
        ColumnMapping.parse("ts=t,ts_unit=h")


# ------------------------------------------------------------------ shapes and rates


def test_shapes_scale_the_rate_per_replica_and_keep_the_lengths() -> None:
    for trace in ("conv", "code", "mooncake"):
        one, low, high = (SHAPES[f"{trace}@{k}x"] for k in ("1", "0.1", "3"))
        assert one.rate_per_replica == pytest.approx(BASE_LOAD * one.capacity_rps)
        assert low.rate_per_replica == pytest.approx(0.1 * one.rate_per_replica)
        assert high.rate_per_replica == pytest.approx(3 * one.rate_per_replica) and high.load == pytest.approx(0.75)
        assert one.trace is high.trace  # the same lengths: one bundled trace
    assert SHAPES["mooncake@1x"].engine["kv_capacity_tokens"] >= load_trace("mooncake").prompt_tokens.max() + 1000
    assert SHAPES["conv@1x"].engine == {}
    with pytest.raises(ValueError, match="unknown trace"):
        make_shape("azure@1x")
    with pytest.raises(ValueError, match="scale"):
        make_shape("conv@fast")


@pytest.mark.parametrize("name", ["conv@0.1x", "conv@3x", "mooncake@1x", "mooncake@3x"])
def test_per_model_rates_are_what_each_pool_receives(name: str) -> None:
    shape = SHAPES[name]
    rate = shape.rate_per_replica
    duration = max(600.0, 400.0 / (4 * rate))
    config = shape.fleet_config(models=("a", "b"), replicas=4, model_rates=(4 * rate, 4 * 0.06), seed=3)
    _, cols, _ = run(config, duration)
    got = {m: float((arrivals(cols)[cols.model == m] < T0 + duration).sum()) / (4 * duration) for m in ("a", "b")}
    assert got["a"] == pytest.approx(rate, rel=0.25)  # trace arrivals are bursty: a tolerance, not a tie
    assert got["b"] == pytest.approx(0.06, rel=0.4)


def test_clean_pools_at_3x_do_not_run_away() -> None:
    # load 0.75: the queue empties again (conv, mooncake); the bursty code trace is checked by the benchmark
    for name in ("conv@3x", "mooncake@3x"):
        shape = SHAPES[name]
        config = shape.fleet_config(models=("m",), replicas=4, model_rates=(4 * shape.rate_per_replica,), seed=1)
        sim, _, telemetry = run(config, 600)
        queue = np.array([s.queue_length for s in telemetry if s.ts <= T0 + 600 and s.queue_length is not None])
        assert (queue == 0).mean() > 0.5 and queue[-40:].mean() < 5, name
        assert sim.stats()["failed"] == 0


# ------------------------------------------------------------------ relative faults


@pytest.mark.parametrize("trace", ["conv", "mooncake"])
def test_context_burst_is_k_times_the_traces_p90_prompt(trace: str) -> None:
    shape = SHAPES[f"{trace}@1x"]
    inj = Injection("context_burst", "r1", 60, 600)
    config = shape.fleet_config(replicas=3, model_rates=(3 * shape.rate_per_replica * 3,), seed=2, injections=(inj,))
    _, cols, _ = run(config, 700)
    p90 = load_trace(trace).prompt_quantile(0.9)
    arrived = arrivals(cols)
    burst = cols.prompt_tokens[(cols.replica == "r1") & (arrived >= T0 + 60) & (arrived < T0 + 660)]
    others = cols.prompt_tokens[cols.replica != "r1"]
    assert len(burst) > 30
    assert np.mean(burst) == pytest.approx(4.0 * p90, rel=0.2)  # factor 4 x P90, whatever the trace
    assert burst.max() <= 8.0 * p90  # capped at twice the burst's mean
    assert np.mean(others) < p90  # the other replicas keep the trace's own lengths
    assert Injection("context_burst", "r0", 0, 1, {"mean_tokens": 5000}).burst_mean_tokens(p90) == 5000.0


def test_long_tail_stalls_by_k_times_the_replicas_own_median() -> None:
    for trace in ("conv", "mooncake"):
        shape = SHAPES[f"{trace}@1x"]
        latency = {}
        for injections in ((), (Injection("long_tail", "r1", 120, 600, {"share": 0.3}),)):
            config = shape.fleet_config(replicas=2, model_rates=(2 * 0.5 * shape.capacity_rps,), seed=4,
                                        injections=injections)
            _, cols, _ = run(config, 720)
            mine = (cols.replica == "r1") & (arrivals(cols) >= T0 + 120) & (arrivals(cols) < T0 + 720)
            latency[bool(injections)] = dict(zip(cols.request_id[mine].tolist(), cols.latency_ms[mine].tolist(),
                                                 strict=True))
        # a stall does not hold the engine: every request runs as in the clean run, a share finishes later
        clean, faulty = latency[False], latency[True]
        assert clean.keys() == faulty.keys() and len(clean) > 100
        median = float(np.median(list(clean.values())))
        extra = np.array([faulty[k] - clean[k] for k in clean]) / median
        stalled = extra[extra > 1e-6]
        assert 0.22 < len(stalled) / len(extra) < 0.38, trace  # share 0.3
        # (k - 1) x the replica's own median, k in 5..10: relative on conv (seconds) and mooncake alike
        assert 3.0 < float(np.median(stalled)) < 9.0 and stalled.min() > 2.0, (trace, np.median(stalled))


def test_slow_replica_is_k_times_its_own_decode() -> None:
    shape = SHAPES["mooncake@1x"]
    inj = Injection("slow_replica", "r1", 60, 540, {"factor": 3.0})
    config = shape.fleet_config(replicas=2, model_rates=(2 * shape.rate_per_replica,), seed=5, injections=(inj,))
    _, _, telemetry = run(config, 600)
    tpot = {r: [s.tpot_mean_s for s in telemetry if s.replica == r and T0 + 120 <= s.ts <= T0 + 600
                and s.tpot_mean_s is not None] for r in ("r0", "r1")}
    ratio = float(np.median(tpot["r1"])) / float(np.median(tpot["r0"]))
    assert 2.4 < ratio < 3.6  # its time per output token, against its healthy peer's


def test_generator_context_burst_is_relative_too() -> None:
    for trace in ("conv", "code"):
        config = GeneratorConfig(replicas=2, rate=5.0, seed=1, trace=load_trace(trace),
                                 injections=(Injection("context_burst", "r1", 10, 60),))
        cols = RequestColumns.concat([c.requests for c in generate_chunks(config, T0, 80)])
        burst = cols.prompt_tokens[(cols.replica == "r1") & (cols.ts >= T0 + 12) & (cols.ts < T0 + 70)]
        assert np.mean(burst) == pytest.approx(4.0 * load_trace(trace).prompt_quantile(0.9), rel=0.2)


# ------------------------------------------------------------------ quiet and low-rate pools


def test_quiet_pool_receives_nothing_while_other_models_go_on_and_its_engines_stay_alive() -> None:
    inj = Injection("quiet_pool", "q", 60, 180)
    config = FleetConfig(models=("q", "other"), replicas=3, model_rates=(3.0, 3.0), seed=6, injections=(inj,))
    sim, cols, telemetry = run(config, 300)
    arrived = arrivals(cols)
    quiet = cols.model == "q"
    assert not ((arrived >= T0 + 60) & (arrived < T0 + 240) & quiet).any()
    assert ((arrived >= T0 + 60) & (arrived < T0 + 240) & ~quiet).sum() > 300  # event time keeps moving
    assert (quiet & (arrived >= T0 + 240)).sum() > 50 and (quiet & (arrived < T0 + 60)).sum() > 50
    assert sim.quiet_dropped > 300
    idle = [s for s in telemetry if s.replica in ("r0", "r1", "r2") and T0 + 120 <= s.ts <= T0 + 240]
    assert len(idle) == 3 * 25 and all(s.running_requests == 0 and s.queue_length == 0 for s in idle)
    silent = FleetConfig(models=("q", "other"), replicas=3, model_rates=(3.0, 3.0), seed=6,
                         injections=(Injection("quiet_pool", "r1", 60, 180, {"telemetry": 0}),))
    _, _, tel = run(silent, 300)
    assert not [s for s in tel if s.replica in ("r0", "r1", "r2") and T0 + 65 <= s.ts <= T0 + 240]
    assert inj.label(T0) == {"replica": None, "kind": "quiet_pool", "start": T0 + 60, "end": T0 + 240,
                             "model": "q", "params": {}}


def test_generator_realises_the_quiet_pool() -> None:
    config = GeneratorConfig(models=("q", "o"), replicas=2, rate=4.0, seed=2,
                             injections=(Injection("quiet_pool", "q", 30, 60),))
    chunks = list(generate_chunks(config, T0, 120))
    cols = RequestColumns.concat([c.requests for c in chunks])
    arrived = arrivals(cols)
    assert not ((cols.model == "q") & (arrived >= T0 + 30) & (arrived < T0 + 90)).any()
    assert ((cols.model == "o") & (arrived >= T0 + 30) & (arrived < T0 + 90)).sum() > 300
    idle = [s for c in chunks for s in c.telemetry if s.replica in ("r0", "r1") and T0 + 40 <= s.ts <= T0 + 85]
    assert idle and all(s.running_requests == 0 for s in idle)


def test_injections_name_existing_replicas_or_for_a_pool_fault_a_model() -> None:
    with pytest.raises(ValueError, match="no replica 'q'"):
        FleetConfig(models=("q",), replicas=2, injections=(Injection("long_tail", "q", 0, 10),))
    with pytest.raises(ValueError, match="no model or replica 'x'"):
        FleetConfig(models=("q",), replicas=2, injections=(Injection("quiet_pool", "x", 0, 10),))
    FleetConfig(models=("q",), replicas=2, injections=(Injection("quiet_pool", "r1", 0, 10),))  # a replica of it


def test_low_rate_pool_ground_truth() -> None:
    sys.path.insert(0, str(REPO))
    from bench.scenarios import LOW_RATE, LOW_RATE_POOL, Scenario

    sc = Scenario(SHAPES["conv@1x"], seed=1)
    labels = sc.labels()
    assert not [lb for lb in labels if lb["model"] in sc.clean_pools()]  # clean: no label at all
    assert LOW_RATE_POOL in sc.clean_pools() and LOW_RATE <= 0.1
    config = sc.fleet_config()
    rates = dict(zip(config.models, config.model_rates or (), strict=True))
    assert rates[LOW_RATE_POOL] == pytest.approx(4 * LOW_RATE)


# ------------------------------------------------------------------ live engine signals


def test_live_signals_are_contract_fields_and_can_be_left_out() -> None:
    config = FleetConfig(replicas=2, load=0.5, seed=7)
    _, _, telemetry = run(config, 60)
    busy = [s for s in telemetry if s.tpot_count]
    assert busy and all(s.tpot_mean_s and s.tpot_p50_s and s.tpot_p99_s for s in busy)
    assert all(s.tpot_p50_s <= s.tpot_p99_s and 0.01 < s.tpot_mean_s < 1.0 for s in busy)
    assert any(s.ttft_count for s in telemetry)
    for s in telemetry:
        assert decode_telemetry(encode_telemetry(s)) == s  # every field passes the contract's decoder
    off = FleetConfig(replicas=2, load=0.5, seed=7, live_signals=False)
    _, _, quiet = run(off, 60)
    assert all(getattr(s, name) is None for s in quiet for name in LIVE_ENGINE_FIELDS)
    assert all(s.utilization_gpu is not None and s.memory_used_bytes for s in quiet)  # GPU fields stay


def test_a_slow_replica_shows_in_the_next_sample_not_when_its_requests_finish() -> None:
    config = FleetConfig(replicas=2, load=0.5, seed=8, injections=(Injection("slow_replica", "r1", 60, 120),))
    _, cols, telemetry = run(config, 180)
    tpot = {s.ts - T0: s.tpot_mean_s for s in telemetry if s.replica == "r1" and s.tpot_mean_s}
    healthy = float(np.median([v for t, v in tpot.items() if t <= 60]))
    assert tpot[65.0] > 2.0 * healthy  # within the first 5 s interval of the fault
    # while the 60 s window of finished requests has hardly any request that arrived in the fault
    window = (cols.replica == "r1") & (cols.ts >= T0 + 5) & (cols.ts < T0 + 65)
    assert (arrivals(cols)[window] >= T0 + 60).mean() < 0.1


def test_histogram_quantile_reads_bucket_deltas_as_prometheus_does() -> None:
    counts = [0] * (len(TPOT_BUCKETS_S) + 1)
    counts[TPOT_BUCKETS_S.index(0.05)] = 50  # (0.025, 0.05]
    counts[TPOT_BUCKETS_S.index(0.1)] = 50  # (0.075, 0.1]
    assert histogram_quantile(TPOT_BUCKETS_S, counts, 0.5) == pytest.approx(0.05)
    assert histogram_quantile(TPOT_BUCKETS_S, counts, 0.75) == pytest.approx(0.0875)
    assert math.isclose(histogram_quantile(TPOT_BUCKETS_S, counts, 1.0) or 0, 0.1)
