"""Decisions already on their topics: what a restored partition must not publish again.

A worker that stops without a last checkpoint (killed, out of memory) leaves its partitions' newest
steps to whoever restores them: the new owner replays the input after the checkpoint and makes the
same decisions again. A feature vector published twice is harmless (it is keyed by what it describes
and the step it ends). A routing correction is not: the replay re-sends older ``seq`` values after
newer ones, so a consumer reading the compacted topic in order would roll the weights back, and an
alert published again would page again.

So when stage 2 restores partitions, :func:`read_published` reads back what its decisions topics
got since the input being replayed was written (the first record at each restored position, less
``CLOCK_SKEW_S``): the newest ``seq`` per model on the corrections topic and the newest alert per
``(model, replica, detector)`` on the alerts topic. :class:`Published` then says whether a decision
is new: a correction whose ``seq`` is not above the newest on the topic, or an alert not newer than
the newest of its key (or of the same state at the newest time), is already there, exactly as the
replay would make it, and is not sent again.

>>> from skewwatch.schemas.alerts import Alert, Severity
>>> seen = Published()
>>> seen.add(RoutingCorrection("m", 60.0, 60_000, {"r1": 1.0}))
>>> seen.add(Alert(55.0, "m", "r1", "long_tail", Severity.WARNING, "open", "slow"))
>>> seen.correction_is_new("m", 60_000), seen.correction_is_new("m", 65_000), seen.correction_is_new("n", 5)
(False, True, True)
>>> [seen.alert_is_new("m", "r1", "long_tail", ts, state) for ts, state in [(55.0, "open"), (55.0, "resolved"),
...                                                                          (70.0, "resolved")]]
[False, True, True]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from skewwatch.agents.read_to_end import READ_TIMEOUT_MS, read_to_end
from skewwatch.kafka_client import refresh_metadata
from skewwatch.schemas.alerts import Alert, decode_alert
from skewwatch.schemas.corrections import RoutingCorrection, decode_correction

# Record timestamps come from the producers' clocks (stage 1's host for the input, the previous owner's
# for its outputs); reading this much earlier covers hosts whose clocks disagree by up to a minute.
CLOCK_SKEW_S = 60.0

AlertKey = tuple[str, str | None, str]  # (model, replica, detector)


@dataclass
class Published:
    """The newest correction ``seq`` per model, and the newest alert time per key with the states
    published at that time, found on the topics."""

    corrections: dict[str, int] = field(default_factory=dict)
    alerts: dict[AlertKey, tuple[float, frozenset[str]]] = field(default_factory=dict)

    def correction_is_new(self, model: str, seq: int) -> bool:
        """True unless the corrections topic has ``seq`` or a later one for ``model``."""
        return seq > self.corrections.get(model, -1)

    def alert_is_new(self, model: str, replica: str | None, detector: str, ts: float, state: str) -> bool:
        """True unless the alerts topic has this alert (its key, ``ts`` and ``state``) or a later one of its key."""
        newest = self.alerts.get((model, replica, detector))
        return newest is None or ts > newest[0] or (ts == newest[0] and state not in newest[1])

    def update(self, other: Published) -> None:
        """Add what a later read found (it only adds what was published since)."""
        for model, seq in other.corrections.items():
            self._correction(model, seq)
        for key, (ts, states) in other.alerts.items():
            for state in states:
                self._alert(key, ts, state)

    def add(self, record: RoutingCorrection | Alert) -> None:
        """One record of the corrections or alerts topic, as its decoder reads it."""
        if isinstance(record, RoutingCorrection):
            self._correction(record.model, record.seq)
        else:
            self._alert((record.model, record.replica, record.detector), record.ts, record.state)

    def _correction(self, model: str, seq: int) -> None:
        self.corrections[model] = max(seq, self.corrections.get(model, -1))

    def _alert(self, key: AlertKey, ts: float, state: str) -> None:
        newest = self.alerts.get(key)
        if newest is None or ts > newest[0]:
            self.alerts[key] = (ts, frozenset({state}))
        elif ts == newest[0]:
            self.alerts[key] = (ts, newest[1] | {state})


async def read_published(connection: Mapping[str, Any], input_topic: str, starts: Mapping[int, int | None],
                         corrections_topic: str, alerts_topic: str) -> Published:
    """What the decisions topics got since the first input record a restore will replay.

    ``starts``: each restored partition of ``input_topic`` and the offset it is replayed from (None: from
    the beginning, no checkpoint). Nothing to replay (every position at the end): nothing is read.
    """
    found = Published()
    consumer = AIOKafkaConsumer(**connection, enable_auto_commit=False)
    await consumer.start()
    try:
        # the outputs' partitions, before the first assign(): until then the client tracks no topic and
        # its metadata holds all of them (as in skewwatch.agents.checkpoint)
        await refresh_metadata(consumer)
        decoders: dict[str, Callable[[bytes], RoutingCorrection | Alert]] = {
            corrections_topic: decode_correction, alerts_topic: decode_alert}
        tps = [TopicPartition(topic, p) for topic in decoders
               for p in sorted(consumer.partitions_for_topic(topic) or ())]
        since_ms = await _first_timestamp(consumer, input_topic, starts)
        if since_ms is None or not tps:
            return found
        since_ms -= int(CLOCK_SKEW_S * 1000)
        consumer.assign(tps)
        starts_at = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
        ends = await consumer.end_offsets(tps)
        pending = set()
        for tp in tps:
            start = starts_at.get(tp)
            if start is not None and start.offset < ends[tp]:
                consumer.seek(tp, start.offset)
                pending.add(tp)
        async for message in read_to_end(consumer, pending, ends):
            if message.value is None:
                continue
            try:
                found.add(decoders[message.topic](message.value))
            except ValueError:  # not ours (another writer): not a decision
                continue
        return found
    finally:
        await consumer.stop()


async def _first_timestamp(consumer: AIOKafkaConsumer, topic: str, starts: Mapping[int, int | None]) -> int | None:
    """The earliest timestamp (ms) of the first record at or after each start; None when there is none."""
    tps = {TopicPartition(topic, p): offset for p, offset in starts.items()}
    if not tps:
        return None
    consumer.assign(list(tps))
    ends = await consumer.end_offsets(list(tps))
    for tp, offset in tps.items():
        if offset is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)
    pending = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
    earliest: int | None = None
    deadline = time.monotonic() + 30.0
    while pending and time.monotonic() < deadline:
        batch = await consumer.getmany(*pending, timeout_ms=READ_TIMEOUT_MS, max_records=len(pending) * 100)
        for tp, messages in batch.items():
            if messages and tp in pending:
                earliest = messages[0].timestamp if earliest is None else min(earliest, messages[0].timestamp)
                pending.discard(tp)
    if pending:  # records there, but none came back in time: read everything still on the topics
        return 0
    return earliest


__all__ = ["CLOCK_SKEW_S", "Published", "read_published"]
