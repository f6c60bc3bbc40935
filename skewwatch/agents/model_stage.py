"""Stage 2: replica step summaries (partitioned by model) -> per-model features and decisions.

For each model it waits until the step is complete (:mod:`skewwatch.pipeline.step_completion`),
merges the replicas' mergeable summaries into the per-model feature vector, runs the model's
:class:`~skewwatch.pipeline.model_decisions.ModelDecider` (detectors, health, weights), and publishes
the model's features, alerts and routing correction. Its state (pending steps, detector
state, last correction per model) is checkpointed with the offset it covers, exactly like
stage 1 (:class:`~skewwatch.agents.commit.CommitPipeline`: once its outputs are acknowledged, at
most every ``limits.checkpoint_interval_s``), so seq numbers and open alerts survive restarts.
The consumer, the poll loop and the checkpoint restore are
:class:`~skewwatch.agents.stage.CheckpointedStage`'s; this module is what stage 2 does with a poll.

**Time without input.** Event time moves with the input: a model whose replicas all fell silent
still gets an (empty) step at every step end the other models' input passes, so its alerts
resolve and its correction says the pool is silent. When no input arrives at all (every stage 1
partition idle: all traffic stopped), event time would stand still and so would every alert and
weight; after ``[detectors.decider] idle_advance_s`` (60 s) of wall time without a record, the
partition's steps close empty at the wall clock's pace, ``idle_advance_s`` behind it, as Kafka
Streams' wall-clock punctuation. A replay or catch-up never goes that long without input, so its
results stay those of event time; if input resumes with steps older than the ones closed idle,
they come late and are dropped (counted as late by the assembler).
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition

from skewwatch.agents.checkpoint import Checkpoint
from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.published import Published, read_published
from skewwatch.agents.stage import CheckpointedStage, StageBusy
from skewwatch.config import Settings
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.model_decisions import ModelDecider
from skewwatch.pipeline.model_merge import merge_model_features
from skewwatch.pipeline.replica_step_record import format_problem, model_step_inputs, read_step_header
from skewwatch.pipeline.step_completion import DEFAULT_MAX_PENDING, ModelStep, StepAssembler
from skewwatch.schemas.alerts import encode_alert
from skewwatch.schemas.corrections import RoutingCorrection, encode_correction
from skewwatch.schemas.features import encode_features
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.telemetry_sample import TelemetrySample

log = logging.getLogger(__name__)


# The stage 2 checkpoint's layout: 3, pending steps held as hand-off records (their bytes; a record of
# another hand-off format is left out, said and counted, when its step completes).
SNAPSHOT_VERSION = 3


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class PartitionModels:
    """Everything stage 2 keeps for one partition of the replica-steps topic."""

    def __init__(self, settings: Settings) -> None:
        self.assembler = StepAssembler(max_pending=DEFAULT_MAX_PENDING)
        self.deciders: dict[str, ModelDecider] = {}
        self.next_offset: int | None = None
        self.last_input_wall = time.monotonic()
        self.idle_anchor: float | None = None  # the newest step end known when input last arrived

    def snapshot(self) -> bytes:
        """The checkpoint of this partition: the pending records (their bytes, base64) and the deciders."""
        return orjson.dumps({
            "v": SNAPSHOT_VERSION,
            "assembler": self.assembler.state_dict(encode=_base64),
            "deciders": {model: d.state_dict() for model, d in self.deciders.items()},
        })

    @classmethod
    def restore(cls, data: bytes, settings: Settings, detector_settings: DetectorSettings) -> PartitionModels:
        """From :meth:`snapshot`; ValueError for a checkpoint of another version or layout."""
        state = orjson.loads(data)
        if not isinstance(state, dict) or state.get("v") != SNAPSHOT_VERSION:
            version = state.get("v") if isinstance(state, dict) else None
            raise ValueError(f"stage 2 checkpoint: unsupported version {version!r} (this worker reads "
                             f"v{SNAPSHOT_VERSION})")
        partition = cls(settings)
        partition.assembler.load_state(state["assembler"], decode=base64.b64decode)
        partition.deciders = {model: ModelDecider.from_state(s, detector_settings)
                              for model, s in state["deciders"].items()}
        return partition


def _progress_of(value: bytes | None) -> tuple[int, float, int] | None:
    """(source, closed_end, sources) of a progress record, or None for any other value."""
    try:
        progress = orjson.loads(value or b"")["progress"]
        return int(progress["source"]), float(progress["closed_end"]), int(progress["sources"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class ModelStage(CheckpointedStage[PartitionModels]):
    """Stage 2: consumes the replica-steps topic and publishes per-model features and decisions."""

    stage = "stage2"  # its consumer group, checkpoints and metrics are named so

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        super().__init__(settings, bootstrap, producer, metrics)
        self.detector_settings = settings.detectors
        self._weight_gauges: dict[tuple[str, str], Any] = {}  # (model, replica) -> its labelled gauge
        # decisions already on their topics: a replay after a crash does not publish them again
        self.on_topics = Published()

    @property
    def input_topic(self) -> str:
        return self.settings.topics.replica_steps

    def topics(self) -> list[str]:
        return [self.settings.topics.replica_steps]

    def new_partition(self, partition: int) -> PartitionModels:
        return PartitionModels(self.settings)

    def restore_partition(self, partition: int, checkpoint: Checkpoint) -> PartitionModels:
        state = PartitionModels.restore(checkpoint.state, self.settings, self.detector_settings)
        state.next_offset = checkpoint.offset
        return state

    async def restored(self, starts: dict[int, int | None]) -> None:
        topics = self.settings.topics
        found = await read_published(self.connection, self.input_topic, starts, topics.routing_corrections,
                                     topics.alerts)
        self.on_topics.update(found)
        log.info("stage2: restored partitions %s; their decisions on the topics since the replayed input: "
                 "%d models' corrections, %d alert keys", sorted(starts), len(found.corrections), len(found.alerts))

    async def process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        for tp, messages in batches.items():
            if messages:
                await self._process(tp, messages)
        await self._complete_quiet_partitions()

    async def _process(self, tp: TopicPartition, messages: list[Any]) -> None:
        state = self.partitions.get(tp.partition)
        if state is None:
            return
        for message in messages:
            # a model's replica steps (one record per input partition, model and step) are routed by their
            # header alone; held as the record's bytes, decoded when the model's step completes
            header = read_step_header(message.headers)
            if header is not None and (problem := format_problem(message.value)) is not None:
                await self._refuse(tp, message, problem)
                continue
            if header is not None:
                state.assembler.add_chunk(message.key.decode(), header.window_end, header.source,
                                          header.replicas, message.value, part=header.part)
                continue
            progress = _progress_of(message.value)
            if progress is None:  # not a record stage 1 writes: skipped, and said
                log.warning("stage 2: skipped a record on %s offset %d that is neither replica steps nor "
                            "progress", tp, message.offset)
                continue
            state.assembler.progress(*progress)
        state.next_offset = messages[-1].offset + 1
        state.last_input_wall = time.monotonic()
        await self._finish(tp, state, state.assembler.complete(step_s=self.settings.window.step_s))
        state.idle_anchor = state.assembler.newest_end()
        await self.commits.sent(tp.partition, [])  # progress alone moves the state too: checkpointed as well

    async def _complete_quiet_partitions(self) -> None:
        """When input goes quiet on the wall clock, release what is pending (end of a stream); when
        it stays quiet for ``idle_advance_s``, let event time follow the wall clock (module doc)."""
        now = time.monotonic()
        step = self.settings.window.step_s
        idle_advance = self.detector_settings.decider.idle_advance_s
        for partition, state in self.partitions.items():
            quiet = now - state.last_input_wall
            tp = TopicPartition(self.settings.topics.replica_steps, partition)
            oldest = state.assembler.oldest_pending()
            if oldest is not None and quiet > 2 * step:
                await self._finish(tp, state, state.assembler.complete(force_until=oldest))
            if quiet >= idle_advance + step and state.idle_anchor is not None:
                until = state.idle_anchor + math.floor((quiet - idle_advance) / step) * step
                await self._finish(tp, state, state.assembler.complete(force_until=until, step_s=step))

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
        by_replica, summaries, rejected = model_step_inputs(step)
        for (source, part), reason in rejected:
            self.metrics.rejected.labels("malformed_json").inc()
            log.error("stage 2: %s@%s: left out the record of input partition %d part %d: %s", step.model,
                      step.window_end, source, part, reason)
        inputs = list(by_replica.values())
        if not step.complete:
            self.metrics.steps_forced.inc()
            log.warning("stage 2 holds more than %d replica steps: released %s@%s before every input "
                        "partition reported (%d replica summaries)", state.assembler.max_pending,
                        step.model, step.window_end, len(inputs))
        model_fv = merge_model_features(step.model, step.window_end, summaries, self.settings.window)
        replica_features = [p.features for p in inputs]
        telemetry: dict[str, tuple[TelemetrySample, float]] = {}
        for replica, payload in by_replica.items():
            if payload.telemetry is not None:
                telemetry[replica] = (payload.telemetry, step.window_end - payload.telemetry.ts)
        decider = state.deciders.get(step.model)
        if decider is None:
            decider = state.deciders[step.model] = ModelDecider(self.detector_settings, model=step.model)
        decision = decider.step(step.model, step.window_end, replica_features, model_fv, telemetry)
        sends = [await self.producer.send(topics.features, key=model_fv.key.encode(),
                                          value=encode_features(model_fv))]
        self.metrics.features_out.labels("model").inc()
        for alert in decision.alerts:
            if not self.on_topics.alert_is_new(alert.model, alert.replica, alert.detector, alert.ts, alert.state):
                self.metrics.republish_skipped.labels("alert").inc()  # a replayed step's: on the topic already
                continue
            key = f"{alert.model}/{alert.replica}" if alert.replica else alert.model
            sends.append(await self.producer.send(topics.alerts, key=key.encode(),
                                                  value=encode_alert(alert)))
            self.metrics.alerts_out.labels(alert.detector, str(alert.severity), alert.state).inc()
            log.info("alert %s %s %s %s: %s", alert.state, alert.severity, key, alert.detector, alert.message)
        if decision.correction is not None:
            if self.on_topics.correction_is_new(step.model, decision.correction.seq):
                sends.append(await self._publish_correction(decision.correction))
            else:
                self.metrics.republish_skipped.labels("correction").inc()
        current = decision.current or decision.correction
        self.metrics.replicas.observe_step(step.model, replica_features, telemetry,
                                           mode=str(getattr(current, "mode", "normal")),
                                           published_at=time.time() if decision.correction is not None else None)
        gauges = self._weight_gauges
        for replica, w in decision.weights.items():
            gauge = gauges.get((step.model, replica))
            if gauge is None:  # labels() takes a lock and builds a key: once per replica, not per step
                gauge = gauges[(step.model, replica)] = self.metrics.weight.labels(step.model, replica)
            gauge.set(w.weight)
        return sends

    async def _refuse(self, tp: TopicPartition, message: Any, reason: str) -> None:
        """A record of the internal topic this worker cannot read: to the dead-letter topic, counted, said."""
        log.warning("stage 2: %s offset %d: %s; sent to %s", tp, message.offset, reason,
                    self.settings.topics.dead_letter)
        rejects = [Rejection.message_level("unsupported_version", reason)]
        await self.commits.sent(tp.partition, [await self.dead_letter(tp, message, rejects)])

    async def _publish_correction(self, correction: RoutingCorrection) -> Any:
        self.metrics.corrections_out.inc()
        return await self.producer.send(self.settings.topics.routing_corrections,
                                        key=correction.model.encode(),
                                        value=encode_correction(correction))

    def _refresh_open_alerts(self) -> None:
        counts: dict[tuple[str, str], int] = {}
        for state in self.partitions.values():
            for decider in state.deciders.values():
                for key, n in decider.open_alerts().items():
                    counts[key] = counts.get(key, 0) + n
        self.metrics.open_alerts.clear()
        for (detector, severity), n in counts.items():
            self.metrics.open_alerts.labels(detector, severity).set(n)

    def published(self) -> dict[str, RoutingCorrection]:
        """GET /api/v1/weights: the latest correction published for every model this worker owns."""
        found: dict[str, RoutingCorrection] = {}
        for state in self.partitions.values():
            for model, decider in state.deciders.items():
                if decider.last_published is not None:
                    found[model] = decider.last_published
        return found

    async def force_update(self, models: Collection[str] | None = None,
                           allow: Callable[[str], bool] = lambda model: True,
                           wait_s: float | None = None) -> ForcedUpdate:
        """POST /api/v1/update_weights: publish the correction of ``models`` (None: every model this
        worker owns) as of each one's latest complete step (the newest windows every input partition
        has closed; a step still missing a partition's replicas is not forced), with that step's own
        seq, whether or not it changed enough to go out by itself; one already published is sent again
        as it was. ``allow(model)`` False skips a model (the per-model rate limit). Returns once the
        corrections are handed to the producer; the caller waits for :attr:`ForcedUpdate.acks` as long
        as it likes.

        The models are read under the stage's lock, which a poll's processing and a partition's
        restore hold: this waits for them up to ``wait_s`` (None: as long as they take) and raises
        :class:`~skewwatch.agents.stage.StageBusy`, saying which, when they take longer; nothing is
        published then."""
        if not await self.acquire(wait_s):
            what = ("restoring the partitions it was just assigned (their checkpoints and the decisions "
                    "already on the topics)" if self.restoring else "processing a poll")
            raise StageBusy(f"stage 2 is still {what} after {wait_s:g} s; nothing was published, retry")
        try:
            return await self._force_update(models, allow)
        finally:
            self.release()

    async def _force_update(self, models: Collection[str] | None, allow: Callable[[str], bool]) -> ForcedUpdate:
        update = ForcedUpdate()
        wanted = None if models is None else set(models)
        for state in self.partitions.values():
            for model, decider in state.deciders.items():
                if wanted is not None and model not in wanted:
                    continue
                update.found.add(model)
                if not allow(model):
                    update.throttled.append(model)
                    continue
                correction = decider.publish_now()
                if correction is None:
                    continue
                update.acks.append(await self._publish_correction(correction))
                update.published[model] = correction.seq
        return update


@dataclass
class ForcedUpdate:
    """What :meth:`ModelStage.force_update` did: corrections published (model -> seq), models skipped by
    the rate limit, models found at all, and the broker acknowledgements still to come."""

    published: dict[str, int] = field(default_factory=dict)
    throttled: list[str] = field(default_factory=list)
    found: set[str] = field(default_factory=set)
    acks: list[Any] = field(default_factory=list)
