"""The statistical generator: contract-valid events, determinism, Poisson rate, clean traffic stays clean."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from skewwatch.schemas.requests import REQUIRED_FIELDS, check_request_event
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import Injection
from skewwatch.sim.generator import (
    GeneratorConfig,
    event_rows,
    generate_chunks,
    generate_events,
    generate_telemetry,
    replica_ids,
)
from skewwatch.sim.trace import read_trace

T0 = 1_700_000_000.0


def run(config: GeneratorConfig, duration: float = 120.0) -> list[dict[str, Any]]:
    return list(generate_events(config, T0, duration))


def columns(config: GeneratorConfig, duration: float) -> RequestColumns:
    return RequestColumns.concat([c.requests for c in generate_chunks(config, T0, duration)])


def test_same_seed_same_events_other_seed_other_events() -> None:
    a = run(GeneratorConfig(seed=7), 60)
    assert a == run(GeneratorConfig(seed=7), 60)
    b = run(GeneratorConfig(seed=8), 60)
    assert [e["latency_ms"] for e in a[:50]] != [e["latency_ms"] for e in b[:50]]


def test_events_follow_contract_v1() -> None:
    events = run(GeneratorConfig(replicas=3, error_rate=0.05, seed=1), 60)
    assert len(events) > 500
    for e in events:
        assert check_request_event(e) is None, e
        assert set(REQUIRED_FIELDS) <= set(e)
        assert 1 <= e["batch_size"] <= e["batch_capacity"]
        assert 0.0 <= e["kv_cache_hit_rate"] <= 1.0
        assert 0.0 < e["ttft_ms"] < e["latency_ms"]
        assert e["status"] in ("ok", "error")
        assert "cuda_error" not in e  # plain errors carry no CUDA error; gpu_fault adds those
        assert e["ts"] >= T0
    assert 0.02 < np.mean([e["status"] == "error" for e in events]) < 0.09
    assert len({e["request_id"] for e in events}) == len(events)


def test_events_come_in_nondecreasing_event_time() -> None:
    ts = [e["ts"] for e in run(GeneratorConfig(replicas=4, seed=2), 120)]
    assert all(a <= b for a, b in zip(ts, ts[1:], strict=False))


def test_poisson_rate_per_replica_within_tolerance() -> None:
    cols = columns(GeneratorConfig(replicas=4, rate=5.0, seed=3), 600)
    for _, replica in replica_ids(GeneratorConfig(replicas=4)):
        n = int((cols.replica == replica).sum())
        # Poisson(3000): sd ~ 55, so 4 sd ~ 220
        assert abs(n - 3000) < 220, (replica, n)
    gaps = np.diff(np.sort(cols.ts[cols.replica == "r0"] - cols.latency_ms[cols.replica == "r0"] / 1000))
    # exponential inter-arrivals: coefficient of variation ~ 1
    assert 0.9 < gaps.std() / gaps.mean() < 1.1


def test_token_lengths_are_rows_of_the_trace() -> None:
    trace = read_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,7\n1,2000,300\n2,50,40\n")
    events = run(GeneratorConfig(trace=trace, seed=4), 30)
    pairs = {(e["prompt_tokens"], e["completion_tokens"]) for e in events}
    assert pairs == {(100, 7), (2000, 300), (50, 40)}


def test_clean_replicas_stay_inside_every_detector_rule() -> None:
    cols = columns(GeneratorConfig(replicas=4, seed=5), 600)
    for replica in ("r0", "r1", "r2", "r3"):
        for end in np.arange(T0 + 60, T0 + 600, 5.0):
            w = (cols.replica == replica) & (cols.ts >= end - 60) & (cols.ts < end)
            lat = cols.latency_ms[w]
            assert np.percentile(lat, 99) < 2.5 * np.percentile(lat, 50)  # long_tail: > 3
            assert cols.batch_fill[w].mean() > 0.4  # batch_collapse: fill < 0.3
            assert 0.7 < cols.kv_cache_hit_rate[w].mean() < 0.8  # kv_pressure: < 0.65 or > 0.85
            assert not cols.is_error[w].any()
    assert 700 < float(np.median(cols.latency_ms)) < 900  # the configured ~800 ms median


def test_shorter_run_is_a_prefix_and_faults_elsewhere_change_nothing() -> None:
    base = GeneratorConfig(replicas=3, seed=6)
    long_run = {e["request_id"]: e for e in run(base, 60)}
    short = run(base, 30)
    assert short and all(long_run[e["request_id"]] == e for e in short)
    faulty = GeneratorConfig(replicas=3, seed=6, injections=(Injection("long_tail", "r2", 10, 30),))
    others = [e for e in run(faulty, 60) if e["replica"] != "r2"]
    assert others == [e for e in long_run.values() if e["replica"] != "r2"]


def test_two_models_split_replicas() -> None:
    cfg = GeneratorConfig(models=("a", "b"), replicas=2, seed=1)
    assert replica_ids(cfg) == [("a", "r0"), ("a", "r1"), ("b", "r2"), ("b", "r3")]
    seen = {(e["model"], e["replica"]) for e in run(cfg, 20)}
    assert seen == set(replica_ids(cfg))


def test_telemetry_one_sample_per_replica_every_5s() -> None:
    cfg = GeneratorConfig(replicas=2, seed=1)
    samples = list(generate_telemetry(cfg, T0, 60))
    assert len(samples) == 2 * 12
    assert sorted({s.ts for s in samples}) == [T0 + 5 * k for k in range(1, 13)]
    for s in samples:
        assert s.source == "simulated"
        assert s.memory_used_bytes is not None and s.memory_total_bytes is not None
        assert 0 < s.memory_used_bytes <= s.memory_total_bytes
        assert s.utilization_gpu is not None and 0 <= s.utilization_gpu <= 1
        assert s.fragmentation is not None and s.fragmentation < 0.2
        assert s.xid_last is None
        assert TelemetrySample.from_dict(s.to_dict()) == s
        assert orjson.loads(orjson.dumps(s.to_dict())) == s.to_dict()  # plain Python values, no numpy
    assert not list(generate_telemetry(GeneratorConfig(telemetry=False), T0, 20))


def test_chunks_end_every_5s_and_hold_only_finished_requests() -> None:
    chunks = list(generate_chunks(GeneratorConfig(seed=1), T0, 30))
    assert [c.end_ts for c in chunks] == [T0 + 5 * k for k in range(1, 7)]
    for c in chunks[:-1]:
        assert (c.requests.ts < c.end_ts).all()
    assert len(event_rows(chunks[0].requests)) == len(chunks[0].requests)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="no replica"):
        GeneratorConfig(replicas=2, injections=(Injection("long_tail", "r9", 0, 10),))
    with pytest.raises(ValueError):
        GeneratorConfig(models=("a", "a"))
    with pytest.raises(ValueError):
        list(generate_events(GeneratorConfig(), T0, 0))
