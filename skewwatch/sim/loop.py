"""The closed routing loop without Kafka: the pipeline's pure weights computed in-process.

The ``dynamic`` routing policies (``dynamic``, ``dynamic_least_request``) apply the weights the
worker publishes on ``llm.routing-corrections``, in lockstep on event time. The full loop runs the real worker on a
real broker; this module is the same loop with the broker and worker replaced by the pure
code they run (:class:`skewwatch.pipeline.window.PartitionWindows` for the 60 s windows, one partition
holding every replica, :func:`skewwatch.pipeline.weights.compute_weights` for the weight formula, and
:class:`skewwatch.pipeline.pool_evidence.PoolEvidence` for what the decider adds: held scores,
credibility, staleness and the pool's guards; no detectors, so no health), so a seeded closed loop runs
in CI in seconds and the simulator's router can be checked on its own.

Use it as the simulator's ``on_step``: after step k's chunk is built, it computes every
replica's features and weights from the events and telemetry of that chunk and the ones before,
and applies them as a routing correction before step k+1 is simulated (lockstep).

>>> from skewwatch.sim.fleet import FleetConfig, FleetSimulator
>>> loop = LocalWeightsLoop()
>>> sim = FleetSimulator(FleetConfig(replicas=2, policy="dynamic", load=0.5), 1_700_000_000.0, 20,
...                      on_step=loop)
>>> _ = list(sim.chunks())
>>> loop.corrections[-1]["model"], sorted(loop.corrections[-1]["weights"])
('llama-3-70b', ['r0', 'r1'])
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from skewwatch.config import WindowSettings
from skewwatch.kafka_client import client_kwargs, wait_for_topic
from skewwatch.pipeline.pool_evidence import PoolEvidence
from skewwatch.pipeline.weights import WeightConfig, WeightInput, compute_weights
from skewwatch.pipeline.window import PartitionWindows
from skewwatch.schemas.corrections import RoutingCorrection, decode_correction
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.emit import TopicMissingError
from skewwatch.sim.generator import STEP_S, TrafficChunk

if TYPE_CHECKING:
    from skewwatch.sim.fleet import FleetSimulator


class LocalWeightsLoop:
    """``on_step`` callback: the decider's weights from the last 60 s, applied to the router."""

    def __init__(self, window: WindowSettings | None = None, weights: WeightConfig | None = None) -> None:
        self.window = window or WindowSettings()
        self.weight_config = weights or WeightConfig()
        self._windows = PartitionWindows(self.window)
        self._telemetry: dict[str, TelemetrySample] = {}
        self._evidence: dict[str, PoolEvidence] = {}  # per model
        self.corrections: list[dict[str, Any]] = []  # every correction applied, in order

    def __call__(self, sim: FleetSimulator, chunk: TrafficChunk) -> None:
        end = chunk.end_ts
        self._windows.apply(chunk.requests)
        self._windows.advance_watermark(end)  # the chunk holds every request finished before its end
        features = {(s.features.model, s.features.replica): s.features
                    for s in self._windows.close_steps() if s.features.window_end == end}
        for sample in chunk.telemetry:
            self._telemetry[sample.replica] = sample
        max_age = self.weight_config.telemetry_max_age_s
        for model, pool in sim.pools.items():
            inputs, vectors, fresh = [], [], []
            for replica in pool:
                # never seen, or released: no summary (the decider's evidence holds its weight)
                found = features.get((model, replica.name))
                fv = found or FeatureVector(model=model, replica=replica.name,
                                            window_start=end - self.window.length_s, window_end=end, count=0)
                tel = self._telemetry.get(replica.name)
                age = None if tel is None else end - tel.ts
                inputs.append(WeightInput(replica.name, fv, tel, telemetry_age_s=age))
                vectors.append(found)
                fresh.append(tel if age is not None and age <= max_age else None)
            names = [replica.name for replica in pool]
            evidence = self._evidence.setdefault(model, PoolEvidence())
            evidence.observe(end, names, vectors, fresh, self.weight_config, self.window.length_s)
            weights = compute_weights(inputs, self.weight_config)
            settled = evidence.settle(model, end, names, vectors, weights, [None] * len(names), self.weight_config)
            record = {"model": model, "ts": end, "weights": {r: w.weight for r, w in weights.items()},
                      "actions": [], "mode": settled.mode}
            self.corrections.append(record)
            sim.apply_correction(record, end)


class KafkaCorrections:
    """Routing corrections read from ``llm.routing-corrections``, for the loop through the real worker.

    Started at the topic's end (older records belong to earlier runs). :meth:`wait_for` returns
    once every model has a record for a step at or after ``step_end`` (event time), or when
    ``timeout_s`` of wall time passed. Records are applied in ``seq`` order; a replayed step
    (``seq`` not above the last seen) is dropped, as the contract says.
    """

    def __init__(self, bootstrap: str, topic: str, client_options: Mapping[str, Any] | None = None) -> None:
        self.topic = topic
        self._bootstrap = bootstrap
        self._client_options = dict(client_options or {})  # TLS / SASL (skewwatch.kafka_security)
        self._consumer: AIOKafkaConsumer | None = None  # created in start(): aiokafka wants a running loop
        self._latest: dict[str, RoutingCorrection] = {}  # model -> newest record
        self.misses = 0  # waits that timed out (the run is then no longer lockstep-deterministic)
        self.missed_steps: list[float] = []  # the step_end of each miss

    async def start(self) -> None:
        self._consumer = consumer = AIOKafkaConsumer(**client_kwargs(bootstrap=self._bootstrap),
                                                     enable_auto_commit=False, group_id=None,
                                                     auto_offset_reset="latest", **self._client_options)
        await consumer.start()
        try:
            partitions = await asyncio.wait_for(wait_for_topic(consumer, self.topic), 10.0)
        except Exception:
            partitions = None
        if not partitions:
            await consumer.stop()
            raise TopicMissingError(f"topic {self.topic!r} does not exist; create it first (`skewwatch topics`)")
        assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_end(*assigned)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    def _take(self, value: bytes | None) -> None:
        if not value:
            return
        correction = decode_correction(value)
        last = self._latest.get(correction.model)
        if last is None or correction.seq > last.seq:
            self._latest[correction.model] = correction

    async def wait_for(self, models: list[str], step_end: float, timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            ready = [self._latest.get(m) for m in models]
            if all(r is not None and r.ts >= step_end for r in ready):
                return [r.to_dict() for r in ready if r is not None]
            left = deadline - time.monotonic()
            if left <= 0:
                self.misses += 1
                self.missed_steps.append(step_end)
                return [r.to_dict() for r in ready if r is not None]
            assert self._consumer is not None, "start() first"
            batches = await self._consumer.getmany(timeout_ms=int(min(left, 0.5) * 1000))
            for records in batches.values():
                for rec in records:
                    self._take(rec.value)
            await asyncio.sleep(0)


async def run_kafka_loop(sim: FleetSimulator, producer: Any, corrections: KafkaCorrections, *,
                         lag_steps: int = 2, timeout_s: float = 30.0, first_timeout_s: float = 120.0) -> None:
    """Drive ``sim`` through the real worker: produce step k, then wait for the correction of
    step ``k - lag_steps`` and apply it before step k+1 is simulated (lockstep on event time).

    The lag covers the worker's allowed lateness: a step closes only when later events have
    moved the watermark past it, so step k's own events cannot close step k. ``producer`` is a
    started :class:`~skewwatch.sim.emit.TrafficProducer`.
    """
    models = list(sim.pools)
    first = True
    for chunk in sim.chunks():
        await producer.send_chunk(chunk)
        await producer.flush()
        wanted = chunk.end_ts - lag_steps * STEP_S
        if wanted <= sim.start_ts or chunk.end_ts > sim.end_ts:
            continue  # nothing to wait for yet, or no arrivals left to route (the fleet only drains)
        # The first correction also waits for the worker to join its consumer group and catch up.
        wait = max(timeout_s, first_timeout_s) if first else timeout_s
        first = False
        for record in await corrections.wait_for(models, wanted, wait):
            sim.apply_correction(record, chunk.end_ts)
