"""The novelty scorer keeps river's estimator conventions, is pure, and its JSON state continues exactly."""

from __future__ import annotations

import copy
import doctest
import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from river.checks import common

from skewwatch.pipeline.detectors import novelty
from skewwatch.pipeline.detectors.novelty import NoveltyBank, NoveltyParams, NoveltyScorer, make_scorer


def stream(n: int, seed: int = 7, shift_at: int | None = None) -> list[dict[str, float]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        level = 3.0 if shift_at is not None and i >= shift_at else 0.0
        rows.append({"ttft": 100.0 + 10 * rng.gauss(0, 1) + 40 * level, "tps": 50.0 + rng.gauss(0, 2),
                     "queue": float(rng.randint(0, 5))})
    return rows


def test_doctests() -> None:
    result = doctest.testmod(novelty)
    assert result.attempted > 0 and result.failed == 0


RIVER_MODEL_CHECKS: list[Callable[[Any], None]] = [
    common.check_repr, common.check_str, common.check_tags, common.check_clone_same_class,
    common.check_clone_is_idempotent, common.check_init_has_default_params_for_tests,
    common.check_init_default_params_are_not_mutable, common.check_doc, common.check_clone_changes_memory_addresses,
    common.check_mutate_can_be_idempotent, common.check_pickling_supports_roundtrip,
    common.check_repr_roundtrips_clone, common.check_clone_with_new_params_applies,
    common.check_get_params_matches_signature,
]
RIVER_DATASET_CHECKS: list[Callable[[Any, Any], None]] = [
    common.check_learn_one, common.check_shuffle_features_no_impact, common.check_predict_one_pure,
    common.check_emerging_features, common.check_disappearing_features,
    common.check_radically_disappearing_features, common.check_clone_is_independent,
    common.check_predict_one_before_any_learn, common.check_no_state_aliasing_with_input, common.check_pickling,
]


@pytest.mark.parametrize("check", RIVER_MODEL_CHECKS, ids=lambda c: c.__name__)
def test_river_estimator_checks(check: Callable[[Any], None]) -> None:
    check(make_scorer())


@pytest.mark.parametrize("check", RIVER_DATASET_CHECKS, ids=lambda c: c.__name__)
def test_river_dataset_checks(check: Callable[[Any, Any], None]) -> None:
    dataset = [(x, i >= 250) for i, x in enumerate(stream(300, shift_at=250))]
    check(make_scorer(memory=100, warmup=20, grace=10), dataset)


def test_score_one_is_pure_and_in_unit_interval() -> None:
    scorer = make_scorer(memory=200, warmup=30)
    for x in stream(400, shift_at=300):
        before = json.dumps(scorer.state_dict())
        first, second = scorer.score_one(x), scorer.score_one(x)
        assert first == second and 0.0 <= first <= 1.0
        assert json.dumps(scorer.state_dict()) == before
        scorer.learn_one(x)


@pytest.mark.parametrize("onset", [True, False])
def test_state_round_trip_continues_exactly(onset: bool) -> None:
    rows = stream(900, seed=3, shift_at=600)
    params = {"memory": 300, "warmup": 50, "onset": onset}
    a = make_scorer(**params)
    for x in rows[:500]:
        a.learn_one(x)
    b = make_scorer(**params)
    b.load_state(json.loads(json.dumps(a.state_dict())))
    scores_a, scores_b = [], []
    for x in rows[500:]:
        scores_a.append(a.score_one(x))
        a.learn_one(x)
        scores_b.append(b.score_one(x))
        b.learn_one(x)
    assert scores_a == scores_b
    assert max(scores_a[100:110]) > 0.5  # the shift at 600 is seen, so the comparison is not of zeros
    assert a.state_dict() == b.state_dict()


def test_state_from_other_parameters_or_version_is_refused() -> None:
    a = make_scorer()
    a.learn_one({"value": 1.0})
    with pytest.raises(ValueError, match="other parameters"):
        make_scorer(memory=1000).load_state(a.state_dict())
    with pytest.raises(ValueError, match="v"):
        make_scorer().load_state({**a.state_dict(), "v": 99})


def test_a_shift_scores_and_a_recurring_spike_does_not() -> None:
    """Relative to its own range: a spike seen before is normal, a new level is novel."""
    scorer = make_scorer()
    values = [1.0 + (5.0 if i % 50 == 0 else 0.0) + 0.01 * (i % 3) for i in range(1500)]
    scores = []
    for v in values + [9.0] * 5:
        scores.append(scorer.score_one({"value": v}))
        scorer.learn_one({"value": v})
    assert max(scores[300:1500]) == 0.0
    assert scores[1500] > 0.9


def test_missing_and_non_numeric_features_sit_out() -> None:
    scorer = make_scorer(memory=100, warmup=10, grace=5)
    for x in stream(50):
        scorer.learn_one(x)
    for bad in ({"ttft": None}, {"ttft": float("nan")}, {"ttft": "fast"}, {"ttft": True}, {}):
        assert scorer.score_one(bad) == 0.0
        scorer.learn_one(bad)
    assert scorer.samples == 55
    assert scorer.novelty_one({"ttft": 1e9})["ttft"] > 1.0 and scorer.novelty_one({}) == {}


@pytest.mark.parametrize("bad", [{"scales": ()}, {"scales": (0,)}, {"memory": 4, "blocks": 8}, {"fading": 1.0},
                                 {"short": 0}, {"escalation": 0.5}])
def test_bad_parameters_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        NoveltyScorer(**bad)


def test_state_is_not_aliased() -> None:
    scorer = make_scorer(memory=100)
    for x in stream(120):
        scorer.learn_one(x)
    exported = scorer.state_dict()
    frozen = copy.deepcopy(exported)
    scorer.learn_one(stream(1, seed=9)[0])
    assert exported == frozen


def _bank_sample(bank: NoveltyBank, xs: list[dict[str, Any]]) -> np.ndarray:
    bank.add_features(sorted({k for x in xs for k, v in x.items() if novelty._number(v) is not None}))
    out = np.full((len(xs), len(bank.features)), np.nan)
    for row, x in enumerate(xs):
        for name, value in x.items():
            v = novelty._number(value)
            if v is not None:
                out[row, bank.features.index(name)] = v
    return out


@pytest.mark.parametrize("params", [{}, {"memory": 100, "warmup": 20, "grace": 10, "short": 3},
                                    {"onset": False, "scales": (1, 4)}, {"short": 1, "blocks": 1},
                                    {"settle": 2, "scales": (1, 16), "memory": 300},
                                    {"drift": True, "memory": 200, "grace": 60, "span_floor": 0.5},
                                    {"drift": True, "memory": 200, "grace": 10}])  # before the first block
def test_the_bank_and_the_scorer_are_the_same_scorer(params: dict[str, Any]) -> None:
    """Three streams, as three NoveltyScorers and as three rows of one NoveltyBank: the same scores,
    and a state moves from one form to the other and goes on identically."""
    rng = random.Random(11)
    scorers = [make_scorer(**params) for _ in range(3)]
    bank = NoveltyBank([], NoveltyParams(**params))
    rows = bank.add_rows(3)
    worst = 0.0
    shifted = 0.0  # the highest score of the stream that shifts at 1000 (so equal scores are not all zeros)
    for i in range(1500):
        xs = [{"a": rng.gauss(0, 1) + (4.0 if i > 1000 and r == 1 else 0.0),
               "b": rng.random() if (i + r) % 7 else None, **({"c": rng.random()} if i > 300 else {})}
              for r in range(3)]
        expected = [s.score_one(x) for s, x in zip(scorers, xs, strict=True)]
        for s, x in zip(scorers, xs, strict=True):
            s.learn_one(x)
        got = bank.learn(rows, _bank_sample(bank, xs))
        worst = max(worst, float(np.abs(np.asarray(expected) - got).max()))
        shifted = max(shifted, expected[1] if i > 1000 else 0.0)
        if i == 700:  # swap forms: the bank's rows become scorers and the scorers bank rows
            states = [s.state_dict() for s in scorers]
            for r in range(3):
                scorers[r].load_state({"v": novelty.STATE_VERSION, "params": NoveltyParams(**params).key(),
                                       **bank.row_state(r)})
                bank.load_row(r, states[r])
    assert worst < 1e-12
    assert shifted > 0.5


def test_bank_rows_are_independent_and_can_be_dropped() -> None:
    bank = NoveltyBank(["v"], NoveltyParams(memory=50, grace=5, warmup=5))
    rows = bank.add_rows(3)
    for i in range(80):
        bank.learn(rows, np.array([[float(i % 4)], [10.0 + i % 2], [-1.0]]))
    alone = NoveltyBank(["v"], NoveltyParams(memory=50, grace=5, warmup=5))
    one = alone.add_rows(1)
    for i in range(80):
        alone.learn(one, np.array([[10.0 + i % 2]]))
    bank.drop_rows([0])
    assert len(bank) == 2 and bank.row_state(0) == alone.row_state(0)


def test_a_flat_range_is_as_wide_as_the_span_floor() -> None:
    """A feature that never moved (span 0) is judged against span_floor: a step out of it is novel (it
    used to be ignored: a span of 0 was no range at all), in both forms of the scorer."""
    params: dict[str, Any] = {"scales": (1,), "memory": 40, "blocks": 4, "grace": 5, "warmup": 5, "span_floor": 0.2}
    scorer = make_scorer(**params)
    bank = NoveltyBank(["value"], NoveltyParams(**params))
    rows = bank.add_rows(1)
    for _ in range(30):
        scorer.learn_one({"value": 0.0})
        bank.learn(rows, np.array([[0.0]]))
    assert scorer.novelty_one({"value": 0.0})["value"] == 0.0
    assert scorer.novelty_one({"value": 0.5})["value"] == pytest.approx(2.5)  # 0.5 outside, in units of 0.2
    assert float(bank.evaluate(rows, np.array([[0.5]])).novelty[0, 0]) == pytest.approx(2.5)
    # without a floor (NAB's scorer), a flat range is still no range: nothing to be novel against
    flat = make_scorer(**{**params, "span_floor": 0.0})
    for _ in range(30):
        flat.learn_one({"value": 0.0})
    assert flat.novelty_one({"value": 0.5})["value"] == 0.0


def test_reset_rows_starts_a_row_over() -> None:
    params = NoveltyParams(scales=(1, 4), memory=40, grace=5, warmup=5)
    bank = NoveltyBank(["a"], params)
    rows = bank.add_rows(2)
    for i in range(30):
        bank.learn(rows, np.array([[1.0 + i % 3], [2.0 + i % 2]]))
    kept = bank.evaluate(rows[1:], np.array([[9.0]])).novelty.copy()
    bank.reset_rows(rows[:1])
    fresh = NoveltyBank(["a"], params)
    fresh.add_rows(1)
    for name in NoveltyBank._ROW_ARRAYS:
        np.testing.assert_array_equal(getattr(bank, name)[0], getattr(fresh, name)[0])
    np.testing.assert_array_equal(bank.evaluate(rows[1:], np.array([[9.0]])).novelty, kept)
