"""A pool's slope of a log value on a log covariate (here TTFT per prompt token on the prompt)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from skewwatch.pipeline.detectors.pool_slope import PoolSlope


def feed(fit: PoolSlope, slope: float, updates: int, seed: int = 0, key: str = "m") -> None:
    """``updates`` batches of four windows, log prompt 3..10, value ``slope`` x log prompt + noise."""
    rng = np.random.default_rng(seed)
    for _ in range(updates):
        x = rng.uniform(3.0, 10.0, 4)
        fit.adjust(key, slope * x + rng.normal(0.0, 0.05, 4), x, np.full(4, 2.0))


def test_no_slope_before_the_evidence_nor_over_one_prompt_length() -> None:
    fit = PoolSlope(memory=240, min_requests=20)
    fit.adjust("m", np.array([-1.0, -3.0]), np.array([2.0, 6.0]), np.array([4.0, 5.0]))
    assert fit.slope("m") == 0.0  # 9 requests of the 20
    fit.adjust("m", np.array([-1.5, -2.5]), np.array([3.0, 5.0]), np.array([6.0, 6.0]))
    assert fit.slope("m") == pytest.approx(-0.5)
    same = PoolSlope(memory=240, min_requests=20)
    for _ in range(10):
        same.adjust("m", np.array([-1.0, -2.0]), np.array([4.0, 4.0]), np.array([5.0, 5.0]))
    assert same.slope("m") == 0.0 and same.slope("other") == 0.0


def test_the_values_are_judged_at_the_typical_prompt() -> None:
    """Windows that differ only by their prompts come out alike; one that is slower stands out by as
    much as it is slower."""
    fit = PoolSlope(memory=240, min_requests=20)
    feed(fit, -0.4, 50)
    x = np.array([3.0, 6.0, 9.0, 9.0])
    out = fit.adjust("m", -0.4 * x + np.array([0.0, 0.0, 0.0, 0.7]), x, np.ones(4))
    assert np.ptp(out[:3]) < 0.05 and out[3] - out[2] == pytest.approx(0.7, abs=1e-9)
    # at the typical prompt (the fit's mean log prompt, ~6.5), the value is the pool's there
    assert out[0] == pytest.approx(-0.4 * fit.fits["m"][1], abs=0.05)


def test_the_slope_is_bounded() -> None:
    fit = PoolSlope(memory=240, min_requests=20)
    feed(fit, -3.0, 20)
    assert fit.slope("m") == -1.0
    feed(fit, 3.0, 200, key="n")
    assert fit.slope("n") == 1.0


def test_it_follows_a_new_slope_over_its_memory() -> None:
    fit = PoolSlope(memory=40, min_requests=20)
    feed(fit, -0.5, 200)
    assert fit.slope("m") == pytest.approx(-0.5, abs=0.02)
    feed(fit, 0.0, 40, seed=1)
    assert -0.4 < fit.slope("m") < -0.1  # an e-fold of the memory: about a third of the way
    feed(fit, 0.0, 200, seed=2)
    assert fit.slope("m") == pytest.approx(0.0, abs=0.02)


def test_a_window_without_a_prompt_is_given_as_it_is_and_not_learned() -> None:
    fit = PoolSlope(memory=240, min_requests=20)
    feed(fit, -0.4, 50)
    before = fit.state()
    out = fit.adjust("m", np.array([-2.0, np.nan]), np.array([np.nan, 5.0]), np.array([3.0, 3.0]))
    assert out[0] == -2.0 and np.isnan(out[1])
    assert fit.state() == before


def test_state_round_trips_and_a_bad_one_is_refused() -> None:
    fit = PoolSlope(memory=240, min_requests=20)
    feed(fit, -0.4, 50)
    again = PoolSlope(memory=240, min_requests=20)
    again.load(json.loads(json.dumps(fit.state())))
    x = np.array([4.0, 8.0])
    assert np.array_equal(again.adjust("m", -0.4 * x, x, np.ones(2)), fit.adjust("m", -0.4 * x, x, np.ones(2)))
    assert again.state() == fit.state()
    for bad in ({"m": [1.0, 2.0]}, {"m": [1.0, 2.0, 3.0, 4.0, 5.0, float("nan")]}, {"m": [-1.0, 0, 0, 0, 0, 0]}):
        with pytest.raises(ValueError, match="pool slope"):
            again.load(bad)
    with pytest.raises(ValueError):
        PoolSlope(memory=0, min_requests=20)


def test_a_pool_that_learned_nothing_for_long_is_dropped() -> None:
    fit = PoolSlope(memory=240, min_requests=20)
    x = np.array([3.0, 6.0])
    fit.adjust("old", -0.4 * x, x, np.full(2, 20.0), now=100.0)
    fit.adjust("new", -0.4 * x, x, np.full(2, 20.0), now=200.0)
    fit.adjust("old", np.full(2, np.nan), x, np.full(2, 20.0), now=300.0)  # nothing to learn: not seen
    fit.drop_before(150.0)
    assert set(fit.fits) == {"new"} and fit.slope("new") == pytest.approx(-0.4)
