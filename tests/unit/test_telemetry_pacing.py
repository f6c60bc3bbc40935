"""TelemetryPacer: telemetry ahead of the requests' watermark is held and its partition paused."""

from __future__ import annotations

import pytest

from skewwatch.pipeline.telemetry_pacing import TelemetryPacer


def test_samples_within_reach_pass_and_the_rest_wait_in_order() -> None:
    flow = TelemetryPacer[int](ahead_s=60.0)
    # a backlog: 10 minutes of samples fetched at once while requests are at 100 s
    samples = [(float(ts), ts) for ts in range(0, 600, 5)]
    joined = flow.offer(3, samples, watermark=100.0)
    assert joined == list(range(0, 165, 5))
    assert len(flow) == len(samples) - len(joined)
    assert flow.pause_resume() == (frozenset({3}), frozenset())
    assert flow.pause_resume() == (frozenset(), frozenset())  # already paused: nothing to do
    # requests catch up step by step: each step releases what came within reach, in read order
    released: list[int] = []
    for watermark in range(105, 600, 5):
        released += flow.release(3, float(watermark))
    assert joined + released == [s for _, s in samples]
    assert len(flow) == 0
    assert flow.pause_resume() == (frozenset(), frozenset({3}))


def test_order_is_kept_behind_a_held_sample() -> None:
    flow = TelemetryPacer[str](ahead_s=10.0)
    # "late" is within reach but was read after a held sample: it waits, so the join sees read order
    assert flow.offer(0, [(100.0, "ahead"), (50.0, "late")], watermark=50.0) == []
    assert flow.release(0, 90.0) == ["ahead", "late"]


def test_without_a_watermark_nothing_is_held() -> None:
    flow = TelemetryPacer[int](ahead_s=60.0)
    assert flow.offer(0, [(1e9, 1), (2e9, 2)], watermark=None) == [1, 2]
    assert flow.pause_resume() == (frozenset(), frozenset())


def test_partitions_are_independent_and_forget_drops_a_revoked_one() -> None:
    flow = TelemetryPacer[int](ahead_s=60.0)
    assert flow.offer(0, [(500.0, 1)], watermark=0.0) == []
    assert flow.offer(1, [(30.0, 2), (500.0, 3)], watermark=0.0) == [2]
    assert flow.pause_resume() == (frozenset({0, 1}), frozenset())
    flow.forget(0)
    assert len(flow) == 1
    assert flow.release(0, 450.0) == []  # forgotten
    assert flow.release(1, 450.0) == [3]
    assert flow.pause_resume() == (frozenset(), frozenset({1}))  # 0 is gone, not resumed


@pytest.mark.parametrize("ahead_s", [0.0, -1.0, float("inf"), float("nan")])
def test_ahead_must_be_a_positive_finite_number(ahead_s: float) -> None:
    with pytest.raises(ValueError, match="ahead_s"):
        TelemetryPacer[int](ahead_s=ahead_s)
