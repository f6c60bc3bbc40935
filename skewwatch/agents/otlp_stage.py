"""The OTLP stage: OpenTelemetry request spans from a Kafka topic -> request events on ``llm.requests``.

Issue 7 ("OTLP in", recipe 1 of docs/connect.md): "The worker consumes OTLP spans from a Kafka
topic (both encodings the Collector's Kafka exporter writes)". Runs in the worker only when
``topics.otlp_spans`` is set (env ``SKEWWATCH_TOPICS__OTLP_SPANS``); consumer group ``<group>.otlp``.

Each record value is one complete ``ExportTraceServiceRequest`` (protobuf or OTLP/JSON, setting
``otlp.encoding``: ``auto`` detects per record) keyed by nothing or by trace id, so the events it
holds are **re-keyed by replica**: per poll, the valid events of every record are grouped by
replica and published on ``topics.requests`` as ``{"v": 1, "events": [...]}`` messages (at most
``otlp.max_events_per_message`` each), key = replica. Stage 1 then windows them like any other
request events (and derives their batch size from telemetry, contract v1.1).

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
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from skewwatch.agents.metrics import WorkerMetrics
from skewwatch.config import ConfigError, Settings
from skewwatch.otlp.attribute_map import DEFAULT_ATTRIBUTE_MAP, AttributeMap
from skewwatch.otlp.decode import ENCODINGS, Encoding, decode_otlp_traces
from skewwatch.schemas.dead_letter import dead_letter_record
from skewwatch.schemas.rejection import Rejection
from skewwatch.schemas.requests import check_request_event, encode_request_events

log = logging.getLogger(__name__)

_MAX_RECORDS_PER_POLL = 500  # a record holds a Collector batch (often hundreds of spans)


def otlp_attribute_map(settings: Settings) -> AttributeMap:
    """The attribute map with the ``[otlp]`` overrides; ConfigError naming the setting if invalid."""
    otlp = settings.otlp
    if otlp.encoding not in ENCODINGS:
        raise ConfigError(f"otlp.encoding: {otlp.encoding!r} is not one of {', '.join(ENCODINGS)}")
    if otlp.max_events_per_message < 1:
        raise ConfigError(f"otlp.max_events_per_message: must be >= 1, got {otlp.max_events_per_message}")
    overrides: dict[str, Any] = {}
    if otlp.default_model:
        overrides["default_model"] = otlp.default_model
    if otlp.replica_keys:
        overrides["replica_keys"] = otlp.replica_keys
    try:
        return DEFAULT_ATTRIBUTE_MAP.with_overrides(overrides)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


@dataclass(slots=True)
class TranslatedPoll:
    """What a poll of OTLP records becomes: messages for ``llm.requests`` and what was left out."""

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)  # (replica key, batch value)
    rejects: list[list[Rejection]] = field(default_factory=list)  # per input record
    skipped: Counter[str] = field(default_factory=Counter)  # spans that are not requests, by reason
    spans: int = 0
    events: int = 0  # events in `messages`


def translate_records(values: list[bytes | None], settings: Settings,
                      attribute_map: AttributeMap | None = None) -> TranslatedPoll:
    """Decode OTLP record values, validate the events as the worker will, re-key them by replica.

    No I/O: the stage produces what this returns. Events keep the order of the records and of the
    spans within them; a replica's events of the whole poll travel together (fewer, larger messages).
    """
    amap = attribute_map if attribute_map is not None else otlp_attribute_map(settings)
    encoding = cast(Encoding, settings.otlp.encoding)
    out = TranslatedPoll()
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for value in values:
        result = decode_otlp_traces(value, encoding, amap)
        rejects = list(result.rejections)
        for position, event in enumerate(result.events):
            problem = check_request_event(event, settings.limits)
            if problem is not None:
                rejects.append(Rejection(problem.reason_code,
                                         f"request {event.get('request_id')}: {problem.reason}", position))
                continue
            by_replica.setdefault(str(event["replica"]), []).append(event)
            out.events += 1
        out.rejects.append(rejects)
        out.skipped.update(result.skipped)
        out.spans += result.spans_total
    chunk = settings.otlp.max_events_per_message
    for replica, events in by_replica.items():
        key = replica.encode()
        out.messages.extend((key, encode_request_events(events[i:i + chunk])) for i in range(0, len(events), chunk))
    return out


class OtlpStage:
    """Consumes ``topics.otlp_spans`` and publishes the request events on ``topics.requests``."""

    stage = "otlp"

    def __init__(self, settings: Settings, bootstrap: str, producer: AIOKafkaProducer,
                 metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.producer = producer
        self.metrics = metrics
        self.attribute_map = otlp_attribute_map(settings)
        self.consumer: AIOKafkaConsumer | None = None
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        kafka = self.settings.kafka
        self.consumer = AIOKafkaConsumer(
            self.settings.topics.otlp_spans,
            bootstrap_servers=self.bootstrap,
            group_id=f"{kafka.group_id}.otlp",
            client_id=f"{kafka.client_id}-otlp",
            enable_auto_commit=False,  # committed after the re-published events are acknowledged
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        await self.consumer.start()
        try:
            while not self._stopping.is_set():
                batches = await self.consumer.getmany(timeout_ms=200, max_records=_MAX_RECORDS_PER_POLL)
                commits = {}
                for tp, records in batches.items():
                    if records:
                        await self._process(tp.topic, tp.partition, records)
                        commits[tp] = records[-1].offset + 1
                if commits:
                    try:
                        await self.consumer.commit(commits)
                    except Exception as exc:  # a rebalance: the records come again (at least once)
                        log.warning("OTLP offset commit failed (rebalance in progress?): %s", exc)
        finally:
            await self.consumer.stop()

    def stop(self) -> None:
        self._stopping.set()

    async def _process(self, topic: str, partition: int, records: list[Any]) -> None:
        self.metrics.messages_in.labels(topic).inc(len(records))
        poll = translate_records([r.value for r in records], self.settings, self.attribute_map)
        self.metrics.otlp_spans_in.inc(poll.spans)
        for reason, count in poll.skipped.items():
            self.metrics.otlp_spans_skipped.labels(reason).inc(count)
        topics = self.settings.topics
        pending = [await self.producer.send(topics.requests, key=key, value=value) for key, value in poll.messages]
        now = time.time()
        for record, rejects in zip(records, poll.rejects, strict=True):
            if not rejects:
                continue
            for reject in rejects:
                self.metrics.rejected.labels(reject.reason_code).inc()
            dead = dead_letter_record(source_topic=topic, partition=partition, offset=record.offset,
                                      key=record.key, value=record.value, rejects=rejects, ts=now)
            pending.append(await self.producer.send(topics.dead_letter, key=record.key, value=dead))
        await asyncio.gather(*pending)  # acknowledged (acks=all) before the offsets are committed
        self.metrics.otlp_events_out.inc(poll.events)


__all__ = ["OtlpStage", "TranslatedPoll", "otlp_attribute_map", "translate_records"]
