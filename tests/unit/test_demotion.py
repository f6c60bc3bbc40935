"""Detections and weights agree (pipeline/demotion.py): demoted below every healthy replica, fail static."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skewwatch.pipeline.demotion import Holds, demote
from skewwatch.pipeline.weights import WeightConfig

CFG = WeightConfig()


@given(st.lists(st.tuples(st.floats(0.01, 1.0), st.booleans(), st.booleans()), min_size=2, max_size=12))
def test_demoted_replicas_weigh_less_than_every_healthy_one_and_the_pool_keeps_its_total(
        rows: list[tuple[float, bool, bool]]) -> None:
    raw = [w for w, _, _ in rows]
    weights = [w / sum(raw) for w in raw]
    alerted = [a for _, a, _ in rows]
    healthy = [h for _, _, h in rows]
    out = demote(weights, alerted, healthy, CFG)
    assert sum(out.weights) == pytest.approx(1.0)
    reference = [out.weights[i] for i in range(len(rows)) if healthy[i] and not alerted[i]]
    for row in out.demoted:
        assert out.weights[row] < min(reference)  # below every healthy replica
        assert out.weights[row] > 0  # alive: a probing share
    if not out.demoted:  # nothing moved: the formula's weights as they were
        assert out.weights == pytest.approx(weights)


def test_the_floor_keeps_a_probing_share_and_a_low_weight_stays_low() -> None:
    # a healthy pool of 8 at an equal share: the demoted one at half the lowest healthy (0.125 / 2)
    out = demote([0.125] * 8, [True] + [False] * 7, [True] * 8, CFG)
    assert out.weights[0] == pytest.approx(0.0625 / (1 - 0.0625))
    # already below its cap: not raised
    low = demote([0.01, 0.33, 0.33, 0.33], [True, False, False, False], [True] * 4, CFG)
    assert low.weights == pytest.approx([0.01, 0.33, 0.33, 0.33])
    # a drained replica (weight 0) stays at 0
    assert demote([0.0, 0.5, 0.5], [True, False, False], [False, True, True], CFG).weights[0] == 0.0


def test_fail_static() -> None:
    assert demote([0.5, 0.5], [True, False], [True, False], CFG).note == (
        "not demoted: no healthy replica to route to instead")
    off = WeightConfig(demote_on_alert=False)
    assert demote([0.25] * 4, [True, False, False, False], [True] * 4, off).weights == [0.25] * 4


def test_repeat_demotions_lengthen_up_to_the_cap_and_are_forgotten_after_the_memory() -> None:
    holds = Holds(CFG)
    lengths = []
    for k in range(7):  # demoted for 10 s every 85 s: 75 s apart, more than demote_episode_gap_s
        holds.opened("r1", 85.0 * k)
        lengths.append(holds.resolved("r1", 85.0 * k + 10.0))
    assert lengths == [0.0, 30.0, 60.0, 120.0, 240.0, 300.0, 300.0]  # base x 2^(k - 2), at most max_ejection_s
    assert holds.held("r1", 520.0 + 299.0) and not holds.held("r1", 520.0 + 300.0)
    assert holds.holding(1000.0) == []
    # long after (more than demote_memory_s): a first demotion again
    holds.opened("r1", 2000.0)
    assert holds.resolved("r1", 2010.0) == 0.0
    holds.opened("r2", 0.0)
    holds.opened("r2", 5.0)
    assert holds.resolved("r2", 6.0) == 30.0 and holds.holding(10.0) == ["r2"]
    holds.forget("r2")
    assert holds.holding(10.0) == []


def test_an_alert_that_flaps_within_the_episode_gap_is_one_demotion_lifted_when_it_resolves() -> None:
    """A stuck scheduler between phases: its alert resolves and opens again 20 s later, four times.
    Counted as repeats, the fourth would be held 120 s after the fault ended."""
    holds = Holds(CFG)
    for k in range(4):
        holds.opened("r5", 610.0 + 55.0 * k)
        assert holds.resolved("r5", 645.0 + 55.0 * k) == 0.0
    assert not holds.held("r5", 826.0)
    # a demotion that begins more than the gap after the last resolution is a repeat, and is held
    holds.opened("r5", 825.0 + CFG.demote_episode_gap_s + 1.0)
    assert holds.resolved("r5", 900.0) == CFG.base_ejection_s


def test_the_episode_gap_survives_a_checkpoint() -> None:
    holds = Holds(CFG)
    holds.opened("r1", 0.0)
    holds.resolved("r1", 30.0)
    restored = Holds(CFG)
    restored.load_state(holds.state_dict())
    restored.opened("r1", 50.0)  # 20 s after the resolution: the same demotion
    assert restored.resolved("r1", 60.0) == 0.0
