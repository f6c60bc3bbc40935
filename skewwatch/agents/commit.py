"""When a stage's partition is saved: outputs acknowledged, then its checkpoint, then its offset.

Both stages follow one rule per input partition (Kafka Streams' commit, Flink's checkpoint):

1. a step close *sends* its outputs; :meth:`CommitPipeline.sent` hands their futures over and
   marks the partition unsaved;
2. at most every ``limits.checkpoint_interval_s`` of wall time (a catch-up closes many steps a
   second; 0: at every close), and whenever the partition is revoked or the stage stops,
   :meth:`CommitPipeline.save` snapshots the partition's state with the input offset it covers;
3. in the background, in order per partition (:class:`~skewwatch.agents.acks.OrderedAcks`), once
   the broker has acknowledged every output sent before the snapshot (dead letters included), the
   checkpoint is written (:class:`~skewwatch.agents.checkpoint.CheckpointStore`), and once that is
   acknowledged the offset is handed to :meth:`CommitPipeline.take_commits` for the group commit.

A checkpoint therefore never covers an output the broker did not store, and a restart replays at
most one interval of input (its outputs are published again: delivery is at least once).

>>> import asyncio
>>> from skewwatch.config import LimitSettings
>>> class Store:  # stands in for CheckpointStore: records what it is asked to write
...     writes: list[tuple[int, int]] = []
...     async def write(self, topic: str, partition: int, offset: int, state: bytes) -> None:
...         self.writes.append((partition, offset))
>>> async def demo() -> tuple[list[tuple[int, int]], list[tuple[int, int]], dict[TopicPartition, int]]:
...     commits = CommitPipeline(Store(), "llm.requests", LimitSettings())  # type: ignore[arg-type]
...     output = asyncio.get_running_loop().create_future()  # a send the broker has not acknowledged
...     await commits.sent(0, [output])
...     await commits.save(0, 42, lambda: b"state")
...     await asyncio.sleep(0)
...     before = list(Store.writes)
...     output.set_result(None)  # the broker acknowledges
...     await commits.drain()
...     return before, Store.writes, commits.take_commits()
>>> asyncio.run(demo())
([], [(0, 42)], {TopicPartition(topic='llm.requests', partition=0): 42})
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from skewwatch.agents.acks import OrderedAcks
from skewwatch.agents.checkpoint import CheckpointStore
from skewwatch.config import LimitSettings

Sent = list["asyncio.Future[Any]"]
# a partition's state to save: (the offset it covers, its snapshot's encoder), or None (not owned)
Snapshot = tuple[int | None, Callable[[], bytes]]

log = logging.getLogger(__name__)


async def commit_offsets(consumer: AIOKafkaConsumer | None, offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` to the group; a failure (a rebalance in progress) is only logged: the
    checkpoint, not the group offset, is where a restart resumes."""
    if not offsets or consumer is None:
        return
    try:
        await consumer.commit(offsets)
    except Exception as exc:
        log.warning("offset commit failed (rebalance in progress?): %s", exc)


class CommitPipeline:
    """One stage's per-partition saving: see the module docstring. ``on_saved``: called per checkpoint
    written (a metric)."""

    def __init__(self, store: CheckpointStore, topic: str, limits: LimitSettings,
                 on_saved: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.topic = topic
        self.interval_s = limits.checkpoint_interval_s
        self.acks = OrderedAcks[int](max_pending=limits.max_unacked_closes)
        self.on_saved = on_saved
        self._unsent: dict[int, Sent] = {}  # futures not yet part of a job (dead letters between closes)
        self._unsaved: set[int] = set()
        self._saved_at: dict[int, float] = {}  # monotonic time of the last save per partition
        # partitions with a checkpoint queued and not yet written: at most one snapshot held per
        # partition (~1.4 KB per replica: ~2 MB for 1,250 replicas), however slow the broker
        self._saving: set[int] = set()
        self._to_commit: dict[TopicPartition, int] = {}

    def unsaved(self) -> set[int]:
        """Partitions whose newest state is not checkpointed."""
        return set(self._unsaved)

    def hold(self, partition: int, future: asyncio.Future[Any]) -> None:
        """An output of ``partition`` sent outside a close (a dead letter): the next checkpoint waits for it."""
        self._unsent.setdefault(partition, []).append(future)

    async def sent(self, partition: int, futures: Sent, *, changed: bool = True) -> None:
        """A close of ``partition`` sent ``futures``; ``changed``: its state is now unsaved."""
        if changed:
            self._unsaved.add(partition)
        if futures:
            await self.acks.submit(partition, lambda: self._acknowledged(partition, futures, None))

    def due(self, partition: int) -> bool:
        """Unsaved, no checkpoint of it in flight, and the interval since its last save has passed."""
        return partition in self._unsaved and partition not in self._saving and (
            time.monotonic() - self._saved_at.get(partition, -math.inf) >= self.interval_s)

    async def save(self, partition: int, offset: int | None, snapshot: Callable[[], bytes]) -> bool:
        """Snapshot ``partition`` (its state covers input before ``offset``) and queue its checkpoint
        after everything it sent; False (nothing queued) when there is no offset yet. Waits for the
        partition's checkpoint in flight, if any, first (call :meth:`due` not to)."""
        if offset is None:
            return False
        if partition in self._saving:
            await self.acks.drain([partition])
        futures = self._unsent.pop(partition, [])
        state = snapshot()
        self._unsaved.discard(partition)
        self._saved_at[partition] = time.monotonic()
        self._saving.add(partition)
        await self.acks.submit(partition, lambda: self._acknowledged(partition, futures, (offset, state)))
        return True

    async def save_due(self, snapshot_of: Callable[[int], Snapshot | None], *, force: bool = False,
                       partitions: Iterable[int] | None = None) -> None:
        """Save the unsaved partitions (of ``partitions``; None: all) whose interval has passed, or all
        of them with ``force`` (revoke, stop). Call it between polls, where a partition's state matches
        its offset; ``snapshot_of(partition)`` says what to save."""
        unsaved = set(self._unsaved)
        for partition in unsaved if partitions is None else partitions:
            if partition in unsaved and (force or self.due(partition)):
                found = snapshot_of(partition)
                if found is not None:
                    await self.save(partition, *found)

    def take_commits(self) -> dict[TopicPartition, int]:
        """The offsets whose checkpoints are written since the last call."""
        commits, self._to_commit = self._to_commit, {}
        return commits

    def raise_failure(self) -> None:
        """Raise a refused send or checkpoint write (the stage then restarts from its last checkpoint)."""
        self.acks.raise_failure()

    async def drain(self, partitions: Iterable[int] | None = None) -> None:
        """Wait for the jobs of ``partitions`` (None: all)."""
        await self.acks.drain(partitions)

    def forget(self, partitions: Iterable[int]) -> None:
        """``partitions`` were revoked (after :meth:`drain`): drop their bookkeeping."""
        for partition in partitions:
            self._unsaved.discard(partition)
            self._unsent.pop(partition, None)
            self._saved_at.pop(partition, None)
            self._saving.discard(partition)
            self._to_commit.pop(TopicPartition(self.topic, partition), None)

    def cancel(self) -> None:
        self.acks.cancel()

    async def _acknowledged(self, partition: int, futures: Sent, checkpoint: tuple[int, bytes] | None) -> None:
        try:
            await asyncio.gather(*futures)
            if checkpoint is None:
                return
            offset, state = checkpoint
            await self.store.write(self.topic, partition, offset, state)
        finally:
            if checkpoint is not None:
                self._saving.discard(partition)
        self.on_saved()
        self._to_commit[TopicPartition(self.topic, partition)] = offset
