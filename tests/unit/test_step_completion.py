"""Stage 2's completion rule (skewwatch.pipeline.step_completion): the min-watermark over input partitions.

A model's step arrives as one record (chunk) per input partition holding that partition's replicas of
the model; each test names a chunk by the payload it carries.
"""

from __future__ import annotations

import orjson
import pytest

from skewwatch.pipeline.step_completion import StepAssembler


def test_step_waits_for_every_input_partition() -> None:
    a = StepAssembler()
    a.add_chunk("m", 5.0, source=0, replicas=1, payload="p0@5")
    a.progress(0, 10.0, sources=2)
    assert a.complete() == []  # partition 1 never reported: replicas there may still come
    a.add_chunk("m", 5.0, source=1, replicas=1, payload="p1@5")
    a.add_chunk("m", 10.0, source=0, replicas=1, payload="p0@10")
    a.progress(1, 5.0, sources=2)
    [step] = a.complete()
    assert (step.window_end, sorted(step.chunks.values())) == (5.0, ["p0@5", "p1@5"])
    a.progress(1, 10.0, sources=2)
    assert [(s.window_end, list(s.chunks.values())) for s in a.complete()] == [(10.0, ["p0@10"])]


def test_a_fast_partition_does_not_complete_steps_for_a_slow_one() -> None:
    """The bug this rule exists for: one partition replays far ahead of another."""
    a = StepAssembler()
    for end in range(5, 80, 5):
        a.add_chunk("m", float(end), source=0, replicas=1, payload="fast")
    a.progress(0, 75.0, sources=2)
    assert a.complete() == []
    a.add_chunk("m", 5.0, source=1, replicas=1, payload="slow")
    a.progress(1, 5.0, sources=2)
    [step] = a.complete()
    assert sorted(step.chunks.values()) == ["fast", "slow"]


def test_models_are_independent_and_steps_release_in_order() -> None:
    a = StepAssembler()
    a.add_chunk("a", 10.0, source=0, replicas=1, payload="")
    a.add_chunk("b", 5.0, source=0, replicas=1, payload="")
    a.add_chunk("a", 5.0, source=0, replicas=1, payload="")
    a.progress(0, 10.0, sources=1)
    assert sorted((s.model, s.window_end) for s in a.complete()) == [("a", 5.0), ("a", 10.0), ("b", 5.0)]


def test_a_late_record_for_a_completed_step_is_counted_not_applied() -> None:
    a = StepAssembler()
    a.add_chunk("m", 5.0, source=0, replicas=1, payload="")
    a.progress(0, 5.0, sources=1)
    a.complete()
    a.add_chunk("m", 5.0, source=0, replicas=3, payload="again")
    assert a.late == 3 and a.complete() == []


def test_forced_completion() -> None:
    a = StepAssembler()
    a.add_chunk("m", 5.0, source=0, replicas=1, payload="")
    assert a.complete() == []
    assert [s.window_end for s in a.complete(force_until=5.0)] == [5.0]
    assert a.oldest_pending() is None


def test_state_round_trips_through_json() -> None:
    a = StepAssembler()
    a.add_chunk("m", 5.0, source=0, replicas=2, payload={"x": 1})
    a.progress(0, 5.0, sources=2)
    b = StepAssembler()
    b.load_state(orjson.loads(orjson.dumps(a.state_dict())))
    assert (b.pending, b.sources, b.source_progress) == (2, 2, {0: 5.0})
    for x in (a, b):
        x.add_chunk("m", 5.0, source=1, replicas=1, payload={"x": 2})
        x.progress(1, 5.0, sources=2)
    assert [(s.window_end, s.chunks) for s in a.complete()] == [(s.window_end, s.chunks) for s in b.complete()]


def test_memory_bound_releases_the_oldest_pending_steps_incomplete() -> None:
    a = StepAssembler(max_pending=3)
    a.add_chunk("m", 5.0, source=0, replicas=1, payload="first")
    a.add_chunk("m", 5.0, source=0, replicas=1, payload="again")  # a re-sent record replaces, not held twice
    a.add_chunk("n", 10.0, source=0, replicas=1, payload="")
    a.add_chunk("m", 10.0, source=0, replicas=1, payload="")
    assert a.pending == 3 and a.complete() == []  # no input partition reported: nothing is complete
    a.add_chunk("n", 15.0, source=0, replicas=1, payload="")
    [step] = a.complete()
    assert (step.model, step.window_end, step.complete, step.chunks) == ("m", 5.0, False, {(0, 0): "again"})
    assert (a.forced, a.pending) == (1, 3)
    a.add_chunk("m", 5.0, source=1, replicas=1, payload="")  # its step was released: late, not held again
    assert (a.late, a.pending) == (1, 3)
    a.progress(0, 15.0, sources=1)
    assert [(s.model, s.window_end, s.complete) for s in a.complete()] == [("m", 10.0, True), ("n", 10.0, True),
                                                                          ("n", 15.0, True)]
    assert a.pending == 0


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


def test_state_with_chunks_round_trips_and_another_layout_is_refused() -> None:
    a = StepAssembler()
    a.add_chunk("m", 5.0, source=1, replicas=2, payload={"chunk": 1}, part=0)
    a.add_chunk("m", 10.0, source=0, replicas=5, payload={"chunk": 2}, part=1)
    state = orjson.loads(orjson.dumps(a.state_dict()))
    assert state["models"]["m"]["steps"] == [[5.0, [[1, 0, 2, {"chunk": 1}]]], [10.0, [[0, 1, 5, {"chunk": 2}]]]]
    b = StepAssembler()
    b.load_state(state)
    assert b.pending == 7
    [five, ten] = b.complete(force_until=10.0)
    assert five.chunks == {(1, 0): {"chunk": 1}} and ten.chunks == {(0, 1): {"chunk": 2}}
    # a pending step of one record per replica ({replica: record}): not this layout
    other = {"late": 2, "forced": 0, "sources": 1, "source_progress": {"0": 0.0},
             "models": {"m": {"steps": [[5.0, {"r1": {"x": 1}}]], "completed_until": 0.0}}}
    c = StepAssembler()
    with pytest.raises(ValueError, match="step assembler state"):
        c.load_state(other)
    assert (c.pending, c.models) == (0, {})  # nothing half-loaded


def test_stage2_checkpoint_holds_records_and_decodes_them_when_the_step_completes() -> None:
    """The worker holds a pending record as its bytes; a checkpoint embeds them (base64) and a restore
    gives the same bytes back, which decode to the replica steps stage 1 closed, telemetry included."""
    from skewwatch.agents.model_stage import PartitionModels
    from skewwatch.config import Settings, WindowSettings
    from skewwatch.pipeline.detector_settings import DetectorSettings
    from skewwatch.pipeline.replica_step_record import encode_model_step, model_step_inputs
    from skewwatch.pipeline.window import PartitionWindows
    from skewwatch.schemas.requests.columns import RequestColumns
    from skewwatch.schemas.telemetry_sample import TelemetrySample

    windows = PartitionWindows(WindowSettings())
    ev = dict(model="m", prompt_tokens=10, completion_tokens=20, batch_size=4, batch_capacity=16)
    windows.apply(RequestColumns.from_rows([dict(ev, request_id="a", replica="r1", ts=101.0, latency_ms=100.0)]))
    windows.advance_watermark(105.0)
    [batch] = windows.close_steps().batches
    [closed] = batch.replica_steps()
    [summary] = batch.merged(list(batch.model_rows().values()))
    sample = TelemetrySample(ts=103.0, replica="r1", source="nvml", memory_used_bytes=1e9, memory_total_bytes=8e9)
    record = encode_model_step("m", 105.0, 0, [closed.features], summary, [sample], [[]])

    settings, detectors = Settings(), DetectorSettings()
    partition = PartitionModels(settings)
    partition.assembler.add_chunk("m", 105.0, source=0, replicas=1, payload=record)
    partition.assembler.progress(0, 100.0, sources=1)
    restored = PartitionModels.restore(partition.snapshot(), settings, detectors)
    assert restored.assembler.pending == 1
    restored.assembler.progress(0, 105.0, sources=1)
    [step] = restored.assembler.complete()
    assert step.chunks == {(0, 0): record}
    inputs, [got_summary], _ = model_step_inputs(step)
    got = inputs["r1"]
    assert got.features == closed.features and got.telemetry == sample
    assert got_summary.to_dict() == summary.to_dict() and got_summary.count == closed.summary.count == 1


def test_stage2_checkpoint_of_another_version_is_refused() -> None:
    from skewwatch.agents.model_stage import PartitionModels
    from skewwatch.config import Settings
    from skewwatch.pipeline.detector_settings import DetectorSettings

    settings, detectors = Settings(), DetectorSettings()
    chunk = b"\x00\x00\x00\x02{}\xff\x00binary"  # the assembler holds a chunk's bytes as they are
    partition = PartitionModels(settings)
    partition.assembler.add_chunk("m", 105.0, source=0, replicas=3, payload=chunk)
    snapshot = orjson.loads(partition.snapshot())
    assert PartitionModels.restore(orjson.dumps(snapshot), settings, detectors).assembler.pending == 3
    for version in (1, 2, None):
        with pytest.raises(ValueError, match="unsupported version"):
            PartitionModels.restore(orjson.dumps({**snapshot, "v": version}), settings, detectors)
    with pytest.raises(ValueError, match="unsupported version"):
        PartitionModels.restore(b"[]", settings, detectors)


def test_a_model_without_records_still_gets_its_steps_empty() -> None:
    a = StepAssembler()
    for model in ("quiet", "busy"):
        a.add_chunk(model, 10.0, source=0, replicas=1, payload=b"r")
    a.progress(source=0, closed_end=10.0, sources=1)
    assert [(s.model, s.window_end) for s in a.complete(step_s=5.0)] == [("quiet", 10.0), ("busy", 10.0)]
    # only busy reports from here on; the min-watermark passes 25: quiet gets 15, 20, 25 empty
    for end in (15.0, 20.0, 25.0):
        a.add_chunk("busy", end, source=0, replicas=1, payload=b"r")
    a.progress(source=0, closed_end=25.0, sources=1)
    steps = a.complete(step_s=5.0)
    assert [(s.model, s.window_end, len(s.chunks)) for s in steps] == [
        ("quiet", 15.0, 0), ("quiet", 20.0, 0), ("quiet", 25.0, 0),
        ("busy", 15.0, 1), ("busy", 20.0, 1), ("busy", 25.0, 1)]
    assert all(s.complete for s in steps)
    # a record for a step released empty comes late: counted, dropped
    a.add_chunk("quiet", 20.0, source=0, replicas=1, payload=b"r")
    assert a.late == 1 and a.pending == 0
    # without the step length (the memory bound's path) nothing is made up
    a.progress(source=0, closed_end=40.0, sources=1)
    assert a.complete() == [] and a.newest_end() == 25.0
    # the state keeps where each model's steps stand
    b = StepAssembler()
    b.load_state(a.state_dict())
    assert [(s.model, s.window_end) for s in b.complete(step_s=5.0)][:2] == [("quiet", 30.0), ("quiet", 35.0)]
