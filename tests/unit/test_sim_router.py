"""The simulator's routers: weighted least request (``dynamic_least_request``) beside smooth WRR (``dynamic``)."""

from __future__ import annotations

import numpy as np
import pytest

from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.sim.faults import Injection
from skewwatch.sim.fleet import FleetConfig, FleetSimulator
from skewwatch.sim.loop import LocalWeightsLoop
from skewwatch.sim.router import (
    CORRECTION_POLICIES,
    POLICIES,
    DynamicWeightRouter,
    WeightedLeastRequestRouter,
    make_router,
)

T0 = 1_700_000_000.0


def correction(weights: dict[str, float], actions: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {"model": "m", "weights": weights, "actions": actions or []}


def test_every_policy_has_a_router_and_the_closed_loop_ones_take_corrections() -> None:
    assert set(CORRECTION_POLICIES) <= set(POLICIES)
    for policy in POLICIES:
        assert isinstance(make_router(policy), DynamicWeightRouter) == (policy in CORRECTION_POLICIES)
    assert type(make_router("dynamic_least_request")) is WeightedLeastRequestRouter


def test_weighted_least_request_sends_in_proportion_to_the_weights_when_nothing_finishes() -> None:
    router = WeightedLeastRequestRouter()
    router.apply_correction(correction({"a": 0.6, "b": 0.3, "c": 0.1}), now=0.0)
    inflight = [0, 0, 0]
    for _ in range(100):
        inflight[router.choose("m", ["a", "b", "c"], inflight, now=1.0)] += 1
    assert inflight == [60, 30, 10]
    assert router.fallbacks == 0


def test_weighted_least_request_avoids_a_replica_whose_queue_stands_out_whatever_its_weight() -> None:
    router = WeightedLeastRequestRouter()
    router.apply_correction(correction({"a": 0.5, "b": 0.5}), now=0.0)
    # a stalled replica keeps its requests in flight: it gets nothing until its count per weight is the lowest
    assert {router.choose("m", ["a", "b"], [40, n], now=1.0) for n in range(39)} == {1}
    smooth = DynamicWeightRouter()  # smooth weighted round robin does not look at in-flight counts
    smooth.apply_correction(correction({"a": 0.5, "b": 0.5}), now=0.0)
    assert {smooth.choose("m", ["a", "b"], [40, n], now=1.0) for n in range(39)} == {0, 1}


def test_weighted_least_request_ties_rotate_and_zero_weights_get_nothing() -> None:
    router = WeightedLeastRequestRouter()
    assert router.choose("m", ["a", "b"], [3, 1], now=0.0) == 1 and router.fallbacks == 1  # no weights yet
    router.apply_correction(correction({"a": 0.25, "b": 0.25, "c": 0.5, "d": 0.0}), now=0.0)
    picks = [router.choose("m", ["a", "b", "c", "d"], [0, 0, 1, 0], now=1.0) for _ in range(6)]
    assert set(picks) == {0, 1, 2} and picks.count(0) == picks.count(1) == picks.count(2) == 2
    router.apply_correction(correction({"a": 0.5, "b": 0.5},
                                       [{"replica": "a", "action": "drain", "expires_at": 10.0}]), now=2.0)
    assert {router.choose("m", ["a", "b"], [0, 5], now=5.0) for _ in range(5)} == {1}  # drained
    assert router.choose("m", ["a", "b"], [0, 5], now=11.0) == 0  # the drain expired
    router.apply_correction(correction({"a": 0.0, "b": 0.0}), now=12.0)
    assert router.choose("m", ["a", "b"], [2, 1], now=13.0) == 1 and router.fallbacks == 2  # all 0: least conns


def run(policy: str, injections: tuple[Injection, ...], duration: float = 240.0) -> tuple[FleetSimulator,
                                                                                         RequestColumns]:
    loop = LocalWeightsLoop() if policy in CORRECTION_POLICIES else None
    sim = FleetSimulator(FleetConfig(replicas=4, load=0.6, policy=policy, seed=3, injections=injections), T0,
                         duration, on_step=loop)
    return sim, RequestColumns.concat([c.requests for c in sim.chunks()])


def test_dynamic_least_request_conserves_requests_and_takes_corrections() -> None:
    sim, cols = run("dynamic_least_request", (), duration=60.0)
    s = sim.stats()
    assert s["arrivals"] == s["finished"] + s["failed"] == len(cols) and s["in_flight"] == 0
    assert sim.router.corrections >= 11  # type: ignore[union-attr]  # one per 5 s step of arrivals and drain
    assert set(cols.replica.tolist()) == {"r0", "r1", "r2", "r3"}


def test_a_stuck_scheduler_loses_its_traffic_under_weighted_least_request_not_under_smooth_wrr() -> None:
    """The seed's weights lag a stalled replica by a window; in-flight counts do not."""
    collapse = (Injection("batch_collapse", "r1", 60, 120, {}),)
    share, p99 = {}, {}
    for policy in ("round_robin", "dynamic", "dynamic_least_request"):
        _, cols = run(policy, collapse)
        arrival = cols.ts - cols.latency_ms / 1000.0
        during = (arrival >= T0 + 60) & (arrival < T0 + 180)
        share[policy] = float(np.mean(cols.replica[during] == "r1"))
        p99[policy] = float(np.percentile(cols.latency_ms[cols.replica == "r1"], 99))
    assert share["round_robin"] == pytest.approx(0.25, abs=0.01)
    assert share["dynamic"] > 0.75 * share["round_robin"]  # the seed's weights barely move (formula saturates)
    assert share["dynamic_least_request"] < 0.5 * share["dynamic"]
    assert p99["dynamic_least_request"] < 0.6 * p99["dynamic"]
