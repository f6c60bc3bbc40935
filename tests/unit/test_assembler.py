"""Stage 2's completion rule (skewwatch.pipeline.assembler): the min-watermark over input partitions."""

from __future__ import annotations

import orjson

from skewwatch.pipeline.assembler import StepAssembler


def test_step_waits_for_every_input_partition() -> None:
    a = StepAssembler()
    a.add("m", 5.0, "r1", {})
    a.progress(0, 10.0, sources=2)
    assert a.complete() == []  # partition 1 never reported: a replica there may still come
    a.add("m", 5.0, "r2", {})
    a.add("m", 10.0, "r1", {})
    a.progress(1, 5.0, sources=2)
    [step] = a.complete()
    assert (step.window_end, sorted(step.payloads)) == (5.0, ["r1", "r2"])
    a.progress(1, 10.0, sources=2)
    assert [(s.window_end, sorted(s.payloads)) for s in a.complete()] == [(10.0, ["r1"])]


def test_a_fast_partition_does_not_complete_steps_for_a_slow_one() -> None:
    """The bug this rule exists for: one partition replays far ahead of another."""
    a = StepAssembler()
    for end in range(5, 80, 5):
        a.add("m", float(end), "fast", {})
    a.progress(0, 75.0, sources=2)
    assert a.complete() == []
    a.add("m", 5.0, "slow", {})
    a.progress(1, 5.0, sources=2)
    [step] = a.complete()
    assert sorted(step.payloads) == ["fast", "slow"]


def test_models_are_independent_and_steps_release_in_order() -> None:
    a = StepAssembler()
    a.add("a", 10.0, "r1", {})
    a.add("b", 5.0, "x", {})
    a.add("a", 5.0, "r1", {})
    a.progress(0, 10.0, sources=1)
    assert sorted((s.model, s.window_end) for s in a.complete()) == [("a", 5.0), ("a", 10.0), ("b", 5.0)]


def test_late_summary_for_a_completed_step_is_counted_not_applied() -> None:
    a = StepAssembler()
    a.add("m", 5.0, "r1", {})
    a.progress(0, 5.0, sources=1)
    a.complete()
    a.add("m", 5.0, "r2", {})
    assert a.late == 1 and a.complete() == []


def test_forced_completion() -> None:
    a = StepAssembler()
    a.add("m", 5.0, "r1", {})
    assert a.complete() == []
    assert [s.window_end for s in a.complete(force_until=5.0)] == [5.0]
    assert a.oldest_pending() is None


def test_state_round_trips_through_json() -> None:
    a = StepAssembler()
    a.add("m", 5.0, "r1", {"x": 1})
    a.progress(0, 5.0, sources=2)
    b = StepAssembler()
    b.load_state(orjson.loads(orjson.dumps(a.state_dict())))
    for x in (a, b):
        x.add("m", 5.0, "r2", {"x": 2})
        x.progress(1, 5.0, sources=2)
    assert [(s.window_end, s.payloads) for s in a.complete()] == [(s.window_end, s.payloads) for s in b.complete()]
