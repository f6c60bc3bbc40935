"""One rebalance listener for every stage: assignment restores a checkpoint, revocation drops state."""

from __future__ import annotations

from typing import Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition


class PartitionedStage(Protocol):
    async def on_assigned(self, assigned: set[TopicPartition]) -> None: ...

    async def on_revoked(self, revoked: set[TopicPartition]) -> None: ...


class StageRebalanceListener(ConsumerRebalanceListener):
    def __init__(self, stage: PartitionedStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.stage.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.stage.on_assigned(assigned)
