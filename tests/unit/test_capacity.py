"""Weights as relative service capacity (pipeline/capacity.py, pipeline/relative_speed.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from skewwatch.pipeline.capacity import capacity_weights, scale_by_speed, service_costs
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.model_decisions import ModelDecider
from skewwatch.pipeline.relative_speed import RelativeSpeed
from skewwatch.pipeline.weights import ReplicaWeight, WeightConfig
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

CFG = WeightConfig(formula="capacity")
STEP_S = 5.0


def fv(replica: str, end: float = 60.0, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"count": 100, "tpot_p50": 20.0, "latency_p50": 2200.0, **kw}
    return FeatureVector(model="m", replica=replica, window_start=end - 60.0, window_end=end, **values)


class Pool:
    """A pool's capacity weights step after step (one RelativeSpeed, as the decider keeps)."""

    def __init__(self) -> None:
        self.speed = RelativeSpeed()
        self.now = 0.0

    def step(self, tpot: dict[str, float | None], health: list[float] | None = None,
             telemetry: list[TelemetrySample | None] | None = None, **kw: Any) -> dict[str, float]:
        self.now += STEP_S
        vectors = [fv(r, self.now, tpot_p50=t, **kw) for r, t in tpot.items()]
        health = health or [1.0] * len(vectors)
        columns = StepColumns(vectors, telemetry or [None] * len(vectors))
        out = capacity_weights(columns, list(tpot), [(h, None) for h in health], CFG, self.speed, self.now, 60.0)
        return {r: w.weight for r, w in out.items()}


def test_a_replica_decoding_three_times_slower_gets_about_a_third_of_a_healthy_share() -> None:
    pool = Pool()
    for _ in range(60):
        w = pool.step({"a": 20.0, "b": 20.0, "c": 20.0, "d": 60.0})
    assert w["a"] == pytest.approx(w["b"]) == pytest.approx(w["c"])
    assert 0.3 < w["d"] / w["a"] < 0.4
    assert sum(w.values()) == pytest.approx(1.0)


def test_a_slower_gpu_among_noisy_windows_gets_its_speed_and_healthy_ones_stay_near_an_equal_share() -> None:
    # windows' medians scatter 25 % around each replica's speed; d's GPU is at 0.6 x the others'
    rng = np.random.default_rng(7)
    pool = Pool()
    lowest_healthy = 1.0
    for step in range(240):  # 20 minutes
        noise = np.exp(rng.normal(0.0, 0.25, 8))
        tpot = {f"r{i}": 20.0 * float(noise[i]) for i in range(7)} | {"d": 20.0 / 0.6 * float(noise[7])}
        w = pool.step(tpot)
        if step >= 24:
            lowest_healthy = min(lowest_healthy, *(w[f"r{i}"] * 8 for i in range(7)))
    ratio = w["d"] / float(np.mean([w[f"r{i}"] for i in range(7)]))
    assert 0.5 < ratio < 0.8  # its speed is 0.6; the shrink toward equal costs a little
    assert lowest_healthy > 0.8  # no healthy replica below 80 % of an equal share on noise


def test_one_wild_window_is_an_outlier_and_a_change_that_persists_is_taken_at_once() -> None:
    pool = Pool()
    base = {"a": 20.0, "b": 21.0, "c": 19.5, "d": 20.5}
    for step in range(60):
        pool.step({**base, "d": 20.5 * (1.0 + 0.05 * (-1) ** step)})
    for _ in range(5):  # 25 s of windows 10 x slower: the same requests seen again, not yet a change
        w = pool.step({**base, "d": 200.0})
        assert w["d"] == pytest.approx(0.25, abs=0.02)
    for _ in range(3):
        pool.step(base)
    for _ in range(7):  # half a window's worth of windows 3 x slower: a change
        w = pool.step({**base, "d": 61.5})
    assert w["d"] < 0.5 * w["a"]
    for _ in range(7):  # and back: restored as fast
        w = pool.step(base)
    assert w["d"] == pytest.approx(0.25, abs=0.02)


def test_the_measure_falls_back_to_the_live_gauges_then_to_latency_and_an_empty_window_is_typical() -> None:
    def live(seconds: float) -> TelemetrySample:
        return TelemetrySample(ts=0.0, replica="x", source="vllm", tpot_count=500, tpot_p50_s=seconds)

    vectors = [fv("a", tpot_p50=None), fv("b"), fv("c", latency_p50=9000.0), fv("d", count=0)]
    cost, measure = service_costs(StepColumns(vectors, [None] * 4))
    assert measure == "latency" and cost[0] == pytest.approx(2.2) and np.isnan(cost[3])
    cost, measure = service_costs(StepColumns(vectors, [live(0.02), live(0.02), live(0.06), None]))
    assert measure == "live" and cost[2] == pytest.approx(0.06)
    cost, measure = service_costs(StepColumns([fv("a"), fv("b", tpot_p50=30.0)], [live(0.02), live(0.02)]))
    assert measure == "tpot" and cost[1] == pytest.approx(0.03)
    pool = Pool()
    for _ in range(30):
        w = pool.step({"a": None, "b": None, "c": None, "d": None},
                      latency_p50=2200.0)
    assert list(w.values()) == pytest.approx([0.25] * 4)


def test_health_multiplies_and_a_drained_replica_gets_nothing() -> None:
    w = Pool().step({"a": 20.0, "b": 20.0, "c": 20.0}, health=[1.0, 0.4, 0.0])
    assert w["c"] == 0.0 and w["b"] == pytest.approx(0.4 * w["a"])


def test_the_decider_uses_it_when_chosen_keeps_it_in_its_checkpoint_and_the_seed_profile_keeps_the_seeds() -> None:
    settings = DetectorSettings.from_overrides({"weights": {"formula": "capacity"}})
    decider = ModelDecider(settings)

    def step(d: ModelDecider, end: float) -> dict[str, float]:
        vectors = [fv("a", end), fv("b", end, tpot_p50=21.0), fv("c", end, tpot_p50=60.0)]
        return {r: w.weight for r, w in d.step("m", end, vectors, None, {}).weights.items()}

    for end in np.arange(1000.0, 1300.0, STEP_S):
        w = step(decider, float(end))
    assert w["c"] < 0.6 * w["a"]
    restored = ModelDecider.from_state(decider.state_dict(), settings)
    for end in np.arange(1300.0, 1400.0, STEP_S):
        assert step(restored, float(end)) == step(decider, float(end))
    seed = DetectorSettings.from_overrides({"profile": "seed"})
    assert seed.weights.formula == "seed"


def test_a_forgotten_replica_starts_again() -> None:
    speed = RelativeSpeed()
    for step in range(20):
        speed.update(STEP_S * step, ["a", "b", "c"], np.log(np.array([1.0, 1.0, 3.0])), CFG, 60.0)
    speed.forget("c")
    out = speed.update(200.0, ["a", "b", "c"], np.array([0.0, 0.0, np.nan]), CFG, 60.0)
    assert np.isnan(out[2]) and "c" not in speed.state_dict()["replicas"]


def loaded_pool(collapsed: str | None = None, slower: str | None = None, steps: int = 84) -> dict[str, float]:
    """Four replicas whose load rises and falls together (every batch 4-16 over a minute), each step's
    time per token 20 ms x (batch / 8)^0.6 (more sequences, longer steps); ``collapsed`` runs a batch
    of 1.5 whatever its load, ``slower`` decodes 2 x slower and so holds 2 x the batch (Little)."""
    pool = Pool()
    w: dict[str, float] = {}
    for step in range(steps):
        load = 2.0 ** (np.sin(2.0 * np.pi * step / 12.0))
        vectors = []
        for replica in "abcd":
            batch = 1.5 if replica == collapsed else 8.0 * load * (2.0 if replica == slower else 1.0)
            tpot = 20.0 * (batch / 8.0) ** 0.6 * (2.0 if replica == slower else 1.0)
            vectors.append(fv(replica, pool.now + STEP_S, tpot_p50=tpot, batch_size_mean=batch))
        pool.now += STEP_S
        out = capacity_weights(StepColumns(vectors, [None] * 4), list("abcd"), [(1.0, None)] * 4, CFG, pool.speed,
                               pool.now, 60.0)
        w = {r: rw.weight for r, rw in out.items()}
    return w


def test_a_replica_whose_batch_collapsed_is_compared_at_its_pools_batch_and_not_promoted() -> None:
    # d runs 1.5 sequences where its peers run 4-16: its tokens come 2-5 x faster for that alone. At
    # the pool's batch (the pool's own slope of log time per token on log batch, 0.6 here) it is as
    # fast as they are: no promotion, and no healthy peer below 80 % of an equal share. Without the
    # batch term it got 0.42 of the weight and its peers 0.19 each.
    w = loaded_pool(collapsed="d")
    assert w["d"] == pytest.approx(0.25, abs=0.03)
    assert min(w["a"], w["b"], w["c"]) > 0.8 * 0.25


def test_a_slower_replica_whose_batch_grew_with_it_is_still_found() -> None:
    # one-sided: a larger batch is what a slower replica's longer requests fill, so it is not
    # credited; d decodes 2 x slower at any batch and holds 2 x its peers' batch
    w = loaded_pool(slower="d")
    assert w["d"] < 0.8 * 0.25
    assert min(w["a"], w["b"], w["c"]) > 0.25


def _speed_shares(c_tpot: Callable[[int, int], float], ends: range) -> dict[float, float]:
    """scale_by_speed over a pool of a, b at 20 ms per token and c at ``c_tpot(step index, end)``:
    c's weight over a's at each step's end."""
    speed = RelativeSpeed()
    even = {r: ReplicaWeight(r, 1 / 3, 1.0, 1.0, "ok") for r in "abc"}
    shares: dict[float, float] = {}
    for i, end in enumerate(ends):
        vectors = [fv(r, float(end), tpot_p50=c_tpot(i, end) if r == "c" else 20.0) for r in "abc"]
        w = scale_by_speed(dict(even), StepColumns(vectors, [None] * 3), list("abc"), WeightConfig(), speed,
                           float(end), 60.0)
        shares[float(end)] = w["c"].weight / w["a"].weight
    return shares


def test_relative_speed_returns_a_replica_to_its_share_once_its_window_agrees() -> None:
    """scale_by_speed: c's tokens come 2 x slower for ten minutes, then at the pool's speed again.
    Its weight is below its peers' while slow, and back at theirs on the first refresh after its
    window shows it (the estimate itself restarts later)."""
    shares = _speed_shares(lambda i, end: 40.0 if end <= 660 else 20.0, range(60, 1000, 5))
    assert shares[650.0] < 0.6
    back = min(t for t in shares if t > 660.0 and shares[t] == pytest.approx(1.0))
    assert back <= 660.0 + 30.0  # the refresh after its window reads the pool's speed


def test_relative_speed_keeps_a_slower_replicas_cost_through_a_window_within_its_noise() -> None:
    """scale_by_speed: c is 2 x slower and its windows scatter by about 15 %; one window that reads
    it 1.6 x slower is within that noise, so its cost stays: only a ratio beyond the noise hands a
    slower replica its share back."""
    shares = _speed_shares(lambda i, end: 32.0 if end == 840 else 40.0 * (1.15 if (i // 6) % 2 else 1 / 1.15),
                           range(60, 900, 5))
    assert max(shares[t] for t in shares if 600.0 <= t <= 895.0) < 0.7


def test_a_passing_prefill_burst_moves_no_healthy_replica_and_a_slower_gpu_is_still_found_at_once() -> None:
    """A queue-bound pool's heavy tail: every eight minutes one healthy replica's windows read it 12 x
    slower (a burst of long prompts prefilling on it), fading over two minutes. A run that recedes
    restarts nothing, and the pool's noise counts its tail, so no healthy replica falls below 80 % of
    an equal share (each burst did, before). A GPU that turns 1.8 x slower in the same pool, once the
    last burst has left the pool's horizon, holds its ratio and is below its peers within a window."""
    rng = np.random.default_rng(3)
    pool = Pool()
    names = [f"r{i}" for i in range(6)]
    burst: dict[str, int] = {}  # replica -> steps since its burst began
    lowest_healthy, slow_from, found = 1.0, 420, None
    for step in range(540):  # 45 minutes
        if step % 100 == 10 and step < slow_from - 100:  # a burst on the next replica in turn
            burst[names[(step // 100) % 5]] = 0
        log_tpot = {r: float(rng.normal(0.0, 0.05)) for r in names}
        for r, k in list(burst.items()):
            log_tpot[r] += 2.5 * float(np.exp(-k / 8.0))  # 12 x slower, fading over two minutes
            burst[r] = k + 1
        if step >= slow_from:
            log_tpot["r5"] += float(np.log(1.8))
        w = pool.step({r: 20.0 * float(np.exp(x)) for r, x in log_tpot.items()})
        if step >= 24:
            healthy = names[:5] if step >= slow_from else names
            lowest_healthy = min(lowest_healthy, *(w[r] * len(names) for r in healthy))
        if step >= slow_from and found is None and w["r5"] < min(w[r] for r in names[:5]):
            found = (step - slow_from) * STEP_S
    assert lowest_healthy > 0.8
    assert found is not None and found <= 60.0


def _live(seconds: float, field: str = "tpot_p50_s") -> TelemetrySample:
    return TelemetrySample(ts=0.0, replica="x", source="vllm", tpot_count=500, **{field: seconds})


def _slowdown_found(live_factor: float | None, field: str = "tpot_p50_s", factor: float = 3.0) -> float:
    """scale_by_speed: c's tokens turn ``factor`` x slower at 600 s; its windows' median moves over 30 s
    (the window fills with requests from after the change), and its engine's live time per token (when
    ``live_factor`` is not None) moves by ``live_factor`` at once. Seconds until c's weight is 20 %
    off an equal share (below it when slower, above it when faster)."""
    speed, even = RelativeSpeed(), {r: ReplicaWeight(r, 1 / 3, 1.0, 1.0, "ok") for r in "abc"}
    for end in range(60, 900, 5):
        slow = min(max((end - 600) / 30.0, 0.0), 1.0)  # the window's share of requests from after it
        tpots = [20.0, 20.5 if end % 10 else 19.5, 20.0 * (1.0 + (factor - 1.0) * slow)]
        vectors = [fv(r, float(end), tpot_p50=t) for r, t in zip("abc", tpots, strict=True)]
        telemetry: list[TelemetrySample | None] = [None] * 3
        if live_factor is not None:
            telemetry = [_live(0.02, field), _live(0.02, field),
                         _live(0.02 * (live_factor if end > 600 else 1.0), field)]
        w = scale_by_speed(dict(even), StepColumns(vectors, telemetry), list("abc"), WeightConfig(), speed,
                           float(end), 60.0)
        if end > 600 and (w["c"].weight < 0.8 / 3 if factor > 1.0 else w["c"].weight > 1.2 / 3):
            return end - 600.0
    raise AssertionError("never found")


def test_the_engines_live_gauges_confirm_a_change_in_the_windows_at_once() -> None:
    """A run of window ratios beyond the noise restarts the estimate after half a window; where the
    engine's live time per token agrees (two samples beyond the same noise on the run's side), on the
    next step. A live gauge that does not agree (the engine reports no slowdown) waits as before,
    and the steps between refreshes are followed one by one while a change is under way."""
    without, agreeing, silent = _slowdown_found(None), _slowdown_found(3.0), _slowdown_found(1.0)
    assert agreeing < without
    assert _slowdown_found(3.0, "tpot_mean_s") == agreeing  # llama.cpp's counters give a mean only
    assert silent == without
    # the grid's refresh at 630 s sees the window's run and the first live sample beyond the noise;
    # the next step brings the second: 35 s, below 80 % of an equal share on the one after
    assert agreeing <= 40.0
    assert without <= 60.0  # half a window after the run began
    # toward faster the live gauges confirm nothing: they are not compared at the pool's batch, and
    # a stuck scheduler's batch of 1-2 makes its tokens quicker
    assert _slowdown_found(0.5, factor=0.5) == _slowdown_found(None, factor=0.5)


def test_a_change_under_way_is_followed_every_step_and_the_grid_resumes_after() -> None:
    speed = RelativeSpeed()
    for step in range(30):  # a settled pool
        jitter = np.array([0.01, -0.01, 0.0]) * (-1) ** step
        speed.update(5.0 * step, list("abc"), jitter, WeightConfig(), 60.0)
    assert not speed.watching(150.0)
    speed.update(150.0, list("abc"), np.array([0.0, 0.0, 1.0]), WeightConfig(), 60.0)  # c: a run begins
    assert speed.watching(155.0)  # followed step by step while it lasts
    state = speed.state_dict()
    again = RelativeSpeed()
    again.load_state(state)
    assert again.watching(155.0) and again.state_dict() == state
    for t in (155.0, 160.0, 165.0, 170.0, 175.0, 180.0):  # it holds: the estimate restarts from it
        speed.update(t, list("abc"), np.array([0.0, 0.0, 1.0]), WeightConfig(), 60.0, sample_noise=False)
    assert speed.watching(200.0)  # half a window after the restart
    assert not speed.watching(240.0)  # then back on the grid
