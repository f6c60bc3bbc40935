"""One base for the worker's consumer stages: the consumer, the poll loop, and partition ownership.

Each stage owns one aiokafka consumer (the hot path does not go through a Faust stream) in its
own consumer group, ``<kafka.group_id>.<stage>``. :class:`Stage` creates and subscribes it, polls
with ``getmany`` until :meth:`~Stage.stop`, and hands each poll to :meth:`~Stage.handle`; a
subclass keeps only what it does with a poll.

:class:`CheckpointedStage` adds what a stage with state per input partition shares: on
assignment, each partition's state is restored from its last checkpoint (and the consumer sought
to the offset it covers) or started empty; each poll is processed under a lock the rebalance
callbacks also take, then the checkpoints that are due are written and the offsets they cover
committed (:class:`~skewwatch.agents.commit.CommitPipeline`: outputs acknowledged, then the
checkpoint, then the offset); on revocation and on a clean stop, the newest state is checkpointed
before anyone else reads it.

The loop's own work is per poll, nothing per message: a poll holds up to ``max_records`` records,
and whatever the loop did per message every event on the hot path would pay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from skewwatch.agents.checkpoint import Checkpoint, CheckpointStore
from skewwatch.agents.commit import CommitPipeline, Snapshot, commit_offsets
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.rebalance import StageRebalanceListener
from skewwatch.agents.rejects import RejectLog
from skewwatch.config import Settings
from skewwatch.errors import SkewwatchError
from skewwatch.kafka_client import client_kwargs, group_consumer_kwargs
from skewwatch.schemas.dead_letter import dead_letter_record
from skewwatch.schemas.rejection import Rejection

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 200  # a poll returns after this long without records: idle work and stop run on time


class StageBusy(SkewwatchError):
    """A stage's lock was not free in time; the message says why (restoring partitions, or a poll)."""

    retriable = True  # the lock frees once the restore or the poll holding it ends


class Stage(ABC):
    """A consumer stage: its consumer, the poll loop, and a clean stop.

    ``stage`` names it in its consumer group (``<group_id>.<stage>``), client id, metrics and
    checkpoint keys; these names are part of what a running deployment has stored (committed
    offsets, checkpoints), so they do not change with the code's names.
    """

    stage: ClassVar[str]
    max_records: ClassVar[int] = 20_000  # per poll
    consumer_options: ClassVar[dict[str, Any]] = {}  # the stage's own AIOKafkaConsumer options

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.producer = producer
        self.metrics = metrics
        self.connection = client_kwargs(settings.kafka, bootstrap=bootstrap)  # how every client reaches Kafka
        self.consumer: AIOKafkaConsumer | None = None
        self.ready = asyncio.Event()  # set once the stage polls with partitions assigned (or records)
        self._stopping = asyncio.Event()
        self.rejects = RejectLog(self.stage, settings.topics.dead_letter)  # a log line per 30 s about rejects

    @abstractmethod
    def topics(self) -> list[str]:
        """The topics the stage subscribes to."""

    @abstractmethod
    async def handle(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Process one poll (possibly empty: idle work runs on every poll)."""

    def rebalance_listener(self) -> ConsumerRebalanceListener | None:
        """Called on partition assignment and revocation; None: nothing to do then."""
        return None

    def before_poll(self) -> None:  # noqa: B027 - a hook: nothing by default
        """Runs before every poll (e.g. raise a failure noticed in the background)."""

    async def finish(self) -> None:  # noqa: B027 - a hook: nothing by default
        """A clean stop, before the consumer closes (e.g. a last checkpoint and commit)."""

    def close(self) -> None:  # noqa: B027 - a hook: nothing by default
        """Always runs when the loop ends, cleanly or not, before the consumer closes."""

    async def dead_letter(self, tp: TopicPartition, message: Any, rejects: list[Rejection]) -> asyncio.Future[Any]:
        """One rejected input ``message`` (its key, value and offset) to the dead-letter topic, with its
        original bytes and the reasons, each counted; returns the send's future (not waited for)."""
        for reject in rejects:
            self.metrics.rejected.labels(reject.reason_code).inc()
        self.rejects.add(rejects)
        record = dead_letter_record(source_topic=tp.topic, partition=tp.partition, offset=message.offset,
                                    key=message.key, value=message.value, rejects=rejects, ts=time.time())
        return await self.producer.send(self.settings.topics.dead_letter, key=message.key, value=record)

    def new_consumer(self) -> AIOKafkaConsumer:
        """The stage's consumer: manual commits, from the earliest offset when none is committed."""
        kafka = self.settings.kafka
        return AIOKafkaConsumer(
            **group_consumer_kwargs(kafka, bootstrap=self.bootstrap),  # the connection, and the group's timeouts
            group_id=f"{kafka.group_id}.{self.stage}",
            client_id=f"{kafka.client_id}-{self.stage}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self.consumer_options,
        )

    async def run(self) -> None:
        """Poll and handle until :meth:`stop`; then :meth:`finish`. An exception ends the run (the
        worker's supervisor rebuilds the stage from its last checkpoint)."""
        consumer = self.consumer = self.new_consumer()
        await consumer.start()
        listener = self.rebalance_listener()
        if listener is None:
            consumer.subscribe(self.topics())
        else:
            consumer.subscribe(self.topics(), listener=listener)
        try:
            while not self._stopping.is_set():
                self.before_poll()
                batches = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=self.max_records)
                await self.handle(batches)
                self.rejects.flush_due()
                if batches or consumer.assignment():
                    self.ready.set()
            await self.finish()
        finally:
            self.rejects.flush()
            self.close()
            await consumer.stop()

    def stop(self) -> None:
        """Ask the loop to end after the current poll (the stop is clean: :meth:`finish` runs)."""
        self._stopping.set()


def unseen_records(messages: list[Any], next_offset: int | None) -> list[Any]:
    """The records of one partition's poll at or after ``next_offset``, the first input offset the
    partition's state does not reflect (None: it reflects none, all are new).

    >>> from collections import namedtuple
    >>> Record = namedtuple("Record", "offset")
    >>> [r.offset for r in unseen_records([Record(5), Record(6), Record(7)], next_offset=6)]
    [6, 7]
    """
    if next_offset is None or not messages or messages[0].offset >= next_offset:
        return messages
    return [m for m in messages if m.offset >= next_offset]


class PartitionCheckpoint(Protocol):
    """What a checkpointed stage keeps per input partition: the first input offset its state does
    not reflect yet, and the state's snapshot (bytes, restored by the stage's ``restore_partition``)."""

    next_offset: int | None

    def snapshot(self) -> bytes: ...


P = TypeVar("P", bound=PartitionCheckpoint)


class CheckpointedStage(Stage, Generic[P]):
    """A stage with state per partition of ``input_topic``, checkpointed with the offset it covers."""

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        super().__init__(settings, bootstrap, producer, metrics)
        self.partitions: dict[int, P] = {}
        self.checkpoints = CheckpointStore(producer, self.connection, settings.topics.checkpoints, self.stage)
        # per input partition: outputs acknowledged, then the checkpoint, then the offset; off the hot path
        self.commits = CommitPipeline(self.checkpoints, self.input_topic, settings.limits,
                                      on_saved=metrics.checkpoints.labels(self.stage).inc)
        self._lock = asyncio.Lock()
        self._in_callback = False  # an assignment or revocation callback is running
        self._rebalance_failure: BaseException | None = None  # raised by the next before_poll

    # -- what a checkpointed stage provides

    @property
    @abstractmethod
    def input_topic(self) -> str:
        """The topic whose partitions carry the stage's state."""

    @abstractmethod
    def new_partition(self, partition: int) -> P:
        """Empty state for a partition without a checkpoint."""

    @abstractmethod
    def restore_partition(self, partition: int, checkpoint: Checkpoint) -> P:
        """State rebuilt from a partition's checkpoint (its ``next_offset`` = ``checkpoint.offset``)."""

    @abstractmethod
    async def process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Process one poll; runs under the lock, so no rebalance callback interleaves."""

    def revoked(self, revoked: set[TopicPartition]) -> None:
        """Partitions of other topics than ``input_topic`` were revoked (under the lock)."""

    async def restored(self, starts: dict[int, int | None]) -> None:  # noqa: B027 - a hook: nothing by default
        """Input partitions were assigned and their state restored (under the lock, before any poll of
        them is processed); ``starts``: the offset each is replayed from (None: its beginning)."""

    # -- the machinery

    @property
    def restoring(self) -> bool:
        """True while a rebalance callback runs or an assigned input partition has no state yet.

        aiokafka reports a new assignment (``consumer.assignment()``) before the assignment callback
        has restored it: readiness and the POST ask this instead, so "has partitions" means "has
        them restored", and a caller held up by the lock can be told why.
        """
        consumer = self.consumer
        if self._in_callback:
            return True
        if consumer is None:
            return False
        return any(tp.partition not in self.partitions for tp in consumer.assignment()
                   if tp.topic == self.input_topic)

    async def acquire(self, timeout_s: float | None) -> bool:
        """Take the stage's lock (held by each poll's processing and by the rebalance callbacks) within
        ``timeout_s`` (None: wait as long as it takes); False when it was not free by then. The caller
        releases it with :meth:`release`."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._lock.acquire()
        except TimeoutError:
            return False
        return True

    def release(self) -> None:
        """Release the lock taken by :meth:`acquire`."""
        self._lock.release()

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        return StageRebalanceListener(self)

    def before_poll(self) -> None:
        self.commits.raise_failure()  # a refused send or checkpoint: restart from the last checkpoint
        failure, self._rebalance_failure = self._rebalance_failure, None
        if failure is not None:  # aiokafka only logs a failed callback: the stage restarts instead
            raise failure

    async def handle(self, batches: dict[TopicPartition, list[Any]]) -> None:
        async with self._lock:
            await self.process(self._unseen(batches))
            await self.commits.save_due(self._snapshot_of)  # a partition gone quiet is saved too
            commits = self.commits.take_commits()
        # outside the lock: a commit may wait for a rebalance whose callbacks take the lock
        assert self.consumer is not None
        await commit_offsets(self.consumer, commits)

    async def finish(self) -> None:
        async with self._lock:  # a clean stop: the newest state is checkpointed, and every checkpoint
            await self.commits.save_due(self._snapshot_of, force=True)  # in flight is written
        await self.commits.drain()
        assert self.consumer is not None
        await commit_offsets(self.consumer, self.commits.take_commits())

    def close(self) -> None:
        self.commits.cancel()

    def _unseen(self, batches: dict[TopicPartition, list[Any]]) -> dict[TopicPartition, list[Any]]:
        """The poll without what the partitions' state already reflects (runs under the lock).

        aiokafka makes a new assignment fetchable before the assignment callback has run: while
        :meth:`on_assigned` reads the checkpoints, the consumer may fetch from the group's committed
        offset, which lags the checkpoint's, and that poll is handed over only after the callback
        restored the state and sought to the checkpoint's offset. Applying it would count those
        events twice. So records below a partition's ``next_offset`` are dropped, and a partition
        without state yet (its callback still to come) is rewound to its first record, which the
        callback's seek overrides when a checkpoint exists.
        """
        out: dict[TopicPartition, list[Any]] = {}
        consumer = self.consumer
        for tp, messages in batches.items():
            if tp.topic != self.input_topic or not messages:
                out[tp] = messages
                continue
            state = self.partitions.get(tp.partition)
            if state is None:
                if consumer is not None and tp in consumer.assignment():
                    consumer.seek(tp, messages[0].offset)  # read again once the partition has its state
                continue
            out[tp] = unseen = unseen_records(messages, state.next_offset)
            if len(unseen) < len(messages):
                log.info("%s: %s: %d records fetched before the restore are in its state already; dropped",
                         self.stage, tp, len(messages) - len(unseen))
        return out

    def _snapshot_of(self, partition: int) -> Snapshot | None:
        """What a checkpoint of ``partition`` saves: its offset and its state's snapshot."""
        state = self.partitions.get(partition)
        return None if state is None else (state.next_offset, state.snapshot)

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Restore each assigned input partition from its checkpoint (and seek to the offset it
        covers), or start it empty."""
        consumer = self.consumer
        assert consumer is not None
        inputs = [tp for tp in assigned if tp.topic == self.input_topic]
        self._in_callback = True
        async with self._lock:
            try:
                found = await self.checkpoints.read(self.input_topic, [tp.partition for tp in inputs])
                starts: dict[int, int | None] = {}
                for tp in inputs:
                    checkpoint = found.get(tp.partition)
                    if checkpoint is None:
                        self.partitions[tp.partition] = self.new_partition(tp.partition)
                        starts[tp.partition] = None
                        continue
                    self.partitions[tp.partition] = self.restore_partition(tp.partition, checkpoint)
                    consumer.seek(tp, checkpoint.offset)
                    starts[tp.partition] = checkpoint.offset
                    log.info("%s: restored %s from checkpoint at offset %d", self.stage, tp, checkpoint.offset)
                if starts:
                    await self.restored(starts)
            except Exception as exc:
                # a partition without its state would have its records skipped: restart the stage instead
                self._rebalance_failure = exc
                raise
            finally:
                self._in_callback = False

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Checkpoint the revoked input partitions' newest state, wait for every checkpoint in
        flight, and drop them: the last checkpoint plus a replay rebuilds them wherever they go."""
        self._in_callback = True
        try:
            await self._revoke(revoked)
        finally:
            self._in_callback = False

    async def _revoke(self, revoked: set[TopicPartition]) -> None:
        async with self._lock:
            inputs = [tp.partition for tp in revoked if tp.topic == self.input_topic]
            # written before another worker (or this one) reads them
            await self.commits.save_due(self._snapshot_of, force=True, partitions=inputs)
            await self.commits.drain(inputs)
            self.commits.forget(inputs)
            for partition in inputs:
                self.partitions.pop(partition, None)
            self.revoked(revoked)


__all__ = ["POLL_TIMEOUT_MS", "CheckpointedStage", "PartitionCheckpoint", "Stage", "StageBusy", "unseen_records"]
