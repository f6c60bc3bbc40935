"""Producing synthetic traffic to Kafka: keys, batching per replica and event-time pacing.

Contract v1: topic ``llm.requests``, key = replica id, value = one event object or
``{"events": [...]}`` (a batch from one producer, here always one replica's events so the key
stays meaningful). Telemetry goes to ``llm.gpu-telemetry`` keyed by replica too.

``speed`` paces by event time: 1.0 releases an event when the wall clock has advanced as far as
its ``ts`` since the first event, 10.0 ten times faster, None as fast as Kafka takes them. The
producer is aiokafka's (``linger_ms`` 5, ``acks="all"``); delivery futures are awaited in
groups so a broker error surfaces instead of vanishing.

The pure parts (grouping per replica, the pacing clock) are separate classes, tested without a
broker:

>>> b = ReplicaBatcher(batch=2)
>>> b.add({"replica": "r0", "ts": 1.0}), b.add({"replica": "r1", "ts": 1.1})
([], [])
>>> b.add({"replica": "r0", "ts": 1.2})
[('r0', [{'replica': 'r0', 'ts': 1.0}, {'replica': 'r0', 'ts': 1.2}])]
>>> b.flush()
[('r1', [{'replica': 'r1', 'ts': 1.1}])]
>>> p = EventTimePacer(speed=10.0, now=lambda: 100.0)
>>> p.delay(50.0), p.delay(55.0)
(0.0, 0.5)
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from skewwatch.errors import SkewwatchError
from skewwatch.kafka_client import client_kwargs
from skewwatch.schemas.requests import encode_request_event, encode_request_events
from skewwatch.schemas.telemetry import encode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.generator import TrafficChunk, event_rows

Event = Mapping[str, Any]
MAX_EVENTS_PER_MESSAGE = 2000  # well under limits.max_events_per_message and the 1 MiB value limit


class TopicMissingError(SkewwatchError, RuntimeError):
    """The target topic does not exist (skewwatch never relies on auto-creation)."""

    exit_code = 2  # generate and simulate report it as a setting to fix (ConfigProblem)


class ReplicaBatcher:
    """Groups events per replica into messages of up to ``batch`` events.

    A group is also released when the newest event seen is ``max_delay_s`` of event time past
    the group's oldest, so a slow replica's events are not held back for long (the pipeline's
    watermark and allowed lateness are in event time too).
    """

    def __init__(self, batch: int, max_delay_s: float = 1.0) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        self.max_delay_s = max_delay_s
        self._groups: dict[str, list[Event]] = {}

    def add(self, event: Event) -> list[tuple[str, list[Event]]]:
        """Add one event; returns the groups that are now complete, oldest first."""
        replica = str(event["replica"])
        group = self._groups.setdefault(replica, [])
        group.append(event)
        ready: list[tuple[str, list[Event]]] = []
        if len(group) >= self.batch:
            ready.append((replica, self._groups.pop(replica)))
        # Groups are created in event-time order (dicts keep insertion order), so the stale ones
        # are at the front: look only there instead of scanning every replica on every event.
        ts = float(event["ts"])
        while self._groups:
            oldest = next(iter(self._groups))
            if ts - float(self._groups[oldest][0]["ts"]) < self.max_delay_s:
                break
            ready.append((oldest, self._groups.pop(oldest)))
        return ready

    def flush(self) -> list[tuple[str, list[Event]]]:
        out = list(self._groups.items())
        self._groups.clear()
        return out


class EventTimePacer:
    """Maps event time to wall time: the first event anchors both clocks."""

    def __init__(self, speed: float | None, now: Callable[[], float] = time.monotonic) -> None:
        if speed is not None and speed <= 0:
            raise ValueError(f"speed must be > 0 (or None for as fast as possible), got {speed}")
        self.speed = speed
        self._now = now
        self._anchor: tuple[float, float] | None = None  # (event ts, wall time)

    def delay(self, ts: float) -> float:
        """Seconds to wait before releasing an event with this ``ts`` (0 when it is due)."""
        if self.speed is None:
            return 0.0
        now = self._now()
        if self._anchor is None:
            self._anchor = (ts, now)
            return 0.0
        due = self._anchor[1] + (ts - self._anchor[0]) / self.speed
        return max(due - now, 0.0)


@dataclass(slots=True)
class ProduceStats:
    events: int = 0  # request events produced
    messages: int = 0  # request messages (events / batch, roughly)
    telemetry: int = 0  # telemetry samples produced
    first_ts: float | None = None
    last_ts: float | None = None


class _Sender:
    """An aiokafka producer plus bounded bookkeeping of in-flight deliveries."""

    def __init__(self, bootstrap: str, acks: str | int, linger_ms: int, **producer_options: Any) -> None:
        self.producer = AIOKafkaProducer(**client_kwargs(bootstrap=bootstrap), acks=acks, linger_ms=linger_ms,
                                         client_id="skewwatch-generate", **producer_options)
        self._inflight: list[asyncio.Future[Any]] = []

    async def start(self, topics: Iterable[str], topic_wait_s: float) -> None:
        await self.producer.start()
        for topic in topics:
            try:
                await asyncio.wait_for(self.producer.partitions_for(topic), topic_wait_s)
            except Exception as exc:  # UnknownTopicOrPartitionError or the wait's timeout
                await self.producer.stop()
                raise TopicMissingError(
                    f"topic {topic!r} does not exist on the cluster; create it first "
                    f"(`skewwatch topics`), skewwatch does not rely on auto-creation"
                ) from exc

    async def send(self, topic: str, key: str, value: bytes) -> None:
        self._inflight.append(await self.producer.send(topic, value=value, key=key.encode()))
        if len(self._inflight) >= 5000:
            await self.drain()

    async def drain(self) -> None:
        inflight, self._inflight = self._inflight, []
        if inflight:
            await asyncio.gather(*inflight)

    async def stop(self) -> None:
        try:
            await self.producer.flush()
            await self.drain()
        finally:
            await self.producer.stop()


async def _aiter(items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


class TrafficProducer:
    """Requests (single or batched per replica) and telemetry to Kafka, paced by event time.

    An async context manager; :meth:`send_chunk` for generator/simulator chunks, :meth:`send`
    for one item, :meth:`flush` to release partial batches and wait for the broker's acks (a
    closed loop does this at every step, before it waits for the step's routing correction).
    """

    def __init__(self, bootstrap: str, *, requests_topic: str, telemetry_topic: str | None = None,
                 batch: int = 1, speed: float | None = None, max_batch_delay_s: float = 1.0,
                 acks: str | int = "all", linger_ms: int = 5, topic_wait_s: float = 10.0,
                 stats: ProduceStats | None = None, client_options: Mapping[str, Any] | None = None) -> None:
        self.requests_topic = requests_topic
        self.telemetry_topic = telemetry_topic
        self.batch = batch
        self.stats = ProduceStats() if stats is None else stats
        self._sender = _Sender(bootstrap, acks, linger_ms, **(client_options or {}))
        self._topic_wait_s = topic_wait_s
        self._pacer = EventTimePacer(speed)
        self._batcher = ReplicaBatcher(min(batch, MAX_EVENTS_PER_MESSAGE), max_batch_delay_s)

    async def start(self) -> None:
        topics = [self.requests_topic] + ([self.telemetry_topic] if self.telemetry_topic else [])
        await self._sender.start(topics, self._topic_wait_s)

    async def stop(self) -> None:
        try:
            await self._send_groups(self._batcher.flush())
        finally:
            await self._sender.stop()

    async def __aenter__(self) -> TrafficProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _send_groups(self, groups: list[tuple[str, list[Event]]]) -> None:
        for replica, group in groups:
            value = encode_request_event(group[0]) if self.batch == 1 else encode_request_events(group)
            await self._sender.send(self.requests_topic, replica, value)
            self.stats.messages += 1

    async def send(self, item: Event | TelemetrySample) -> None:
        stats = self.stats
        ts = float(item.ts if isinstance(item, TelemetrySample) else item["ts"])
        wait = self._pacer.delay(ts)
        if wait > 0.001:  # sub-millisecond sleeps cost more than they pace
            await asyncio.sleep(wait)
        stats.first_ts = ts if stats.first_ts is None else stats.first_ts
        stats.last_ts = ts
        if isinstance(item, TelemetrySample):
            if self.telemetry_topic is not None:
                await self._sender.send(self.telemetry_topic, item.replica, encode_telemetry(item))
                stats.telemetry += 1
            return
        stats.events += 1
        await self._send_groups(self._batcher.add(item))

    async def send_chunk(self, chunk: TrafficChunk) -> None:
        for item in merged_items(chunk):
            await self.send(item)
        await asyncio.sleep(0)  # let deliveries and Ctrl-C in between chunks at speed=max

    async def flush(self) -> None:
        await self._send_groups(self._batcher.flush())
        await self._sender.producer.flush()
        await self._sender.drain()


async def produce_events(bootstrap: str, topic: str, events: Iterable[Event] | AsyncIterable[Event], *,
                         batch: int = 1, speed: float | None = None, max_batch_delay_s: float = 1.0,
                         acks: str | int = "all", linger_ms: int = 5, topic_wait_s: float = 10.0,
                         stats: ProduceStats | None = None,
                         client_options: Mapping[str, Any] | None = None) -> ProduceStats:
    """Produce request events (contract v1) keyed by replica; see the module docstring.

    ``stats`` (optional) is updated as messages go out, so a caller still has the counts when
    the run is cancelled.
    """
    async with TrafficProducer(bootstrap, requests_topic=topic, batch=batch, speed=speed,
                               max_batch_delay_s=max_batch_delay_s, acks=acks, linger_ms=linger_ms,
                               topic_wait_s=topic_wait_s, stats=stats, client_options=client_options) as producer:
        async for event in _aiter(events):
            await producer.send(event)
    return producer.stats


def merged_items(chunk: TrafficChunk) -> Iterable[Event | TelemetrySample]:
    """A chunk's requests and telemetry in one nondecreasing ``ts`` order."""
    rows: Iterable[Event] = event_rows(chunk.requests)
    return heapq.merge(rows, chunk.telemetry,
                       key=lambda x: x.ts if isinstance(x, TelemetrySample) else float(x["ts"]))


async def produce_traffic(bootstrap: str, chunks: Iterable[TrafficChunk], *, requests_topic: str,
                          telemetry_topic: str | None, batch: int = 1, speed: float | None = None,
                          max_batch_delay_s: float = 1.0, acks: str | int = "all", linger_ms: int = 5,
                          topic_wait_s: float = 10.0, stats: ProduceStats | None = None,
                          client_options: Mapping[str, Any] | None = None) -> ProduceStats:
    """Produce a generator run: requests (single or batched) and, unless ``telemetry_topic`` is
    None, its telemetry samples, interleaved in event time."""
    async with TrafficProducer(bootstrap, requests_topic=requests_topic, telemetry_topic=telemetry_topic,
                               batch=batch, speed=speed, max_batch_delay_s=max_batch_delay_s, acks=acks,
                               linger_ms=linger_ms, topic_wait_s=topic_wait_s, stats=stats,
                               client_options=client_options) as producer:
        for chunk in chunks:
            await producer.send_chunk(chunk)
    return producer.stats
