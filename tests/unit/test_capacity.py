"""Weights as relative service capacity (pipeline/capacity.py)."""

from __future__ import annotations

from typing import Any

import pytest

from skewwatch.pipeline.capacity import capacity_weights, service_times
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.model_decisions import ModelDecider
from skewwatch.pipeline.weights import WeightConfig
from skewwatch.schemas.feature_vector import FeatureVector

CFG = WeightConfig(formula="capacity")


def fv(replica: str, **kw: Any) -> FeatureVector:
    values: dict[str, Any] = {"count": 100, "tpot_p50": 20.0, "ttft_p50": 200.0, "latency_p50": 2200.0,
                              "completion_tokens_mean": 101.0, **kw}
    return FeatureVector(model="m", replica=replica, window_start=0.0, window_end=60.0, **values)


def weights(vectors: list[FeatureVector], health: list[float] | None = None) -> dict[str, float]:
    names = [v.replica or "" for v in vectors]
    health = health or [1.0] * len(vectors)
    out = capacity_weights(StepColumns(vectors, [None] * len(vectors)), names, [(h, None) for h in health], CFG)
    return {r: w.weight for r, w in out.items()}


def test_a_replica_decoding_three_times_slower_gets_about_a_third_of_a_healthy_share() -> None:
    w = weights([fv("a"), fv("b"), fv("c"), fv("d", tpot_p50=60.0)])
    assert w["a"] == pytest.approx(w["b"]) == pytest.approx(w["c"])
    assert 0.3 < w["d"] / w["a"] < 0.5
    assert sum(w.values()) == pytest.approx(1.0)


def test_the_pools_own_spread_is_no_difference() -> None:
    # healthy replicas 10 % apart: within the dead band, equal shares
    w = weights([fv("a", tpot_p50=19.0), fv("b", tpot_p50=21.0), fv("c"), fv("d", tpot_p50=20.5)])
    assert list(w.values()) == pytest.approx([0.25] * 4)


def test_waiting_for_a_first_token_costs_what_it_waits() -> None:
    # 4 s more before the first token on a 2.2 s request: about 2.9 x the cost, less the dead band
    w = weights([fv("a"), fv("b"), fv("c", ttft_p50=4200.0)])
    assert w["c"] < 0.5 * w["a"]


def test_latency_is_the_measure_where_a_replica_lacks_tpot_and_an_empty_window_is_typical() -> None:
    vectors = [fv("a", tpot_p50=None), fv("b"), fv("c", latency_p50=9000.0), fv("d", count=0)]
    service, measure = service_times(StepColumns(vectors, [None] * 4))
    assert measure == "latency" and service[0] == pytest.approx(2.2)
    w = weights(vectors)
    assert w["d"] == pytest.approx(w["a"]) and w["c"] < 0.5 * w["a"]


def test_health_multiplies_and_a_drained_replica_gets_nothing() -> None:
    w = weights([fv("a"), fv("b"), fv("c")], health=[1.0, 0.4, 0.0])
    assert w["c"] == 0.0 and w["b"] == pytest.approx(0.4 * w["a"])


def test_the_decider_uses_it_when_chosen_and_the_seed_profile_keeps_the_seeds_formula() -> None:
    settings = DetectorSettings.from_overrides({"weights": {"formula": "capacity"}})
    decider = ModelDecider(settings)
    vectors = [fv("a"), fv("b"), fv("c", tpot_p50=60.0)]
    for vector in vectors:
        vector.window_start, vector.window_end = 1000.0 - 60.0, 1000.0
    d = decider.step("m", 1000.0, vectors, None, {})
    assert d.weights["c"].weight < 0.6 * d.weights["a"].weight and "cost" in d.weights["c"].components
    seed = DetectorSettings.from_overrides({"profile": "seed"})
    assert seed.weights.formula == "seed" and DetectorSettings().weights.formula == "seed"
