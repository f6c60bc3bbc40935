"""The benchmark's input: one generator run produced twice, as single-event and as batched messages.

Every contender reads the same pre-produced topic: >= 1M request events from the generator,
realistic sizes, >= 64 replicas, 8 partitions. One pass of :func:`skewwatch.sim.generator.generate_chunks`
feeds two :class:`~skewwatch.sim.emit.TrafficProducer` s, so both topics hold exactly the same
events: one per message (key = replica), and ``{"v": 1, "events": [...]}`` messages of up to
``batch`` events of one replica (the contract's batch form, what a sidecar that batches per replica
would send). A batch is also released after ``max_batch_delay_s`` of event time, kept under the
worker's allowed lateness so batching never makes an event late.

At the end, one *sentinel* event per partition (model ``bench-sentinel``) with a timestamp past the
last step pushes every partition's watermark beyond the step that holds the last real event, so the
real worker closes and publishes that step: the end-to-end measurement ends when the per-model
vector of that step is on ``llm.features``. Every contender decodes and counts the sentinels too.

>>> last_step_end(1000.0, 5.0), last_step_end(1003.2, 5.0)
(1005.0, 1005.0)
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.throughput.common import fresh_settings
from skewwatch.config import WindowSettings
from skewwatch.schemas.requests import encode_request_event, encode_request_events
from skewwatch.sim.emit import TrafficProducer
from skewwatch.sim.generator import GeneratorConfig, event_rows, generate_chunks
from skewwatch.topics import ensure_topics

START_TS = 1_700_000_000.0
SENTINEL_MODEL = "bench-sentinel"


@dataclass(frozen=True, slots=True)
class Dataset:
    """Where the events are and what a contender must find there."""

    bootstrap: str
    single_topic: str
    batched_topic: str
    partitions: int
    events: int  # every event on each topic, sentinels included
    generated: int  # generator events (events - sentinels)
    sentinels: int
    single_messages: int
    batched_messages: int
    batch: int
    models: tuple[str, ...]
    replicas: int  # in all models
    rate_per_replica: float
    event_bytes_mean: float
    first_ts: float
    last_ts: float
    last_step_end: float  # window_end of the step holding the last generated event
    produce_seconds: float

    def topic(self, batched: bool) -> str:
        return self.batched_topic if batched else self.single_topic

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def last_step_end(ts: float, step_s: float) -> float:
    """End of the 5 s step ``[k*step, (k+1)*step)`` that contains ``ts``."""
    return (math.floor(ts / step_s) + 1) * step_s


def sentinel_event(partition: int, ts: float) -> dict[str, Any]:
    return {"request_id": f"bench-sentinel-{partition}", "ts": ts, "model": SENTINEL_MODEL,
            "replica": f"bench-sentinel-{partition}", "latency_ms": 1.0, "prompt_tokens": 1,
            "completion_tokens": 1, "batch_size": 1, "batch_capacity": 1, "status": "ok"}


async def produce_dataset(bootstrap: str, *, events: int, models: tuple[str, ...] = ("llama-3-70b", "mixtral-8x7b"),
                          replicas_per_model: int = 64, rate: float = 40.0, batch: int = 100,
                          partitions: int = 8, max_batch_delay_s: float = 4.0, seed: int = 1,
                          window: WindowSettings | None = None) -> Dataset:
    """Create two fresh topics and produce ``events`` generator events to each (plus sentinels)."""
    window = window or WindowSettings()
    if max_batch_delay_s >= window.allowed_lateness_s:
        raise ValueError("max_batch_delay_s must stay under the allowed lateness, or batching makes events late")
    single = fresh_settings(bootstrap, partitions, "single")
    batched = fresh_settings(bootstrap, partitions, "batch")
    for settings in (single, batched):
        await ensure_topics(bootstrap, settings)
    config = GeneratorConfig(models=models, replicas=replicas_per_model, rate=rate, seed=seed, telemetry=False)
    n_replicas = len(models) * replicas_per_model
    duration = events / (n_replicas * rate) * 1.05 + 5.0  # Poisson: a little more, then cut at `events`
    started = time.perf_counter()
    produced = 0
    total_bytes = 0
    first_ts = last_ts = START_TS
    async with TrafficProducer(bootstrap, requests_topic=single.topics.requests, batch=1) as one, \
            TrafficProducer(bootstrap, requests_topic=batched.topics.requests, batch=batch,
                            max_batch_delay_s=max_batch_delay_s) as many:
        for chunk in generate_chunks(config, START_TS, duration):
            for row in event_rows(chunk.requests):
                if produced >= events:
                    break
                if produced == 0:
                    first_ts = float(row["ts"])
                last_ts = float(row["ts"])
                total_bytes += len(encode_request_event(row))
                await one.send(row)
                await many.send(row)
                produced += 1
            if produced >= events:
                break
            await asyncio.sleep(0)
    if produced < events:
        raise RuntimeError(f"the generator gave {produced} events, fewer than {events}")
    end = last_step_end(last_ts, window.step_s)
    sentinel_ts = end + window.allowed_lateness_s + window.step_s  # watermark passes `end` by a step
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for p in range(partitions):
            event = sentinel_event(p, sentinel_ts)
            key = str(event["replica"]).encode()
            await producer.send_and_wait(single.topics.requests, encode_request_event(event), key=key, partition=p)
            await producer.send_and_wait(batched.topics.requests, encode_request_events([event]), key=key,
                                         partition=p)
    finally:
        await producer.stop()
    return Dataset(
        bootstrap=bootstrap, single_topic=single.topics.requests, batched_topic=batched.topics.requests,
        partitions=partitions, events=produced + partitions, generated=produced, sentinels=partitions,
        single_messages=one.stats.messages + partitions, batched_messages=many.stats.messages + partitions,
        batch=batch, models=models, replicas=n_replicas, rate_per_replica=rate,
        event_bytes_mean=round(total_bytes / produced, 1), first_ts=first_ts, last_ts=last_ts,
        last_step_end=end, produce_seconds=round(time.perf_counter() - started, 1),
    )
