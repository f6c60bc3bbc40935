"""The OTLP stage: OpenTelemetry request spans from a Kafka topic -> request events on ``llm.requests``.

Recipe 1 of docs/connect.md: the worker consumes OTLP spans from a Kafka topic, in both encodings
the Collector's Kafka exporter writes. Runs in the worker only when
``topics.otlp_spans`` is set (env ``SKEWWATCH_TOPICS__OTLP_SPANS``); consumer group ``<group>.otlp``.

Each record value is one complete ``ExportTraceServiceRequest`` (protobuf or OTLP/JSON, setting
``otlp.encoding``: ``auto`` detects per record) keyed by nothing or by trace id, so the events it
holds are **re-keyed by replica**: per poll (all partitions together), the valid events of every
record are grouped by replica, **sorted by event time** and published on ``topics.requests`` as
``{"v": 1, "events": [...]}`` messages (at most ``otlp.max_events_per_message`` each), key =
replica. Stage 1 then windows them like any other request events (and derives their batch size
from telemetry, contract v1.1).

Event-time order: the exporter spreads one replica's spans over every partition of the OTLP topic
(nil keys go to any partition, trace-id keys hash anywhere), so they are read in no particular
order, and stage 1 counts an event more than ``window.allowed_lateness_s`` behind its replica's
newest as late. Two measures keep them in order: a poll's events are sorted (all partitions
together), and the partitions are **aligned** (as Flink's watermark alignment): with ``floor`` the
earliest next event time of the partitions that still have a backlog, a record whose oldest event
is more than half the allowed lateness past ``floor`` is not processed yet: its partition is
rewound to it (``seek``) and paused until the others catch up. The partition defining ``floor``
always advances, so nothing stalls. Live, every partition is read at its end and nothing waits;
catching up on a backlog, the partitions advance together in event time.

* Spans that are not inference requests are skipped and counted
  (``skewwatch_otlp_spans_skipped_total{reason}``), never dead-lettered.
* A record that is not OTLP at all (``malformed_otlp``), a span that is a request but cannot be
  mapped (``wrong_type``, ``missing_field``, ...) and a mapped event that breaks the contract (the
  worker's own rules, :func:`~skewwatch.schemas.requests.check_request_event`) are dead-lettered
  with the *original record* and the reasons, and counted in ``skewwatch_rejected_total{reason}``.
  For an OTLP record, a rejection's ``event_index`` is the span's position (mapping problems) or the
  mapped event's position (contract problems), and the reason names the span or request id.
* **Delivery: at least once.** The OTLP offsets are committed only after every message of the poll
  has been acknowledged by the broker (``acks=all``); a crash in between re-publishes that poll, so
  its requests are counted twice in the windows they fall in. (Exactly once would need a
  transactional producer spanning the commit; not worth it for spans sampled by a tracer anyway.)

>>> from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
>>> from skewwatch.config import Settings
>>> poll = translate_records([ExportTraceServiceRequest().SerializeToString(), b"{not otlp"], Settings())
>>> poll.messages, [[r.reason_code for r in rejects] for rejects in poll.rejects]
([], [[], ['malformed_otlp']])
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import AIOKafkaProducer, TopicPartition

from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.agents.stage import Stage
from skewwatch.config import Settings
from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, AttributeMap
from skewwatch.otlp.decode import Encoding, decode_otlp_traces
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests import check_request_event, encode_request_events

log = logging.getLogger(__name__)

_MAX_RECORDS_PER_POLL = 500  # a record holds a Collector batch (often hundreds of spans)


def otlp_attribute_map(settings: Settings) -> AttributeMap:
    """The attribute map with the ``[otlp]`` overrides (checked when the settings loaded)."""
    otlp = settings.otlp
    overrides: dict[str, Any] = {}
    if otlp.default_model:
        overrides["default_model"] = otlp.default_model
    if otlp.replica_keys:
        overrides["replica_keys"] = otlp.replica_keys
    return DEFAULT_ATTRIBUTE_MAP.with_overrides(overrides)


@dataclass(slots=True)
class DecodedRecord:
    """One OTLP record: its valid events, why the others were rejected, what it skipped."""

    events: list[dict[str, Any]]
    rejects: list[Rejection]
    skipped: Counter[str]
    spans: int

    @property
    def oldest(self) -> float | None:
        return min((float(e["ts"]) for e in self.events), default=None)

    @property
    def newest(self) -> float | None:
        return max((float(e["ts"]) for e in self.events), default=None)


def decode_record(value: bytes | None, settings: Settings, attribute_map: AttributeMap) -> DecodedRecord:
    """Decode one OTLP record value and validate its events as the worker will (contract v1.1)."""
    result = decode_otlp_traces(value, cast(Encoding, settings.otlp.encoding), attribute_map)
    rejects = list(result.rejections)
    events = []
    for position, event in enumerate(result.events):
        problem = check_request_event(event, settings.limits)
        if problem is None:
            events.append(event)
        else:
            rejects.append(Rejection(problem.reason_code, f"request {event.get('request_id')}: {problem.reason}",
                                     position))
    return DecodedRecord(events, rejects, result.skipped, result.spans_total)


def requests_messages(records: list[DecodedRecord], max_events_per_message: int) -> list[tuple[bytes, bytes]]:
    """The records' events re-keyed by replica: ``(replica key, {"v": 1, "events": [...]})`` messages,
    each replica's events sorted by ``ts`` (records of several partitions interleave in no order)."""
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        for event in record.events:
            by_replica.setdefault(str(event["replica"]), []).append(event)
    messages = []
    for replica, events in by_replica.items():
        events.sort(key=_event_time)  # stable: equal times keep the records' order
        key = replica.encode()
        messages += [(key, encode_request_events(events[i:i + max_events_per_message]))
                     for i in range(0, len(events), max_events_per_message)]
    return messages


@dataclass(slots=True)
class TranslatedPoll:
    """What a poll of OTLP records becomes: messages for ``llm.requests`` and what was left out."""

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)  # (replica key, batch value)
    rejects: list[list[Rejection]] = field(default_factory=list)  # per input record
    skipped: Counter[str] = field(default_factory=Counter)  # spans that are not requests, by reason
    spans: int = 0
    events: int = 0  # events in `messages`


def translate_records(values: Sequence[bytes | None], settings: Settings,
                      attribute_map: AttributeMap | None = None) -> TranslatedPoll:
    """Decode OTLP record values, validate the events as the worker will, re-key them by replica.
    No I/O: the stage produces what this returns (less the records it holds back to align partitions)."""
    amap = attribute_map if attribute_map is not None else otlp_attribute_map(settings)
    records = [decode_record(value, settings, amap) for value in values]
    return _summarise(records, settings)


def _summarise(records: list[DecodedRecord], settings: Settings) -> TranslatedPoll:
    out = TranslatedPoll(messages=requests_messages(records, settings.otlp.max_events_per_message))
    for record in records:
        out.rejects.append(record.rejects)
        out.skipped.update(record.skipped)
        out.spans += record.spans
        out.events += len(record.events)
    return out


def _event_time(event: dict[str, Any]) -> float:
    return float(event["ts"])


class OtlpStage(Stage):
    """Consumes ``topics.otlp_spans`` and publishes the request events on ``topics.requests``."""

    stage = "otlp"  # its consumer group and client id are named so
    max_records = _MAX_RECORDS_PER_POLL
    consumer_options = {"max_partition_fetch_bytes": 4 * 1024 * 1024}

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        super().__init__(settings, bootstrap, producer, metrics)
        self.attribute_map = otlp_attribute_map(settings)
        # per partition, for the alignment: the newest event time published, and the oldest event
        # time of the record it was rewound to (held back, waiting for the slower partitions)
        self.progress: dict[TopicPartition, float] = {}
        self.waiting: dict[TopicPartition, float] = {}

    def topics(self) -> list[str]:
        return [self.settings.topics.otlp_spans]

    async def handle(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Publish what the poll holds (and is in event-time reach), commit the offsets it covers
        once acknowledged (at least once: committed after the re-published events, not with them),
        then pause or resume partitions to keep them aligned."""
        consumer = self.consumer
        assert consumer is not None
        commits = await self._process(batches) if batches else {}
        if commits:
            try:
                await consumer.commit(commits)
            except Exception as exc:  # a rebalance: the records come again (at least once)
                log.warning("OTLP offset commit failed (rebalance in progress?): %s", exc)
        await self._align()

    def _next_time(self, tp: TopicPartition) -> float:
        """Lower bound of the event times a partition will publish next."""
        return self.waiting.get(tp, self.progress.get(tp, -math.inf))

    async def _behind(self) -> list[TopicPartition]:
        """Assigned partitions with a backlog (or not fetched yet: assume one)."""
        consumer = self.consumer
        assert consumer is not None
        out = []
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            try:
                position = await asyncio.wait_for(consumer.position(tp), 1.0)
            except Exception:  # rebalancing, or no position yet
                position = None
            if high is None or position is None or position < high:
                out.append(tp)
        return out

    async def _align(self) -> None:
        """Pause the partitions ahead of the slowest one with a backlog; resume the others."""
        consumer = self.consumer
        assert consumer is not None
        slack = self.settings.window.allowed_lateness_s / 2
        floor = min((self._next_time(tp) for tp in await self._behind()), default=None)
        paused = consumer.paused()
        for tp in consumer.assignment():
            ahead = floor is not None and self._next_time(tp) > floor + slack
            if ahead and tp not in paused:
                consumer.pause(tp)
            elif not ahead and tp in paused:
                consumer.resume(tp)

    async def _process(self, batches: dict[TopicPartition, list[Any]]) -> dict[TopicPartition, int]:
        """Decode a poll, publish what is in event-time reach (and the dead letters), wait until the
        broker acknowledged it; rewind the partitions whose records must wait. The offsets to commit."""
        consumer = self.consumer
        assert consumer is not None
        topics = self.settings.topics
        self.metrics.messages_in.labels(topics.otlp_spans).inc(sum(len(part) for part in batches.values()))
        decoded = {tp: [decode_record(r.value, self.settings, self.attribute_map) for r in part]
                   for tp, part in batches.items() if part}
        # floor: the earliest next event time among this poll's partitions and the backlogged others
        candidates = [next((d.oldest for d in records if d.oldest is not None), math.inf)
                      for records in decoded.values()]
        candidates += [self._next_time(tp) for tp in await self._behind() if tp not in decoded]
        limit = min(candidates, default=math.inf) + self.settings.window.allowed_lateness_s / 2
        kept: list[tuple[TopicPartition, Any, DecodedRecord]] = []
        commits: dict[TopicPartition, int] = {}
        for tp, records in decoded.items():
            self.waiting.pop(tp, None)
            for record, result in zip(batches[tp], records, strict=True):
                oldest = result.oldest
                if oldest is not None and oldest > limit:  # ahead of a slower partition: later
                    consumer.seek(tp, record.offset)
                    self.waiting[tp] = oldest
                    break
                kept.append((tp, record, result))
                commits[tp] = record.offset + 1
                newest = result.newest
                if newest is not None:
                    self.progress[tp] = max(self.progress.get(tp, -math.inf), newest)
        poll = _summarise([result for _, _, result in kept], self.settings)
        self.metrics.otlp_spans_in.inc(poll.spans)
        for reason, count in poll.skipped.items():
            self.metrics.otlp_spans_skipped.labels(reason).inc(count)
        pending = [await self.producer.send(topics.requests, key=key, value=value) for key, value in poll.messages]
        for (tp, record, _), rejects in zip(kept, poll.rejects, strict=True):
            if not rejects:
                continue
            pending.append(await self.dead_letter(tp, record, rejects))
        await asyncio.gather(*pending)  # acknowledged (acks=all) before the offsets are committed
        self.metrics.otlp_events_out.inc(poll.events)
        return commits


__all__ = ["DecodedRecord", "OtlpStage", "TranslatedPoll", "decode_record", "otlp_attribute_map",
           "requests_messages", "translate_records"]
