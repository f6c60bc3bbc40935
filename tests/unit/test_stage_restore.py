"""CheckpointedStage around a rebalance: a poll fetched before a partition's restore is never applied twice,
and a failed restore restarts the stage instead of leaving a partition without state.

aiokafka makes a new assignment fetchable before the assignment callback has run, so a poll from the
group's committed offset (older than the checkpoint's) can reach ``handle`` right after ``on_assigned``
restored the partition from its checkpoint. Found by the scale-out test (three workers, a rolling
restart): some windows counted events twice.
"""

from __future__ import annotations

import asyncio
from collections import namedtuple
from typing import Any

import pytest
from aiokafka import TopicPartition

from skewwatch.agents.checkpoint import Checkpoint
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.stage import CheckpointedStage
from skewwatch.config import Settings

Record = namedtuple("Record", "offset value")
IN, OTHER = TopicPartition("in", 0), TopicPartition("other", 0)


class State:
    def __init__(self, next_offset: int | None) -> None:
        self.next_offset = next_offset

    def snapshot(self) -> bytes:
        return b""


class FakeConsumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def commit(self, offsets: Any) -> None:
        pass


class Checkpoints:
    def __init__(self, found: dict[int, Checkpoint] | Exception) -> None:
        self.found = found

    async def read(self, topic: str, partitions: list[int]) -> dict[int, Checkpoint]:
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


class Recorder(CheckpointedStage[State]):
    stage = "test"

    def __init__(self) -> None:
        super().__init__(Settings(), "127.0.0.1:9", None, WorkerMetrics())  # type: ignore[arg-type]
        self.applied: dict[TopicPartition, list[int]] = {}

    @property
    def input_topic(self) -> str:
        return "in"

    def topics(self) -> list[str]:
        return ["in", "other"]

    def new_partition(self, partition: int) -> State:
        return State(None)

    def restore_partition(self, partition: int, checkpoint: Checkpoint) -> State:
        return State(checkpoint.offset)

    async def process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        for tp, messages in batches.items():
            self.applied.setdefault(tp, []).extend(m.offset for m in messages)


def records(*offsets: int) -> list[Record]:
    return [Record(o, b"") for o in offsets]


def test_a_poll_from_before_the_restore_is_applied_from_the_checkpoint_offset_on() -> None:
    async def scenario() -> tuple[Recorder, FakeConsumer]:
        stage = Recorder()
        stage.consumer = consumer = FakeConsumer({IN, OTHER})  # type: ignore[assignment]
        stage.checkpoints = Checkpoints({0: Checkpoint(offset=10, generation=1, state=b"")})  # type: ignore[assignment]
        await stage.on_assigned({IN})  # restored at 10, sought there
        # the poll the consumer fetched from the committed offset (7) while the checkpoint was read
        await stage.handle({IN: records(7, 8, 9, 10, 11), OTHER: records(3)})
        return stage, consumer

    stage, consumer = asyncio.run(scenario())
    assert stage.applied == {IN: [10, 11], OTHER: [3]}  # 7-9 are in the checkpoint's state already
    assert consumer.seeks == [(IN, 10)]


def test_a_poll_for_a_partition_not_restored_yet_is_read_again() -> None:
    async def scenario() -> tuple[Recorder, FakeConsumer]:
        stage = Recorder()
        stage.consumer = consumer = FakeConsumer({IN})  # type: ignore[assignment]
        await stage.handle({IN: records(0, 1, 2)})  # assigned, its callback still to come
        return stage, consumer

    stage, consumer = asyncio.run(scenario())
    assert stage.applied.get(IN, []) == []
    assert consumer.seeks == [(IN, 0)]  # not skipped: a partition without a checkpoint reads them next


def test_a_failed_restore_stops_the_stage_at_the_next_poll() -> None:
    async def scenario() -> Recorder:
        stage = Recorder()
        stage.consumer = FakeConsumer({IN})  # type: ignore[assignment]
        stage.checkpoints = Checkpoints(ConnectionError("broker gone"))  # type: ignore[assignment]
        with pytest.raises(ConnectionError):
            await stage.on_assigned({IN})  # aiokafka would only log this
        return stage

    stage = asyncio.run(scenario())
    with pytest.raises(ConnectionError):
        stage.before_poll()  # the supervisor restarts the stage from its checkpoints
    stage.before_poll()  # raised once
