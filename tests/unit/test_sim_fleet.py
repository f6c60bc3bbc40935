"""The fleet simulator: invariants (conservation, batch and KV bounds, determinism), faults, routing, closed loop."""

from __future__ import annotations

import numpy as np
import pytest

from skewwatch.schemas.requests import check_request_event
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.faults import Injection
from skewwatch.sim.fleet import FleetConfig, FleetSimulator, replica_capacity_rps
from skewwatch.sim.generator import event_rows, replica_ids
from skewwatch.sim.loop import LocalWeightsLoop
from skewwatch.sim.router import DynamicWeightRouter, LeastConnectionsRouter, RoundRobinRouter
from skewwatch.sim.trace import load_trace

T0 = 1_700_000_000.0


def simulate(config: FleetConfig, duration: float = 120.0, loop: LocalWeightsLoop | None = None
             ) -> tuple[FleetSimulator, RequestColumns, list[TelemetrySample]]:
    sim = FleetSimulator(config, T0, duration, on_step=loop)
    chunks = list(sim.chunks())
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b.end_ts == a.end_ts + 5.0
        assert len(a.requests) == 0 or a.requests.ts.max() < a.end_ts
    return (sim, RequestColumns.concat([c.requests for c in chunks]), [s for c in chunks for s in c.telemetry])


@pytest.mark.parametrize("policy", ["round_robin", "least_connections"])
@pytest.mark.parametrize("load", [0.5, 1.3])
def test_every_arrival_finishes_or_fails_exactly_once(policy: str, load: float) -> None:
    sim, cols, _ = simulate(FleetConfig(replicas=3, load=load, policy=policy, seed=1,
                                        kv_capacity_tokens=30_000, drain_s=30.0), 120)
    s = sim.stats()
    assert s["arrivals"] > 400
    assert s["arrivals"] == s["finished"] + s["failed"] and s["in_flight"] == 0
    assert len(cols) == s["arrivals"]  # every one reported once (no silence injected)
    assert len(set(cols.request_id.tolist())) == len(cols)
    if load > 1:
        assert s["failed"] > 0  # overload: the drain limit fails what is left, still counted once


def test_batch_and_kv_never_exceed_capacity() -> None:
    config = FleetConfig(replicas=2, load=1.2, seed=2, max_batch=16, kv_capacity_tokens=20_000,
                         injections=(Injection("context_burst", "r0", 20, 60),))
    sim, cols, telemetry = simulate(config, 120)
    assert cols.batch_size.max() <= 16 and (cols.batch_capacity == 16).all()
    for per in sim.stats()["replicas"].values():
        assert per["max_running"] <= 16 and per["max_kv_tokens"] <= 20_000
    assert max(s.kv_cache_usage or 0.0 for s in telemetry) <= 1.0
    assert cols.batch_size.max() == 16  # the bound is reached, so the check above means something


def test_events_are_contract_v1_and_in_event_time_order() -> None:
    _, cols, telemetry = simulate(FleetConfig(replicas=2, load=0.7, seed=3), 60)
    rows = event_rows(cols)
    assert rows and all(check_request_event(e) is None for e in rows)
    assert all(a["ts"] <= b["ts"] for a, b in zip(rows, rows[1:], strict=False))
    assert all(0 < e["ttft_ms"] <= e["latency_ms"] for e in rows)
    assert all(s.source == "simulated" and s.memory_used_bytes <= s.memory_total_bytes for s in telemetry
               if s.memory_used_bytes is not None and s.memory_total_bytes is not None)
    assert len(telemetry) % 2 == 0 and len(telemetry) >= 2 * 12  # per replica every 5 s, drain included
    assert sorted({s.ts for s in telemetry})[:12] == [T0 + 5 * k for k in range(1, 13)]


def test_same_seed_same_run() -> None:
    config = FleetConfig(replicas=3, load=0.8, policy="least_connections", seed=4)
    a, b = simulate(config, 60)[1], simulate(config, 60)[1]
    assert event_rows(a) == event_rows(b)
    c = simulate(FleetConfig(replicas=3, load=0.8, policy="least_connections", seed=5), 60)[1]
    assert event_rows(a) != event_rows(c)


def test_load_scales_the_trace_to_the_fleet_capacity() -> None:
    config = FleetConfig(replicas=4, load=0.5, seed=6)
    sim, cols, _ = simulate(config, 300)
    expected = 0.5 * 4 * replica_capacity_rps(config, load_trace("conv"))
    assert sim.rate == pytest.approx(expected)
    assert 0.75 * expected < len(cols) / 300 < 1.25 * expected  # the trace itself is bursty


def test_slow_replica_slows_only_its_replica_and_least_connections_avoids_it() -> None:
    inj = (Injection("slow_replica", "r1", 30, 200),)
    shares = {}
    for policy in ("round_robin", "least_connections"):
        _, cols, _ = simulate(FleetConfig(replicas=3, load=0.6, policy=policy, seed=7, injections=inj), 240)
        arrival = cols.ts - cols.latency_ms / 1000
        during = (arrival >= T0 + 60) & (arrival < T0 + 230)
        lat = {r: float(np.median(cols.latency_ms[during & (cols.replica == r)])) for r in ("r0", "r1", "r2")}
        if policy == "round_robin":
            assert lat["r1"] > 1.8 * max(lat["r0"], lat["r2"])
        shares[policy] = float(np.mean(cols.replica[during] == "r1"))
    assert shares["round_robin"] == pytest.approx(1 / 3, abs=0.01)
    assert shares["least_connections"] < 0.28


def test_faults_show_on_their_replica_and_window_only() -> None:
    injections = (Injection("gpu_fault", "r0", 20, 40, {"class": "hardware"}),
                  Injection("replica_silence", "r1", 30, 30),
                  Injection("kv_pressure", "r2", 20, 60))
    _, cols, telemetry = simulate(FleetConfig(replicas=3, load=0.6, seed=8, injections=injections), 120)
    errors = cols.take(cols.is_error)
    assert len(errors) > 5 and set(errors.replica.tolist()) == {"r0"}
    assert ((errors.ts >= T0 + 20) & (errors.ts < T0 + 60)).all()
    r1 = cols.ts[cols.replica == "r1"]
    assert not ((r1 >= T0 + 30) & (r1 < T0 + 60)).any() and (r1 >= T0 + 60).any()
    assert not [s for s in telemetry if s.replica == "r1" and T0 + 30 < s.ts < T0 + 65]
    assert {s.ts - T0 for s in telemetry if s.xid_last == 79} == {25, 30, 35, 40, 45, 50, 55, 60}
    hit = cols.kv_cache_hit_rate[(cols.replica == "r2") & (cols.ts >= T0 + 30) & (cols.ts < T0 + 80)]
    assert hit.mean() < 0.45
    frag = [s.fragmentation for s in telemetry if s.replica == "r2" and T0 + 25 <= s.ts <= T0 + 80]
    assert frag and min(f for f in frag if f is not None) > 0.5


def test_routers() -> None:
    rr = RoundRobinRouter()
    assert [rr.choose("m", ["a", "b", "c"], [0, 0, 0], 0.0) for _ in range(4)] == [0, 1, 2, 0]
    lc = LeastConnectionsRouter()
    assert [lc.choose("m", ["a", "b", "c"], [1, 1, 1], 0.0) for _ in range(3)] == [0, 1, 2]  # ties rotate
    dyn = DynamicWeightRouter()
    assert dyn.choose("m", ["a", "b"], [3, 1], 0.0) == 1 and dyn.fallbacks == 1  # no weights yet
    dyn.apply_correction({"model": "m", "weights": {"a": 0.2, "b": 0.8}, "actions": []}, 0.0)
    picks = [dyn.choose("m", ["a", "b"], [0, 0], 1.0) for _ in range(100)]
    assert picks.count(0) == 20
    dyn.apply_correction({"model": "m", "weights": {"a": 0.5, "b": 0.5},
                          "actions": [{"replica": "b", "action": "drain", "expires_at": 10.0}]}, 2.0)
    assert {dyn.choose("m", ["a", "b"], [0, 0], 5.0) for _ in range(10)} == {0}
    assert {dyn.choose("m", ["a", "b"], [0, 0], 11.0) for _ in range(10)} == {0, 1}  # the drain expired


def test_closed_loop_moves_traffic_off_the_faulty_replica_under_dynamic_only() -> None:
    inj = (Injection("slow_replica", "r1", 30, 400, {"factor": 4.0}),)
    share = {}
    for policy in ("round_robin", "dynamic"):
        loop = LocalWeightsLoop() if policy == "dynamic" else None
        sim, cols, _ = simulate(FleetConfig(replicas=4, load=0.6, policy=policy, seed=9, injections=inj), 300, loop)
        arrival = cols.ts - cols.latency_ms / 1000
        late = (arrival >= T0 + 150) & (arrival < T0 + 300)
        share[policy] = float(np.mean(cols.replica[late] == "r1"))
        if loop is not None:
            during = [c["weights"]["r1"] for c in loop.corrections if T0 + 150 <= c["ts"] < T0 + 300]
            assert during and max(during) < 0.2  # below its peers' 0.25 share
    assert share["round_robin"] == pytest.approx(0.25, abs=0.01)
    assert share["dynamic"] < 0.8 * share["round_robin"]


def test_two_models_have_separate_pools() -> None:
    config = FleetConfig(models=("a", "b"), replicas=2, load=0.5, seed=10)
    _, cols, _ = simulate(config, 60)
    assert set(zip(cols.model.tolist(), cols.replica.tolist(), strict=True)) == set(replica_ids(config))


def test_bad_fleet_config_is_refused() -> None:
    with pytest.raises(ValueError, match="routing policy"):
        FleetConfig(policy="random")
    with pytest.raises(ValueError, match="no replica"):
        FleetConfig(replicas=2, injections=(Injection("slow_replica", "r7", 0, 10),))
    with pytest.raises(ValueError, match="policy 'dynamic'"):
        FleetSimulator(FleetConfig(), T0, 10).apply_correction({"model": "m", "weights": {}}, T0)


def test_batch_collapse_holds_the_running_batch_at_1_2_while_the_queue_grows() -> None:
    """The stuck scheduler only stops admissions, so its limit must last long enough (phase_s) for
    the batch to drain to 1-2; drawn per iteration, the batch would sit near max_batch instead."""
    config = FleetConfig(replicas=2, load=0.6, seed=5, injections=(Injection("batch_collapse", "r0", 60, 90),))
    _, cols, telemetry = simulate(config, 180)
    during = [s for s in telemetry if s.replica == "r0" and T0 + 90 <= s.ts <= T0 + 150]
    before = [s for s in telemetry if s.replica == "r0" and T0 + 20 <= s.ts < T0 + 60]
    assert max(s.queue_length or 0 for s in before) <= 2
    assert sum((s.running_requests or 0) <= 2 for s in during) >= len(during) / 2  # stuck in most phases
    queue = [s.queue_length or 0 for s in during]
    assert queue[-1] > queue[0] + 20 and queue[-1] > 40  # the queue grows
    admitted = cols.batch_size[(cols.replica == "r0") & (cols.ts >= T0 + 120) & (cols.ts < T0 + 150)]
    assert np.median(admitted) <= 2
    other = [s for s in telemetry if s.replica == "r1" and T0 + 90 <= s.ts <= T0 + 150]
    assert max(s.queue_length or 0 for s in other) < 8  # only the faulty replica


def test_learned_faults_in_the_fleet_simulator() -> None:
    """ttft_drift: TTFT twice the replica's own by the ramp's end, others unchanged; throughput_drop:
    tokens/s down by the drop while latency stays with the pool's."""
    from skewwatch.sim.faults import Injection

    start = 1_700_000_000.0
    config = FleetConfig(replicas=4, load=0.5, seed=3, policy="round_robin",
                         injections=(Injection("ttft_drift", "r1", 300, 600, {"ramp_s": 300.0}),
                                     Injection("throughput_drop", "r2", 300, 600)))
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    for chunk in FleetSimulator(config, start, 900).chunks():
        c = chunk.requests
        for r, ts, ttft, lat, tok in zip(c.replica.tolist(), c.ts.tolist(), c.ttft_ms.tolist(),
                                         c.latency_ms.tolist(), c.completion_tokens.tolist(), strict=True):
            rows.setdefault(r, []).append((ts - start, ttft, lat, tok))

    def stat(replica: str, lo: float, hi: float, column: int) -> float:
        values = np.array([row[column] for row in rows[replica] if lo <= row[0] < hi])
        return float(values.sum() / (hi - lo)) if column == 3 else float(np.median(values))

    assert 1.6 < stat("r1", 700, 900, 1) / stat("r1", 0, 300, 1) < 2.6  # TTFT
    assert 0.7 < stat("r0", 700, 900, 1) / stat("r0", 0, 300, 1) < 1.4
    assert 0.45 < stat("r2", 400, 900, 3) / stat("r2", 0, 300, 3) < 0.75  # tokens per second
    assert 0.7 < stat("r2", 400, 900, 2) / stat("r3", 400, 900, 2) < 1.4  # latency like a healthy peer's
