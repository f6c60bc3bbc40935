"""The shift test's bank: disjoint windows, weighed in requests, quarantine, a material and robust difference,
its state."""

from __future__ import annotations

import numpy as np
import pytest

from skewwatch.pipeline.detectors.shift import ShiftBank, ShiftParams

SPAN = np.array([60.0])


def feed(bank: ShiftBank, values: list[float], start: float = 0.0, every: float = 60.0) -> np.ndarray:
    rows = np.array([0])
    z = np.zeros((1, 1))
    for t, v in enumerate(values):
        z = bank.observe(rows, np.array([[v]]), now=start + every * t, span=SPAN)
    return z


def fresh(**params: float) -> ShiftBank:
    bank = ShiftBank(1, ShiftParams(window=4, min_recent=2, min_past=8, memory=50, **params))  # type: ignore[arg-type]
    bank.add_rows(1)
    return bank


def alternating(n: int, level: float = 0.0, swing: float = 0.3) -> list[float]:
    return [level + (swing if t % 2 else -swing) for t in range(n)]


def test_one_value_per_window_length() -> None:
    """Samples every 5 s of 60 s windows share requests: only one a minute is taken."""
    every_step, once_a_minute = fresh(), fresh()
    feed(every_step, [v for v in alternating(40) for _ in range(12)], every=5.0)
    feed(once_a_minute, alternating(40))
    assert every_step.past[0, 0, 0] == once_a_minute.past[0, 0, 0] == 36  # 40 taken, 4 recent
    np.testing.assert_allclose(every_step.pack_rows(), once_a_minute.pack_rows())


def test_a_quarantined_value_does_not_join_the_past() -> None:
    bank = fresh()
    feed(bank, alternating(20))
    weight = bank.past[0, 0, 0]
    rows = np.array([0])
    for t in range(20, 30):
        bank.observe(rows, np.array([[5.0]]), now=60.0 * t, span=SPAN, quarantine=np.array([True]))
    assert bank.past[0, 0, 0] == weight  # what left the ring while quarantined was dropped


def test_a_shift_must_be_material_and_not_one_window() -> None:
    """A difference of 0.05 with no noise at all is sure but not material (min_effect 0.2); one
    window of 100 sd moves the mean of four by at most clip (3) sd."""
    steady = fresh(min_effect=0.2, sd_floor=0.01)
    z = feed(steady, [0.0] * 30 + [0.05] * 4)
    assert z[0, 0] == 0.0
    spike = fresh()
    z = feed(spike, alternating(30) + [30.0, -0.3, 0.3, -0.3])
    # the past's sd is 0.3: one value clipped at 0.9 moves the mean of four by 0.2 (with the others)
    assert 0.0 < z[0, 0] < 2.0
    unclipped = fresh(clip=0.0)
    assert feed(unclipped, alternating(30) + [30.0, -0.3, 0.3, -0.3])[0, 0] > 40.0  # one window decides


def feed_weighted(bank: ShiftBank, values: list[float], weights: list[float], start: float = 0.0) -> np.ndarray:
    rows = np.array([0])
    z = np.zeros((1, 1))
    for t, (v, w) in enumerate(zip(values, weights, strict=True)):
        z = bank.observe(rows, np.array([[v]]), now=start + 60.0 * t, span=SPAN, weight=np.array([w]))
    return z


def test_a_window_weighs_its_requests() -> None:
    """Past windows of 1 and 9 requests in turn (typical: 5). A recent window of 9 requests at a
    new level outweighs three of one request at the old: the mean moves further than by one window
    in four, and the standard error is of 5 + 3 requests, not 4 windows."""
    past = alternating(30, swing=0.1)
    past_weights = [1.0 if t % 2 else 9.0 for t in range(30)]
    weighted, by_window = fresh(), fresh()
    z_weighted = feed_weighted(weighted, past + [0.5, 0.0, 0.0, 0.0], past_weights + [9.0, 1.0, 1.0, 1.0])
    z_window = feed(by_window, past + [0.5, 0.0, 0.0, 0.0])
    assert z_weighted[0, 0] > 1.5 * z_window[0, 0] > 0.0
    assert weighted.past[0, 0, 1] == pytest.approx(sum(past_weights))  # the 30 that left the recent four


def test_a_recent_window_counts_at_most_the_past_typical_window() -> None:
    """A replica suddenly sent 500 times its usual requests is no surer of its new level than one
    window of its past would be: the same z as with its usual two requests."""
    values = alternating(30) + [0.4, 0.4]
    usual, surge = fresh(), fresh()
    z_usual = feed_weighted(usual, values, [2.0] * 32)
    z_surge = feed_weighted(surge, values, [2.0] * 31 + [1000.0])
    assert z_surge[0, 0] == pytest.approx(z_usual[0, 0]) and z_usual[0, 0] > 0.0


def test_state_packs_and_continues_identically() -> None:
    a = fresh()
    feed(a, alternating(25))
    feed_weighted(a, alternating(3), [3.0, 1.0, 7.0], start=60.0 * 25)
    b = ShiftBank(1, a.params)
    rows = b.add_rows(1)
    b.unpack_rows(rows, a.pack_rows())
    tail = alternating(10, level=0.5)
    assert feed(a, tail, start=60.0 * 28)[0, 0] == feed(b, tail, start=60.0 * 28)[0, 0] > 0.0


def test_rows_are_independent_and_reset() -> None:
    bank = ShiftBank(2, ShiftParams(window=4, min_recent=2, min_past=8))
    rows = bank.add_rows(3)
    for t in range(40):
        x = np.array([[0.1 * (t % 2), 0.0], [0.0, 0.1 * (t % 2)], [0.0, 0.0]]) + (t >= 36) * np.array([[1.0, 0.0]] * 3)
        z = bank.observe(rows, x, now=60.0 * t, span=np.full(3, 60.0))
    assert (z[:, 0] > 4.0).all() and (z[:, 1] == 0.0).all()  # the first feature moved, on every row
    bank.reset_rows(np.array([1]))
    assert bank.z[1].tolist() == [0.0, 0.0] and bank.past[1].sum() == 0.0 and bank.past[0, 0, 0] > 0
    bank.drop_rows(np.array([0]))
    assert len(bank) == 2


@pytest.mark.parametrize("bad", [{"window": 4, "min_recent": 5}, {"min_past": 1}, {"memory": 5, "min_past": 8},
                                 {"sd_floor": 0.0}, {"min_effect": -1.0}, {"clip": -1.0}])
def test_bad_parameters_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ShiftParams(**bad)  # type: ignore[arg-type]
