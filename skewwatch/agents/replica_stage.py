"""Stage 1: request events (partitioned by replica) -> per-replica windows and step summaries.

The hot path reads with aiokafka ``getmany`` and hands each message to the columnar decoder,
so a batch message of 100 events costs one decode and one vectorised window update — not
100 trips through a Faust stream, whose fixed cost per event, not the work, would set the stage's
pace (bench/README.md, "Costs the code was shaped by"). Per input partition it keeps a
:class:`~skewwatch.pipeline.window.PartitionWindows` in memory and, every closed 5 s step:

1. publishes each replica's feature vector on ``llm.features`` (key ``model/replica``),
2. publishes each replica's mergeable summary, its features and its telemetry as of the step
   (:class:`~skewwatch.pipeline.telemetry_join.TelemetryJoin`: GPUs and sources merged, fresh
   fields only, plus ``telemetry_stale``: the signals that were stale) on the internal
   ``replica_steps`` topic keyed by model, one record per model and step holding all of the
   partition's replicas of that model as columns (:mod:`skewwatch.pipeline.replica_step_record`; stage 2
   merges them per model),
3. writes a snapshot of the partition's windows with the input offset it covers
   (:mod:`skewwatch.agents.checkpoint`), then commits that offset: at most every
   ``limits.checkpoint_interval_s`` of wall time (a catch-up closes many steps a second), and on
   revocation and shutdown.

Steps 1-2 are sent at once; step 3 waits for the broker to acknowledge them, in the background
and in order per partition (:class:`~skewwatch.agents.commit.CommitPipeline`), so the stage reads
on while the broker stores what it sent.

Rejected input goes to the dead-letter topic with its original bytes and the reason. The
consumer, the poll loop and restoring a partition from its checkpoint are
:class:`~skewwatch.agents.stage.CheckpointedStage`'s; this module is what stage 1 does with a poll.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from skewwatch.agents.checkpoint import Checkpoint
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.publish import KeyedPublisher
from skewwatch.agents.stage import CheckpointedStage
from skewwatch.config import Settings
from skewwatch.pipeline.derived_batch import derive_batch
from skewwatch.pipeline.replica_step_record import encode_model_step, record_parts, step_header
from skewwatch.pipeline.telemetry_join import TelemetryJoin, history_for
from skewwatch.pipeline.telemetry_pacing import TelemetryPacer
from skewwatch.pipeline.window import ClosedSteps, PartitionWindows
from skewwatch.schemas.features import encode_features
from skewwatch.schemas.requests import Rejection, decode_request_messages
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry import decode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample

log = logging.getLogger(__name__)

_ENVELOPE = struct.Struct(">I")  # length of the JSON header that precedes the windows snapshot


@dataclass
class PartitionState:
    """What stage 1 keeps for one partition of the requests topic: its replicas' windows."""

    windows: PartitionWindows
    next_offset: int | None = None  # first input offset not yet reflected in `windows`
    announced_end: float | None = None  # progress last announced to stage 2
    last_input_wall: float = field(default_factory=time.monotonic)
    # monotonic time of the partition's last input, wherever it was read (kept across restores by the
    # checkpoint); -inf: none since it has been known. Says when it may follow the others as idle.
    quiet_since: float = field(default_factory=time.monotonic)

    def snapshot(self) -> bytes:
        """The partition's checkpoint: an envelope header, then the windows' snapshot."""
        return encode_snapshot(self)


def encode_snapshot(state: PartitionState) -> bytes:
    """A partition's checkpoint bytes (read back by :func:`decode_snapshot`): a JSON header with the wall
    clock time of its last input (epoch seconds, None: none), then the windows."""
    quiet_for = time.monotonic() - state.quiet_since
    header = orjson.dumps({"v": 1, "last_input": time.time() - quiet_for if math.isfinite(quiet_for) else None})
    return _ENVELOPE.pack(len(header)) + header + state.windows.snapshot()


def decode_snapshot(data: bytes, settings: Settings) -> PartitionWindows:
    """The windows a checkpoint of :func:`encode_snapshot` holds."""
    return restore_snapshot(data, settings).windows


def restore_snapshot(data: bytes, settings: Settings) -> PartitionState:
    """The partition state a checkpoint of :func:`encode_snapshot` holds (``next_offset`` left unset)."""
    (length,) = _ENVELOPE.unpack_from(data)
    header = orjson.loads(data[_ENVELOPE.size:_ENVELOPE.size + length])
    state = PartitionState(PartitionWindows.restore(data[_ENVELOPE.size + length:], settings.window))
    last_input = header.get("last_input", 0.0)  # checkpoints before this field: quiet from now on
    if last_input is None:
        state.quiet_since = -math.inf
    elif last_input:
        state.quiet_since = time.monotonic() - max(time.time() - float(last_input), 0.0)
    return state


class ReplicaStage(CheckpointedStage[PartitionState]):
    """Stage 1: consumes ``llm.requests`` (+ ``llm.gpu-telemetry``) and produces per-replica steps."""

    stage = "stage1"  # its consumer group, checkpoints and metrics are named so
    consumer_options = {
        # range assignment keeps partition p of requests and telemetry on the same worker
        "partition_assignment_strategy": (RangePartitionAssignor,),
        # 2 MiB per partition (16 MB fetch responses for 8): larger polls amortise the per-poll costs,
        # but a response above glibc's largest mmap threshold (32 MB, i.e. 4 MiB here) is mapped and
        # unmapped afresh each time, which costs more than the larger poll saves (bench/README.md,
        # "Waiting for the broker, fetch sizes and the decoder's GC": 1 MiB and 2 MiB side by side)
        "max_partition_fetch_bytes": 2 * 1024 * 1024,
    }

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        super().__init__(settings, bootstrap, producer, metrics)
        # latest telemetry per (replica, source, GPU), merged per replica at each step
        # (docs/telemetry.md "In the worker"); refilled within one interval after a restart, so it
        # is not checkpointed. Stale after the decider's telemetry_max_age_s (3 intervals, 15 s).
        self.telemetry = TelemetryJoin(history=history_for(settings.window))
        self.telemetry_stale_s = settings.detectors.weights.telemetry_max_age_s
        # telemetry read too far ahead of the requests is held and its partition paused (a backlog of
        # telemetry would push the samples the next steps need out of the join's history)
        self.telemetry_pacer = TelemetryPacer[TelemetrySample](settings.window.telemetry_ahead_s)
        self._telemetry_released_at: float | None = None  # watermark of the last release_idle
        self.features_publisher = KeyedPublisher(producer)  # llm.features: one batch per partition and step
        self.lag_records = 0  # request records behind the end of the assigned partitions, summed

    # -- partitions ------------------------------------------------------------------------
    @property
    def input_topic(self) -> str:
        return self.settings.topics.requests

    def topics(self) -> list[str]:
        return [self.settings.topics.requests, self.settings.topics.gpu_telemetry]

    def new_partition(self, partition: int) -> PartitionState:
        # no input known: idle as soon as the consumer has read to its end (_advance_idle_partitions)
        return PartitionState(PartitionWindows(self.settings.window), quiet_since=-math.inf)

    def restore_partition(self, partition: int, checkpoint: Checkpoint) -> PartitionState:
        state = restore_snapshot(checkpoint.state, self.settings)
        state.next_offset = checkpoint.offset
        return state

    def revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            if tp.topic == self.settings.topics.gpu_telemetry:
                self.telemetry_pacer.forget(tp.partition)  # re-read wherever it is assigned next

    # -- one poll --------------------------------------------------------------------------
    async def process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        await self._process(batches)
        await self._advance_idle_partitions()
        self._update_lag()

    # -- hot path --------------------------------------------------------------------------
    async def _process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        topics = self.settings.topics
        # telemetry first: a sample fetched in the same poll as the requests that close its step joins it
        for tp, messages in sorted(batches.items(), key=lambda item: item[0].topic != topics.gpu_telemetry):
            if not messages:
                continue
            self.metrics.messages_in.labels(tp.topic).inc(len(messages))
            if tp.topic == topics.gpu_telemetry:
                await self._process_telemetry(tp, messages)
                continue
            state = self.partitions.get(tp.partition)
            if state is None:  # assignment raced with a fetch; the rebalance will bring it back
                continue
            # one vectorised decode per poll of the partition, whatever the message sizes
            decoded = decode_request_messages([m.value for m in messages], self.settings.limits)
            for index, rejects in decoded.rejects.rejected.items():
                await self._dead_letter(tp, messages[index], rejects)
            # A catch-up poll can cover minutes of event time: it is applied in event-time slices, each
            # with the telemetry of its time and its steps closed before the next slice's telemetry is
            # joined (the join keeps a bounded history). The same events, the same steps; a checkpoint
            # only at the end of the poll, where the state matches an input offset.
            closed = False
            slices = decoded.columns.time_slices(self.settings.window.telemetry_ahead_s / 2)
            for part in slices if len(decoded.columns) else ():
                self._release_telemetry(tp.partition, float(part.ts.max()))
                # contract v1.1: events without a batch size (OTLP) get one from telemetry, marked derived
                result = state.windows.apply(self._derive_batch(part))
                self.metrics.events_in.inc(result.accepted)
                if result.late:
                    self.metrics.late.inc(result.late)
                if len(slices) > 1:
                    closed |= await self._close_steps(tp, state, checkpoint=False)
            state.next_offset = messages[-1].offset + 1
            state.last_input_wall = state.quiet_since = time.monotonic()
            await self._close_steps(tp, state, checkpoint_anyway=closed)
        await self._flow_telemetry()

    def _derive_batch(self, columns: RequestColumns) -> RequestColumns:
        """Fill unknown batch sizes from the replica's telemetry as of each event's time (running
        requests; capacity from the sample or the setting), else leave them unknown. The telemetry
        is not checkpointed, so a replay after a restart may derive from fewer samples."""
        config = self.settings.derived_batch
        if not config.enabled:
            return columns
        max_age = config.max_telemetry_age_s
        out = derive_batch(columns, lambda replica, at: self.telemetry.view(replica, at, max_age)[0],
                           config.capacity_for_model)
        if out.derived:
            self.metrics.batch_derived.inc(out.derived)
        if out.unknown:
            self.metrics.batch_unknown.inc(out.unknown)
        return out.columns

    async def _process_telemetry(self, tp: TopicPartition, messages: list[Any]) -> None:
        samples: list[tuple[float, TelemetrySample]] = []
        for message in messages:
            decoded = decode_telemetry(message.value)
            if isinstance(decoded, TelemetrySample):
                samples.append((decoded.ts, decoded))
                self.metrics.telemetry_in.inc()
            else:
                await self._dead_letter(tp, message, [decoded])
        for sample in self.telemetry_pacer.offer(tp.partition, samples, self._requests_watermark(tp.partition)):
            self.telemetry.add(sample)

    def _requests_watermark(self, partition: int) -> float | None:
        """The requests' watermark telemetry partition ``partition`` is held against: request partition
        ``partition``'s (both topics are keyed by replica: same partition, same replicas), else the
        slowest known one. Before any request: -inf (hold everything) for ``partition_idle_s`` after the
        partition was assigned, as requests may simply not have been fetched yet; then None (hold
        nothing: telemetry alone must not stall)."""
        state = self.partitions.get(partition)
        same = self._same_partitioning()
        if state is not None and same:
            if state.windows.watermark is not None:
                return state.windows.watermark
            if time.monotonic() - state.last_input_wall < self.settings.window.partition_idle_s:
                return -math.inf
        known = self._known_watermarks()
        return min(known) if known else None

    def _known_watermarks(self) -> list[float]:
        """The watermarks of the request partitions that have one."""
        return [s.windows.watermark for s in self.partitions.values() if s.windows.watermark is not None]

    def _same_partitioning(self) -> bool:
        if self.consumer is None:
            return False
        topics = self.settings.topics
        requests = self.consumer.partitions_for_topic(topics.requests)
        return bool(requests) and requests == self.consumer.partitions_for_topic(topics.gpu_telemetry)

    def _release_telemetry(self, partition: int, up_to: float | None = None) -> None:
        """Join what telemetry partition ``partition`` held that the requests have now come within
        reach of (``up_to``: a poll's newest event time, else the requests' watermark)."""
        if not self.telemetry_pacer.held:
            return
        watermark = self._requests_watermark(partition)
        if up_to is not None and self._same_partitioning():
            watermark = up_to if watermark is None else max(watermark, up_to)
        for sample in self.telemetry_pacer.release(partition, watermark):
            self.telemetry.add(sample)

    async def _flow_telemetry(self) -> None:
        """Release held telemetry, pause/resume telemetry partitions, and drop replicas that left."""
        for partition in list(self.telemetry_pacer.held):
            self._release_telemetry(partition)
        pause, resume = self.telemetry_pacer.pause_resume()
        if self.consumer is not None and (pause or resume):
            topic = self.settings.topics.gpu_telemetry
            assigned = self.consumer.assignment()
            if pause_tps := [tp for p in pause if (tp := TopicPartition(topic, p)) in assigned]:
                self.consumer.pause(*pause_tps)
            if resume_tps := [tp for p in resume if (tp := TopicPartition(topic, p)) in assigned]:
                self.consumer.resume(*resume_tps)
        self.metrics.telemetry_held.set(len(self.telemetry_pacer))
        # replicas with no sample for retain_s of event time (they left the fleet) are released
        known = self._known_watermarks()
        if known:
            slowest = min(known)
            released_at = self._telemetry_released_at
            if released_at is None or slowest - released_at >= self.settings.window.step_s:
                self.telemetry.release_idle(now=slowest)
                self._telemetry_released_at = slowest

    async def _dead_letter(self, tp: TopicPartition, message: Any, rejects: list[Rejection]) -> None:
        sent = await self.dead_letter(tp, message, rejects)
        if tp.topic == self.settings.topics.requests:  # the checkpoint that covers it waits for it
            self.commits.hold(tp.partition, sent)

    async def _advance_idle_partitions(self) -> None:
        """An input partition without traffic follows the others' watermark (Flink-style idleness): one
        read to its end (nothing to read now) and without input for ``window.partition_idle_s``, also
        before a restore (the checkpoint says when its last input was), so a rebalance does not hold
        the model steps of every partition back by that long."""
        watermarks = self._known_watermarks()
        if not watermarks:
            return
        leader = max(watermarks)
        now = time.monotonic()
        for partition, state in self.partitions.items():
            behind = state.windows.watermark is None or state.windows.watermark < leader
            if behind and now - state.quiet_since >= self.settings.window.partition_idle_s:
                tp = TopicPartition(self.settings.topics.requests, partition)
                if not await self._read_to_end(tp, state):
                    continue
                state.windows.advance_watermark(leader)
                await self._close_steps(tp, state)

    async def _read_to_end(self, tp: TopicPartition, state: PartitionState) -> bool:
        """Whether the consumer's last fetch of ``tp`` found nothing beyond what ``state`` reflects (a
        partition with records still to read is behind, not idle)."""
        consumer = self.consumer
        if consumer is None or tp not in consumer.assignment():
            return False
        end = consumer.highwater(tp)
        if end is None:  # not fetched yet
            return False
        position = state.next_offset if state.next_offset is not None else await consumer.position(tp)
        return position >= end

    async def _close_steps(self, tp: TopicPartition, state: PartitionState, *, checkpoint: bool = True,
                           checkpoint_anyway: bool = False) -> bool:
        """Close, publish and (``checkpoint``) checkpoint the steps the watermark allows; True if any
        closed. ``checkpoint_anyway``: steps were closed since the last checkpoint."""
        started = time.perf_counter()
        steps = state.windows.close_steps()
        if state.windows.watermark is not None:
            self.metrics.watermark.labels(str(tp.partition)).set(state.windows.watermark)
        progress = self._progress(state)
        if not steps and progress == state.announced_end and not checkpoint_anyway:
            return False
        sent = await self._publish_steps(steps, tp.partition)
        if progress is not None and progress != state.announced_end:
            # not waited for: the idempotent producer keeps each partition's order, so on every stage 2
            # partition the marker still follows the summaries it covers
            sent += await self._announce_progress(tp.partition, progress)
            state.announced_end = progress
        await self.commits.sent(tp.partition, sent, changed=checkpoint and (bool(steps) or checkpoint_anyway))
        if checkpoint and self.commits.due(tp.partition):
            await self.commits.save(tp.partition, state.next_offset, state.snapshot)
        self.metrics.step_duration.labels(self.stage).observe(time.perf_counter() - started)
        return bool(steps)

    def _progress(self, state: PartitionState) -> float | None:
        """End of the newest step this partition has closed (for stage 2's completion rule)."""
        windows = state.windows
        if windows.last_closed_end is not None:
            return windows.last_closed_end
        if windows.watermark is not None and not windows.keys:  # nothing to report yet: only time passes
            step = self.settings.window.step_s
            return float((windows.watermark // step) * step)
        return None

    async def _announce_progress(self, partition: int, closed_end: float) -> list[asyncio.Future[Any]]:
        """Tell every stage 2 partition that this input partition has closed every step up to
        ``closed_end``; on each stage 2 partition this follows the summaries it covers. Returns the
        sends' futures."""
        assert self.consumer is not None
        topics = self.settings.topics
        sources = len(self.consumer.partitions_for_topic(topics.requests) or ()) or 1
        targets = await self.producer.partitions_for(topics.replica_steps)
        body = orjson.dumps({"progress": {"source": partition, "closed_end": closed_end, "sources": sources}})
        return [await self.producer.send(topics.replica_steps, value=body, partition=target)
                for target in sorted(targets)]

    async def _publish_steps(self, steps: ClosedSteps, source: int) -> list[asyncio.Future[Any]]:
        """Each replica's feature vector on ``llm.features`` and, per model and step, ONE record on the
        replica-steps topic with all of the model's replicas of input partition ``source`` and their
        summaries merged (:mod:`skewwatch.pipeline.replica_step_record`). Returns the sends' futures (not
        waited for)."""
        topics = self.settings.topics
        vectors = [fv for batch in steps.batches for fv in batch.feature_vectors()]
        # one record per replica (the public contract), on the partition send() would pick for its key,
        # a partition's many records as one batch (agents/publish.py)
        pending = await self.features_publisher.publish(
            topics.features, [(fv.key.encode(), encode_features(fv)) for fv in vectors])
        self.metrics.features_out.labels("replica").inc(len(vectors))
        for batch in steps.batches:
            window_end = batch.window_end
            for model, part, group, summary in record_parts(batch):
                # merged as of the step's end: per-GPU worst, per-source fields, only fresh ones
                views = [self.telemetry.view(fv.replica or "", window_end, self.telemetry_stale_s) for fv in group]
                value = encode_model_step(model, window_end, source, group, summary,
                                          [sample for sample, _, _ in views], [stale for _, _, stale in views])
                pending.append(await self.producer.send(
                    topics.replica_steps, key=model.encode(), value=value,
                    headers=step_header(window_end, source, len(group), part)))
        return list(pending)

    def _update_lag(self) -> None:
        if self.consumer is None:
            return
        total = 0
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            state = self.partitions.get(tp.partition) if tp.topic == self.settings.topics.requests else None
            position = state.next_offset if state is not None else None
            if high is not None and position is not None:
                lag = max(high - position, 0)
                total += lag
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
        self.lag_records = total  # /readyz: ready while this stays under [health] max_lag_records
