"""Stage 2: replica step summaries (partitioned by model) -> per-model features and decisions.

For each model it waits until the step is complete (:mod:`skewwatch.pipeline.assembler`),
merges the replicas' mergeable summaries into the per-model feature vector, runs the model's
:class:`~skewwatch.pipeline.decide.ModelDecider` (detectors, health, weights), and publishes
the model's features, alerts and routing correction. Its state (pending steps, detector
state, last correction per model) is checkpointed with the offset it covers, exactly like
stage 1 (:class:`~skewwatch.agents.commit.CommitPipeline`: once its outputs are acknowledged, at
most every ``limits.checkpoint_interval_s``), so seq numbers and open alerts survive restarts.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from skewwatch.agents.checkpoint import CheckpointStore
from skewwatch.agents.commit import CommitPipeline, Snapshot, commit_offsets
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.rebalance import StageRebalanceListener
from skewwatch.config import Settings
from skewwatch.kafka_client import client_kwargs
from skewwatch.pipeline.assembler import DEFAULT_MAX_PENDING, ModelStep, StepAssembler
from skewwatch.pipeline.corrections import RoutingCorrection
from skewwatch.pipeline.decide import ModelDecider
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.handoff import model_step_inputs, read_step_header
from skewwatch.pipeline.model_merge import merge_model_features
from skewwatch.pipeline.telemetry import TelemetrySample
from skewwatch.schemas.features import encode_features

log = logging.getLogger(__name__)


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class PartitionModels:
    """Everything stage 2 keeps for one partition of the replica-steps topic."""

    def __init__(self, settings: Settings) -> None:
        self.assembler = StepAssembler(max_pending=DEFAULT_MAX_PENDING)
        self.deciders: dict[str, ModelDecider] = {}
        self.next_offset: int | None = None
        self.last_input_wall = time.monotonic()

    def snapshot(self) -> bytes:
        return orjson.dumps({
            "v": 2,  # 2: the assembler may hold chunks (hand-off format 2); v1 snapshots restore as they are
            # pending steps are held as the records' bytes: a format-1 record (JSON) embedded as it is,
            # a chunk (binary) as base64
            "assembler": self.assembler.state_dict(encode=orjson.Fragment, encode_chunk=_base64),
            "deciders": {model: d.state_dict() for model, d in self.deciders.items()},
        })

    @classmethod
    def restore(cls, data: bytes, settings: Settings, detector_settings: DetectorSettings) -> PartitionModels:
        state = orjson.loads(data)
        partition = cls(settings)
        partition.assembler.load_state(state["assembler"], decode=orjson.dumps, decode_chunk=base64.b64decode)
        partition.deciders = {model: ModelDecider.from_state(s, detector_settings)
                              for model, s in state["deciders"].items()}
        return partition


class ModelStage:
    stage = "stage2"

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.producer = producer
        self.metrics = metrics
        self.detector_settings = settings.detectors
        self.partitions: dict[int, PartitionModels] = {}
        self.connection = client_kwargs(settings.kafka, bootstrap=bootstrap)
        self.checkpoints = CheckpointStore(producer, self.connection, settings.topics.checkpoints, self.stage)
        self.commits = CommitPipeline(self.checkpoints, settings.topics.replica_steps, settings.limits,
                                      on_saved=metrics.checkpoints.labels(self.stage).inc)
        self.consumer: AIOKafkaConsumer | None = None
        self.corrections: dict[str, RoutingCorrection] = {}  # latest published, per model
        self._weight_gauges: dict[tuple[str, str], Any] = {}  # (model, replica) -> its labelled gauge
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        self.consumer = AIOKafkaConsumer(
            **self.connection,
            group_id=f"{self.settings.kafka.group_id}.stage2",
            client_id=f"{self.settings.kafka.client_id}-stage2",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await self.consumer.start()
        self.consumer.subscribe([self.settings.topics.replica_steps], listener=StageRebalanceListener(self))
        try:
            while not self._stopping.is_set():
                self.commits.raise_failure()  # a refused send or checkpoint: restart from the last checkpoint
                batches = await self.consumer.getmany(timeout_ms=200, max_records=20_000)
                async with self._lock:
                    for tp, messages in batches.items():
                        if messages:
                            await self._process(tp, messages)
                    await self._complete_quiet_partitions()
                    await self.commits.save_due(self._snapshot_of)
                    commits = self.commits.take_commits()
                await commit_offsets(self.consumer, commits)  # outside the lock (a commit may wait for a rebalance)
            async with self._lock:  # a clean stop: the newest state is checkpointed and written
                await self.commits.save_due(self._snapshot_of, force=True)
            await self.commits.drain()
            await commit_offsets(self.consumer, self.commits.take_commits())
        finally:
            self.commits.cancel()
            await self.consumer.stop()

    def stop(self) -> None:
        self._stopping.set()

    def _snapshot_of(self, partition: int) -> Snapshot | None:
        """What a checkpoint of ``partition`` saves: its offset and its models' snapshot."""
        state = self.partitions.get(partition)
        return None if state is None else (state.next_offset, state.snapshot)

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        assert self.consumer is not None
        async with self._lock:
            topic = self.settings.topics.replica_steps
            found = await self.checkpoints.read(topic, [tp.partition for tp in assigned])
            for tp in assigned:
                checkpoint = found.get(tp.partition)
                if checkpoint is None:
                    self.partitions[tp.partition] = PartitionModels(self.settings)
                    continue
                self.partitions[tp.partition] = PartitionModels.restore(
                    checkpoint.state, self.settings, self.detector_settings)
                self.partitions[tp.partition].next_offset = checkpoint.offset
                self.consumer.seek(tp, checkpoint.offset)

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self._lock:
            partitions = [tp.partition for tp in revoked]
            # the newest state and the checkpoints in flight are written before anyone reads them
            await self.commits.save_due(self._snapshot_of, force=True, partitions=partitions)
            await self.commits.drain(partitions)
            self.commits.forget(partitions)
            for tp in revoked:
                self.partitions.pop(tp.partition, None)

    async def _process(self, tp: TopicPartition, messages: list[Any]) -> None:
        state = self.partitions.get(tp.partition)
        if state is None:
            return
        for message in messages:
            # format 2 (one record per input partition, model and step) is routed by its header alone;
            # held as the record's bytes, decoded when the model's step completes
            header = read_step_header(message.headers)
            if header is not None:
                state.assembler.add_chunk(message.key.decode(), header.window_end, header.source,
                                          header.replicas, message.value, part=header.part)
                continue
            body = orjson.loads(message.value)
            progress = body.get("progress")
            if progress is not None:
                state.assembler.progress(int(progress["source"]), float(progress["closed_end"]),
                                         int(progress["sources"]))
                continue
            # format 1 (one record per replica step, from a stage 1 before format 2): held as the
            # record's bytes until the model's step completes (a checkpoint embeds them as they are)
            fv = body["features"]
            state.assembler.add(fv["model"], float(fv["window_end"]), str(fv["replica"]), message.value)
        state.next_offset = messages[-1].offset + 1
        state.last_input_wall = time.monotonic()
        await self._finish(tp, state, state.assembler.complete())

    async def _complete_quiet_partitions(self) -> None:
        """When input goes quiet on the wall clock (end of a stream), release what is pending."""
        now = time.monotonic()
        for partition, state in self.partitions.items():
            oldest = state.assembler.oldest_pending()
            if oldest is not None and now - state.last_input_wall > 2 * self.settings.window.step_s:
                steps = state.assembler.complete(force_until=oldest)
                await self._finish(TopicPartition(self.settings.topics.replica_steps, partition), state, steps)

    async def _finish(self, tp: TopicPartition, state: PartitionModels, steps: list[ModelStep]) -> None:
        if not steps:
            return
        started = time.perf_counter()
        pending = []
        for step in steps:
            pending.extend(await self._decide(state, step))
        self._refresh_open_alerts()  # once per batch of steps: it visits every model's decider
        await self.commits.sent(tp.partition, pending)  # acknowledged in the background, before a checkpoint
        if self.commits.due(tp.partition):
            await self.commits.save(tp.partition, state.next_offset, state.snapshot)
        self.metrics.step_duration.labels(self.stage).observe(time.perf_counter() - started)

    async def _decide(self, state: PartitionModels, step: ModelStep) -> list[Any]:
        topics = self.settings.topics
        by_replica = model_step_inputs(step)
        inputs = list(by_replica.values())
        if not step.complete:
            self.metrics.steps_forced.inc()
            log.warning("stage 2 holds more than %d replica steps: released %s@%s before every input "
                        "partition reported (%d replica summaries)", state.assembler.max_pending,
                        step.model, step.window_end, len(inputs))
        model_fv = merge_model_features(step.model, step.window_end, [p.summary for p in inputs],
                                        self.settings.window)
        replica_features = [p.features for p in inputs]
        telemetry: dict[str, tuple[TelemetrySample, float]] = {}
        for replica, payload in by_replica.items():
            if payload.telemetry is not None:
                telemetry[replica] = (payload.telemetry, step.window_end - payload.telemetry.ts)
        decider = state.deciders.get(step.model)
        if decider is None:
            decider = state.deciders[step.model] = ModelDecider(self.detector_settings, model=step.model)
        decision = decider.step(step.model, step.window_end, replica_features, model_fv, telemetry)
        if decision.current is not None:
            self.corrections[step.model] = decision.current
        sends = [await self.producer.send(topics.features, key=model_fv.key.encode(),
                                          value=encode_features(model_fv))]
        self.metrics.features_out.labels("model").inc()
        for alert in decision.alerts:
            key = f"{alert.model}/{alert.replica}" if alert.replica else alert.model
            sends.append(await self.producer.send(topics.alerts, key=key.encode(),
                                                  value=orjson.dumps(alert.to_dict())))
            self.metrics.alerts_out.labels(alert.detector, str(alert.severity), alert.state).inc()
        if decision.correction is not None:
            sends.append(await self._publish_correction(decision.correction))
        gauges = self._weight_gauges
        for replica, w in decision.weights.items():
            gauge = gauges.get((step.model, replica))
            if gauge is None:  # labels() takes a lock and builds a key: once per replica, not per step
                gauge = gauges[(step.model, replica)] = self.metrics.weight.labels(step.model, replica)
            gauge.set(w.weight)
        return sends

    async def _publish_correction(self, correction: RoutingCorrection) -> Any:
        self.corrections[correction.model] = correction
        self.metrics.corrections_out.inc()
        return await self.producer.send(self.settings.topics.routing_corrections,
                                        key=correction.model.encode(),
                                        value=orjson.dumps(correction.to_dict()))

    def _refresh_open_alerts(self) -> None:
        counts: dict[tuple[str, str], int] = {}
        for state in self.partitions.values():
            for decider in state.deciders.values():
                for key, n in decider.open_alerts().items():
                    counts[key] = counts.get(key, 0) + n
        self.metrics.open_alerts.clear()
        for (detector, severity), n in counts.items():
            self.metrics.open_alerts.labels(detector, severity).set(n)

    async def force_update(self) -> dict[str, int]:
        """POST /api/v1/update_weights: recompute every owned model's weights now and publish."""
        published: dict[str, int] = {}
        async with self._lock:
            sends = []
            for state in self.partitions.values():
                for model, decider in state.deciders.items():
                    correction = decider.force_publish(time.time())
                    if correction is None:
                        continue
                    sends.append(await self._publish_correction(correction))
                    published[model] = correction.seq
            await asyncio.gather(*sends)
        return published
