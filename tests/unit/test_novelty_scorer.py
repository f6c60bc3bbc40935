"""The novelty scorer keeps river's estimator conventions, is pure, and its JSON state continues exactly;
the bank agrees with the plain-Python oracle, and the public scorer keeps its recorded scores."""

from __future__ import annotations

import copy
import doctest
import json
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from river.checks import common

from skewwatch.pipeline.detectors import novelty
from skewwatch.pipeline.detectors.novelty import NoveltyBank, NoveltyParams, NoveltyScorer, make_scorer
from skewwatch.pipeline.finite import finite_or_none
from tests import novelty_reference
from tests.novelty_reference import ReferenceScorer


def stream(n: int, seed: int = 7, shift_at: int | None = None) -> list[dict[str, float]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        level = 3.0 if shift_at is not None and i >= shift_at else 0.0
        rows.append({"ttft": 100.0 + 10 * rng.gauss(0, 1) + 40 * level, "tps": 50.0 + rng.gauss(0, 2),
                     "queue": float(rng.randint(0, 5))})
    return rows


@pytest.mark.parametrize("module", [novelty, novelty_reference], ids=lambda m: m.__name__)
def test_doctests(module: Any) -> None:
    result = doctest.testmod(module)
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
    bank.add_features(sorted({k for x in xs for k, v in x.items() if finite_or_none(v) is not None}))
    out = np.full((len(xs), len(bank.features)), np.nan)
    for row, x in enumerate(xs):
        for name, value in x.items():
            v = finite_or_none(value)
            if v is not None:
                out[row, bank.features.index(name)] = v
    return out


@pytest.mark.parametrize("params", [{}, {"memory": 100, "warmup": 20, "grace": 10, "short": 3},
                                    {"onset": False, "scales": (1, 4)}, {"short": 1, "blocks": 1},
                                    {"settle": 2, "scales": (1, 16), "memory": 300},
                                    {"drift": True, "memory": 200, "grace": 60, "span_floor": 0.5},
                                    {"drift": True, "memory": 200, "grace": 10}])  # before the first block
def test_the_bank_and_the_oracle_are_the_same_scorer(params: dict[str, Any]) -> None:
    """Three streams, as three plain-Python oracles and as three rows of one NoveltyBank: the same scores
    to float rounding, and a state moves from one form to the other and goes on identically. The public
    scorers (one-row banks) give their row's scores to the last bit."""
    rng = random.Random(11)
    oracles = [ReferenceScorer(**params) for _ in range(3)]
    scorers = [make_scorer(**params) for _ in range(3)]
    bank = NoveltyBank([], NoveltyParams(**params))
    rows = bank.add_rows(3)
    worst = 0.0
    shifted = 0.0  # the highest score of the stream that shifts at 1000 (so equal scores are not all zeros)
    for i in range(1500):
        xs = [{"a": rng.gauss(0, 1) + (4.0 if i > 1000 and r == 1 else 0.0),
               "b": rng.random() if (i + r) % 7 else None, **({"c": rng.random()} if i > 300 else {})}
              for r in range(3)]
        expected = [s.score_one(x) for s, x in zip(oracles, xs, strict=True)]
        public = [s.score_one(x) for s, x in zip(scorers, xs, strict=True)]
        for s, x in zip([*oracles, *scorers], xs + xs, strict=True):
            s.learn_one(x)
        got = bank.learn(rows, _bank_sample(bank, xs))
        assert public == got.tolist()
        worst = max(worst, float(np.abs(np.asarray(expected) - got).max()))
        shifted = max(shifted, expected[1] if i > 1000 else 0.0)
        if i == 700:  # swap forms: the bank's rows become oracles and the oracles bank rows
            states = [s.state_dict() for s in oracles]
            for r in range(3):
                oracles[r].load_state({"v": novelty.STATE_VERSION, "params": NoveltyParams(**params).key(),
                                       **bank.row_state(r)})
                bank.load_row(r, states[r])
                scorers[r].load_state(states[r])
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


# --- the public scorer gives the scores it gave as a plain-Python twin of the bank ---------------------------


def recorded_series(n: int) -> list[dict[str, float | None]]:
    """A fixed two-feature series: a wave, a level shift at 300-339, a spike at 420, a drift from 460;
    ``b`` missing every 9th sample."""
    out: list[dict[str, float | None]] = []
    for i in range(n):
        wave = 10.0 + 2.0 * math.sin(i / 5.0) + 0.3 * ((i * 7919) % 13) / 13.0
        a = wave + (6.0 if 300 <= i < 340 else 0.0) + (15.0 if i == 420 else 0.0)
        b = 50.0 - 0.02 * i * (i >= 460) + ((i * 104729) % 17) / 17.0
        out.append({"a": a, "b": b if i % 9 else None})
    return out


# Every non-zero score of make_scorer(**params) on recorded_series(600), recorded when the scorer was
# still computed in plain Python (math.erfc, one value at a time); it is now a one-row NoveltyBank.
RECORDED_ONSETS: dict[int, float] = {
    55: 0.048860224036531605, 91: 0.047843342357027335, 127: 0.039373552097369355, 280: 0.03874739763073014,
    300: 0.2837806705080517, 302: 0.6690071219698998, 420: 0.13613815443981206, 460: 0.4225812649009126,
    461: 0.9323217697562539
}

RECORDED_LEVELS: dict[int, float] = {
    300: 0.3684099572860656, 301: 0.615925131573464, 302: 0.7924709773000148, 303: 0.8875774668264974,
    304: 0.9206278915128745, 305: 0.9198905512588907, 306: 0.8872050969404738, 307: 0.8513392683927471,
    308: 0.8183522013113151, 309: 0.7911491215406946, 310: 0.2986080735938748, 311: 0.20469345745422046,
    312: 0.1556521331354464, 313: 0.13197771957646026, 314: 0.12831985390596298, 315: 0.12988130576324952,
    316: 0.13784671983219357, 317: 0.14654875365035278, 318: 0.1549977016424721, 319: 0.15856193216541054,
    320: 0.1593676051576079, 321: 0.1565640869885874, 322: 0.1536656056686063, 323: 0.1460538202303353,
    324: 0.12822271055315862, 325: 0.10898093238730837, 326: 0.09159094373460902, 327: 0.07507921045900655,
    328: 0.06047039370963167, 329: 0.04973209822176931, 330: 0.04077967536504148, 331: 0.03355802515019386,
    420: 0.1973205263348822, 421: 0.19536333482239635, 422: 0.19346014470519138, 423: 0.19160868463584416,
    424: 0.1898068101950208, 425: 0.18805249510565114, 426: 0.1863438231687529, 427: 0.18467898085258,
    428: 0.18305625047407678, 429: 0.1814740039180446, 460: 0.6120236959072256, 461: 0.999965790532226,
    462: 0.9999999946036824, 463: 0.9999999998915228, 464: 0.9999999998604638, 465: 0.999999999413981,
    466: 0.9999999918021, 467: 0.9999999058837781, 468: 0.9999936315344645, 469: 0.9999643307545245,
    470: 0.5126355239315569, 471: 0.27712026188172395, 472: 0.1800422770117304, 473: 0.1268861344419911,
    474: 0.09658890930048178, 475: 0.07632732712564083, 476: 0.06663745911557908, 477: 0.05351447525983679,
    478: 0.05727125434037781, 479: 0.04945360476229685, 480: 0.04571079008617657, 481: 0.040798178540544475,
    482: 0.03878392341043922, 483: 0.03542108650036807, 484: 0.03434856423451451, 485: 0.03189044609626645
}


@pytest.mark.parametrize(("params", "recorded"), [
    ({"memory": 200, "warmup": 50, "grace": 20}, RECORDED_ONSETS),
    ({"onset": False, "scales": (1, 8), "memory": 300, "warmup": 50, "grace": 20}, RECORDED_LEVELS),
], ids=["onsets", "levels"])
def test_the_public_scorer_keeps_its_recorded_scores(params: dict[str, Any], recorded: dict[int, float]) -> None:
    """The same samples score, and score the same to a few units in the last place: the likelihood's tail is
    scipy's erfc in the bank and was math.erfc in plain Python, and the two may round differently."""
    scorer = make_scorer(**params)
    got: dict[int, float] = {}
    for i, x in enumerate(recorded_series(600)):
        score = scorer.score_one(x)
        scorer.learn_one(x)
        if score:
            got[i] = score
    assert got.keys() == recorded.keys()
    assert max(abs(got[i] - recorded[i]) for i in recorded) <= 1e-15
