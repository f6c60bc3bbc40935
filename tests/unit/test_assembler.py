"""Stage 2's completion rule (skewwatch.pipeline.assembler)."""

from __future__ import annotations

import orjson

from skewwatch.pipeline.assembler import StepAssembler


def _assembler() -> StepAssembler:
    return StepAssembler(step_s=5.0, grace_steps=1, forget_after_s=30.0)


def test_step_waits_for_every_known_replica() -> None:
    a = _assembler()
    for end in (5.0, 10.0):
        a.add("m", end, "r1", {})
        a.add("m", end, "r2", {})
    assert [s.window_end for s in a.complete()] == [5.0, 10.0]
    a.add("m", 15.0, "r1", {})
    assert a.complete() == []  # r2 is known and missing, no newer step yet
    a.add("m", 15.0, "r2", {})
    [step] = a.complete()
    assert step.window_end == 15.0 and set(step.payloads) == {"r1", "r2"}


def test_missing_replica_does_not_stall_the_model() -> None:
    a = _assembler()
    a.add("m", 5.0, "r1", {})
    a.add("m", 5.0, "r2", {})
    a.complete()
    a.add("m", 10.0, "r1", {})
    a.add("m", 15.0, "r1", {})
    steps = a.complete()
    assert [(s.window_end, sorted(s.payloads)) for s in steps] == [(10.0, ["r1"])]
    assert a.oldest_pending() == 15.0


def test_models_are_independent_and_steps_release_in_order() -> None:
    a = _assembler()
    a.add("a", 10.0, "r1", {})
    a.add("b", 5.0, "x", {})
    a.add("a", 5.0, "r1", {})
    done = sorted((s.model, s.window_end) for s in a.complete())
    assert done == [("a", 5.0), ("a", 10.0), ("b", 5.0)]


def test_late_summary_for_a_completed_step_is_counted_not_applied() -> None:
    a = _assembler()
    a.add("m", 5.0, "r1", {})
    a.complete()
    a.add("m", 5.0, "r2", {})
    assert a.late == 1 and a.complete() == []


def test_forced_completion_and_forgetting() -> None:
    a = _assembler()
    a.add("m", 5.0, "r1", {})
    a.add("m", 5.0, "r2", {})
    a.complete()
    a.add("m", 10.0, "r1", {})
    assert a.complete() == []
    assert [s.window_end for s in a.complete(force_until=10.0)] == [10.0]
    for end in range(15, 60, 5):  # r2 silent for longer than forget_after_s: no longer awaited
        a.add("m", float(end), "r1", {})
    a.complete()
    assert "r2" not in a.models["m"].last_seen


def test_state_round_trips_through_json() -> None:
    a = _assembler()
    a.add("m", 5.0, "r1", {"x": 1})
    a.add("m", 5.0, "r2", {"x": 2})
    a.complete()
    a.add("m", 10.0, "r1", {"x": 3})
    b = _assembler()
    b.load_state(orjson.loads(orjson.dumps(a.state_dict())))
    for x in (a, b):
        x.add("m", 10.0, "r2", {"x": 4})
    assert [(s.window_end, s.payloads) for s in a.complete()] == [(s.window_end, s.payloads) for s in b.complete()]
