"""Stage 2's completion rule (skewwatch.pipeline.assembler): the min-watermark over input partitions."""

from __future__ import annotations

from typing import Any

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


def test_memory_bound_releases_the_oldest_pending_steps_incomplete() -> None:
    a = StepAssembler(max_pending=3)
    a.add("m", 5.0, "r1", {})
    a.add("m", 5.0, "r1", {"again": True})  # a re-sent summary replaces, it is not held twice
    a.add("n", 10.0, "x", {})
    a.add("m", 10.0, "r1", {})
    assert a.pending == 3 and a.complete() == []  # no input partition reported: nothing is complete
    a.add("n", 15.0, "x", {})
    [step] = a.complete()
    assert (step.model, step.window_end, step.complete, step.payloads) == ("m", 5.0, False, {"r1": {"again": True}})
    assert (a.forced, a.pending) == (1, 3)
    a.add("m", 5.0, "r2", {})  # its step was released: late, not held again
    assert (a.late, a.pending) == (1, 3)
    a.progress(0, 15.0, sources=1)
    assert [(s.model, s.window_end, s.complete) for s in a.complete()] == [("m", 10.0, True), ("n", 10.0, True),
                                                                          ("n", 15.0, True)]
    assert a.pending == 0


def test_worker_payloads_are_decoded_objects_and_checkpoint_as_the_record() -> None:
    from skewwatch.config import WindowSettings
    from skewwatch.pipeline.assembler import ReplicaStepInput
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.schemas.requests.columns import RequestColumns
    from skewwatch.schemas.telemetry_sample import TelemetrySample

    windows = PartitionWindows(WindowSettings())
    ev = dict(model="m", prompt_tokens=10, completion_tokens=20, batch_size=4, batch_capacity=16)
    windows.apply(RequestColumns.from_rows([dict(ev, request_id="a", replica="r1", ts=101.0, latency_ms=100.0)]))
    windows.advance_watermark(105.0)
    [closed] = windows.close_steps()
    sample = TelemetrySample(ts=103.0, replica="r1", source="nvml", memory_used_bytes=1e9, memory_total_bytes=8e9)
    body = {"summary": closed.summary.to_dict(), "features": closed.features.to_dict(),
            "telemetry": sample.to_dict(), "telemetry_stale": False}
    step = ReplicaStepInput.from_body(orjson.loads(orjson.dumps(body)))
    assert step.features == closed.features and step.telemetry == sample
    assert step.summary.to_dict() == closed.summary.to_dict()

    a = StepAssembler()
    a.add("m", 105.0, "r1", step)
    a.progress(0, 100.0, sources=1)
    b = StepAssembler()
    b.load_state(orjson.loads(orjson.dumps(a.state_dict(encode=ReplicaStepInput.to_body))),
                 decode=ReplicaStepInput.from_body)
    assert b.pending == 1
    b.progress(0, 105.0, sources=1)
    [restored] = b.complete()
    got = restored.payloads["r1"]
    assert got.features == step.features and got.telemetry == step.telemetry
    assert got.summary.to_dict() == step.summary.to_dict()


def test_stage2_checkpoint_embeds_pending_records_and_restores_them() -> None:
    """The worker holds a pending replica step as its record's bytes; a checkpoint embeds them as
    JSON (not as a string) and a restore gives the same records back."""
    from skewwatch.agents.model_stage import PartitionModels
    from skewwatch.config import Settings
    from skewwatch.pipeline.decide import DetectorSettings

    body = {"summary": {"v": 1, "x": [1, 2]}, "features": {"model": "m", "replica": "r1", "window_end": 105.0},
            "telemetry": None, "telemetry_stale": False}
    raw = orjson.dumps(body)
    partition = PartitionModels(Settings())
    partition.assembler.add("m", 105.0, "r1", raw)
    snapshot = partition.snapshot()
    assert orjson.loads(snapshot)["assembler"]["models"]["m"]["steps"] == [[105.0, {"r1": body}]]
    restored = PartitionModels.restore(snapshot, Settings(), DetectorSettings())
    [step] = restored.assembler.complete(force_until=105.0)
    assert orjson.loads(step.payloads["r1"]) == body


def test_chunks_count_their_replica_steps_and_a_resent_chunk_replaces() -> None:
    a = StepAssembler(max_pending=10)
    a.add_chunk("m", 5.0, source=0, replicas=4, payload=b"p0")
    a.add_chunk("m", 5.0, source=0, replicas=3, payload=b"p0 again")  # a replay of partition 0's step
    a.add_chunk("m", 5.0, source=0, replicas=2, payload=b"p0 part 1", part=1)
    a.add_chunk("m", 5.0, source=1, replicas=4, payload=b"p1")
    assert a.pending == 9
    a.progress(0, 5.0, sources=2)
    assert a.complete() == []  # partition 1 has not announced step 5 yet
    a.progress(1, 5.0, sources=2)
    [step] = a.complete()
    assert step.chunks == {(0, 0): b"p0 again", (0, 1): b"p0 part 1", (1, 0): b"p1"} and a.pending == 0
    a.add_chunk("m", 5.0, source=1, replicas=4, payload=b"late")
    assert (a.late, a.pending) == (4, 0)


def test_the_memory_bound_counts_replica_steps_in_chunks() -> None:
    a = StepAssembler(max_pending=5)
    a.add_chunk("m", 5.0, source=0, replicas=3, payload=b"a")
    a.add_chunk("m", 10.0, source=0, replicas=3, payload=b"b")
    [step] = a.complete()
    assert (step.window_end, step.complete, a.forced, a.pending) == (5.0, False, 1, 3)


def test_state_with_chunks_round_trips_and_state_without_them_still_loads() -> None:
    a = StepAssembler()
    a.add("m", 5.0, "r1", {"x": 1})
    a.add_chunk("m", 5.0, source=1, replicas=2, payload={"chunk": 1}, part=0)
    a.add_chunk("m", 10.0, source=0, replicas=5, payload={"chunk": 2}, part=1)
    state = orjson.loads(orjson.dumps(a.state_dict()))
    assert state["models"]["m"]["steps"] == [[5.0, {"r1": {"x": 1}}, [[1, 0, 2, {"chunk": 1}]]],
                                             [10.0, {}, [[0, 1, 5, {"chunk": 2}]]]]
    b = StepAssembler()
    b.load_state(state)
    assert b.pending == 8
    [five, ten] = b.complete(force_until=10.0)
    assert (five.payloads, five.chunks) == ({"r1": {"x": 1}}, {(1, 0): {"chunk": 1}})
    assert ten.chunks == {(0, 1): {"chunk": 2}}
    # written before chunks existed: [end, {replica: payload}] only
    old = {"late": 2, "forced": 0, "sources": 1, "source_progress": {"0": 0.0},
           "models": {"m": {"steps": [[5.0, {"r1": {"x": 1}, "r2": {"x": 2}}]], "completed_until": 0.0}}}
    c = StepAssembler()
    c.load_state(old)
    assert (c.pending, c.late) == (2, 2)
    [step] = c.complete(force_until=5.0)
    assert step.payloads == {"r1": {"x": 1}, "r2": {"x": 2}} and step.chunks == {}


def test_stage2_checkpoint_holds_chunks_and_restores_a_checkpoint_from_before_them() -> None:
    from skewwatch.agents.model_stage import PartitionModels
    from skewwatch.config import Settings
    from skewwatch.pipeline.decide import DetectorSettings

    settings, detectors = Settings(), DetectorSettings()
    chunk = b"\x00\x00\x00\x02{}\xff\x00binary"  # the assembler holds a chunk's bytes as they are
    partition = PartitionModels(settings)
    partition.assembler.add_chunk("m", 105.0, source=0, replicas=3, payload=chunk)
    restored = PartitionModels.restore(partition.snapshot(), settings, detectors)
    assert restored.assembler.pending == 3
    [step] = restored.assembler.complete(force_until=105.0)
    assert step.chunks == {(0, 0): chunk}

    # a stage 2 checkpoint as the code before format 2 wrote it (v1: per-replica records, embedded)
    body: dict[str, Any] = {"summary": {"v": 1, "x": [1, 2]},
                            "features": {"model": "m", "replica": "r1", "window_end": 110.0},
                            "telemetry": None, "telemetry_stale": []}
    v1 = orjson.dumps({"v": 1, "assembler": {"late": 0, "forced": 0, "sources": 2, "source_progress": {"0": 105.0},
                                             "models": {"m": {"steps": [[110.0, {"r1": body}]],
                                                              "completed_until": 105.0}}},
                       "deciders": {}})
    old = PartitionModels.restore(v1, settings, detectors)
    assert old.assembler.pending == 1 and old.assembler.source_progress == {0: 105.0}
    [step] = old.assembler.complete(force_until=110.0)
    assert orjson.loads(step.payloads["r1"]) == body and step.chunks == {}
