"""Subscribe to ``llm.routing-corrections``: the latest weights and actions per model, fail-static.

A scheduler (or a load-balancer bridge such as ``skewwatch apply haproxy``) keeps one
:class:`CorrectionsSubscriber` running. It reads the compacted corrections topic **from the start**
without a consumer group (every subscriber sees the whole current state, and a restart starts from it
again), keeps the latest correction per model, and drops any record whose ``seq`` is not above the
last one it kept for that model (a worker that replays a step re-sends the same seq; a record that
goes backwards is older news).

**Fail-static.** The worker publishes a correction for every model at least every heartbeat
(``heartbeat_s`` = 30 s; ``[detectors.corrections] heartbeat_s``), and each record says how long it
is valid (``valid_for_s``, contract v1.9; 90 s by default, ``[detectors.corrections] valid_for_s``).
When a model's newest record is older than that (judged on the records' Kafka timestamps, which the
worker's producer stamps with its wall clock; for a record without ``valid_for_s``, ``stale_after``
heartbeats, default 3), it has *expired*: the worker that owned it stopped, or cannot reach Kafka.
The subscriber then routes equally over the last known pool with no actions (``on_stale="equal"``,
the default: weights that nobody renews say nothing about the replicas any more) or keeps the last
weights (``on_stale="keep"``: actions running out at their own ``expires_at``), and logs it once.
Either way it never routes a pool to nowhere: a correction whose weights are all zero reads as
equal weights.

Each change (a new correction, a model turning stale or fresh again, a model removed by a tombstone)
is offered to every :meth:`CorrectionsSubscriber.changes` iterator.

Every record is read by the contract's one decoder,
:func:`skewwatch.schemas.corrections.decode_correction` (``mode`` is ``"normal"`` when the record has
none). In panic mode the worker asks the router to use every replica its weights name and to eject
none: a bridge then ignores ``drain``/``isolate`` actions (``skewwatch apply haproxy`` sets every
server ready).

>>> state = ModelState.from_value(b'{"model": "m", "ts": 60.0, "seq": 60000, "weights": {"a": 0.0, "b": 0.0}}',
...                               received_at=100.0)
>>> state.routing_weights(stale=False, on_stale="keep")  # never a pool routed to nowhere
{'a': 0.5, 'b': 0.5}
>>> state.is_stale(now=100.0 + 89.0, stale_after_s=90.0), state.is_stale(now=100.0 + 91.0, stale_after_s=90.0)
(False, True)

Typical use (an asyncio program; ``bootstrap`` is the Kafka cluster)::

    async with CorrectionsSubscriber(bootstrap) as corrections:
        await corrections.wait_caught_up()          # the whole current state is read
        print(corrections.weights("llama-3-8b"))     # {'r1': 0.34, 'r2': 0.33, ...}
        async for change in corrections.changes():   # then follow it
            apply(change.model, corrections.weights(change.model), corrections.actions(change.model))
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from skewwatch.errors import SkewwatchError
from skewwatch.schemas.alerts import Action
from skewwatch.schemas.corrections import Mode, RoutingCorrection, decode_correction

log = logging.getLogger(__name__)

OnStale = Literal["keep", "equal"]
ChangeKind = Literal["update", "stale", "fresh", "removed"]
DEFAULT_TOPIC = "llm.routing-corrections"
DEFAULT_HEARTBEAT_S = 30.0  # the worker's [detectors.corrections] heartbeat_s
DEFAULT_STALE_AFTER = 3.0  # heartbeats without a record before a model is stale


class CorrectionsError(SkewwatchError, RuntimeError):
    """The corrections topic cannot be read (no such topic, no Kafka); one actionable line."""


class CorrectionsTopicMissing(CorrectionsError):
    """The corrections topic does not exist (a [topics] name that is wrong, or nothing created it)."""


@dataclass(frozen=True, slots=True)
class ModelState:
    """The latest correction kept for one model, with when it arrived."""

    correction: RoutingCorrection
    received_at: float  # epoch s: the record's Kafka timestamp (the producer's wall clock)

    @classmethod
    def from_value(cls, value: bytes, received_at: float) -> ModelState:
        """Decode one record's value; ValueError naming the problem when it is not a correction."""
        return cls(decode_correction(value), received_at)

    @classmethod
    def from_record(cls, data: Mapping[str, Any], received_at: float) -> ModelState:
        """The same from a record already parsed to plain data, by the same rules."""
        return cls(RoutingCorrection.from_dict(data), received_at)

    @property
    def mode(self) -> Mode:
        """``"normal"`` or ``"panic"``: the record's, ``"normal"`` for a writer before contract v1.4."""
        mode = self.correction.mode
        assert mode is not None, "the decoder fills in a missing mode"
        return mode

    def valid_for(self, stale_after_s: float) -> float:
        """How long this record is valid after it arrived: its own ``valid_for_s`` (contract v1.9),
        else ``stale_after_s`` (a writer before v1.9)."""
        return self.correction.valid_for_s or stale_after_s

    def is_stale(self, now: float, stale_after_s: float) -> bool:
        """True when no record came for longer than it is valid (:meth:`valid_for`)."""
        return now - self.received_at > self.valid_for(stale_after_s)

    def routing_weights(self, stale: bool, on_stale: OnStale) -> dict[str, float]:
        """The weights to route with: the record's, or equal ones when stale (``equal``) or all zero."""
        weights = self.correction.weights
        if not weights:
            return {}
        if (stale and on_stale == "equal") or not any(w > 0 for w in weights.values()):
            share = 1.0 / len(weights)
            return {replica: share for replica in weights}
        return dict(weights)

    def live_actions(self, now: float, stale: bool, on_stale: OnStale) -> list[Action]:
        """The actions still in force at ``now`` (none when stale with ``equal``)."""
        if stale and on_stale == "equal":
            return []
        return [a for a in self.correction.actions if a.expires_at is None or a.expires_at > now]


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a model's routing state, as :meth:`CorrectionsSubscriber.changes` yields it."""

    kind: ChangeKind  # update | stale | fresh | removed
    model: str
    seq: int | None  # the correction's seq (None when removed)


@dataclass(slots=True)
class _Stats:
    records: int = 0
    kept: int = 0
    out_of_order: int = 0  # seq not above the last kept one
    malformed: int = 0
    tombstones: int = 0


class CorrectionsSubscriber:
    """The current routing corrections, per model, from the compacted topic; see the module docstring.

    ``client_kwargs`` go to :class:`aiokafka.AIOKafkaConsumer` as they are: the connection options of
    :func:`skewwatch.kafka_client.client_kwargs` (TLS/SASL, once configured), or your own.
    ``clock`` gives epoch seconds (tests pass their own).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str = DEFAULT_TOPIC,
        *,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        stale_after: float = DEFAULT_STALE_AFTER,
        on_stale: OnStale = "equal",
        client_kwargs: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if heartbeat_s <= 0 or stale_after <= 0:
            raise ValueError("heartbeat_s and stale_after must be > 0")
        if on_stale not in ("keep", "equal"):
            raise ValueError(f"on_stale must be 'keep' or 'equal', got {on_stale!r}")
        self.bootstrap = bootstrap
        self.topic = topic
        self.stale_after_s = heartbeat_s * stale_after
        self.on_stale: OnStale = on_stale
        self.client_kwargs = dict(client_kwargs or {})
        self.clock = clock
        self.stats = _Stats()
        self._models: dict[str, ModelState] = {}
        self._stale: set[str] = set()
        self._queues: list[asyncio.Queue[Change | None]] = []
        self._caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: Any = None
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, timeout: float = 30.0) -> None:
        """Connect, assign every partition of the topic and start reading from the beginning."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from skewwatch.kafka_client import client_kwargs

        options = {**client_kwargs(bootstrap=self.bootstrap), **self.client_kwargs}
        consumer = AIOKafkaConsumer(**options, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            async with asyncio.timeout(timeout):
                await consumer.start()
            partitions = await self._partitions(consumer, timeout)
        except Exception as exc:
            with contextlib.suppress(Exception):
                await consumer.stop()
            if isinstance(exc, CorrectionsError):
                raise
            from skewwatch.kafka_client import describe_exception

            raise CorrectionsError(f"cannot read {self.topic} at {self.bootstrap}: {describe_exception(exc)}") from exc
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        self._consumer = consumer
        self._task = asyncio.ensure_future(self._run(consumer, dict(ends)))

    async def _partitions(self, consumer: Any, timeout: float) -> set[int]:
        from skewwatch.kafka_client import refresh_metadata

        deadline = time.monotonic() + timeout
        while True:
            partitions = consumer.partitions_for_topic(self.topic)
            if partitions:
                return set(partitions)
            if time.monotonic() > deadline:
                raise CorrectionsTopicMissing(f"topic {self.topic} does not exist at {self.bootstrap} (create it with "
                                       "`skewwatch topics create`, or start a worker)")
            await refresh_metadata(consumer)  # the topic is not subscribed: aiokafka would not fetch it yet
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        """Stop reading; iterators of :meth:`changes` end."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        for queue in self._queues:
            queue.put_nowait(None)

    async def __aenter__(self) -> CorrectionsSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_caught_up(self, timeout: float | None = None) -> None:
        """Wait until every record that existed at :meth:`start` has been read."""
        waiter = asyncio.ensure_future(self._caught_up.wait())
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        finally:
            waiter.cancel()
        self._raise_failure()

    # ------------------------------------------------------------------ reading

    async def _run(self, consumer: Any, ends: dict[Any, int]) -> None:
        check_every = min(1.0, self.stale_after_s / 10)
        last_check = 0.0
        try:
            while True:
                batches = await consumer.getmany(timeout_ms=int(check_every * 1000), max_records=10_000)
                for messages in batches.values():
                    for message in messages:
                        self._ingest(message.key, message.value, message.timestamp / 1000.0)
                if not self._caught_up.is_set() and await self._reached(consumer, ends):
                    self._caught_up.set()
                    log.info("corrections: caught up on %s (%d models)", self.topic, len(self._models))
                now = time.monotonic()
                if now - last_check >= check_every:
                    last_check = now
                    self._check_stale()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced by wait_caught_up() and the iterators, never swallowed
            self._failure = exc
            log.error("corrections: reading %s failed: %s", self.topic, exc)
            self._caught_up.set()
            for queue in self._queues:
                queue.put_nowait(None)

    @staticmethod
    async def _reached(consumer: Any, ends: dict[Any, int]) -> bool:
        for tp, end in ends.items():
            if await consumer.position(tp) < end:
                return False
        return True

    def _ingest(self, key: bytes | None, value: bytes | None, received_at: float) -> None:
        self.stats.records += 1
        if value is None:  # a tombstone: the model is gone from the fleet
            self.stats.tombstones += 1
            model = key.decode("utf-8", "replace") if key else ""
            if self._models.pop(model, None) is not None:
                self._stale.discard(model)
                self._offer(Change("removed", model, None))
            return
        try:
            state = ModelState.from_value(value, received_at)
        except ValueError as exc:  # msgspec's DecodeError and ValidationError are ValueErrors
            self.stats.malformed += 1
            if self.stats.malformed <= 10 or self.stats.malformed % 1000 == 0:  # bounded: a bad producer
                log.warning("corrections: skipped a malformed record (%s; %d so far)", exc, self.stats.malformed)
            return
        model = state.correction.model
        previous = self._models.get(model)
        if previous is not None and state.correction.seq <= previous.correction.seq:
            self.stats.out_of_order += 1
            return
        self.stats.kept += 1
        self._models[model] = state
        self._offer(Change("update", model, state.correction.seq))
        if model in self._stale and not state.is_stale(self.clock(), self.stale_after_s):
            self._stale.discard(model)
            self._offer(Change("fresh", model, state.correction.seq))

    def _check_stale(self) -> None:
        now = self.clock()
        for model, state in self._models.items():
            stale = state.is_stale(now, self.stale_after_s)
            if stale and model not in self._stale:
                self._stale.add(model)
                log.warning("corrections: no record for %s in %.0f s: its correction expired (valid for %.0f s), "
                            "%s", model, now - state.received_at, state.valid_for(self.stale_after_s),
                            "keeping its last weights" if self.on_stale == "keep" else "routing equally")
                self._offer(Change("stale", model, state.correction.seq))

    def _offer(self, change: Change) -> None:
        for queue in self._queues:
            queue.put_nowait(change)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise CorrectionsError(f"reading {self.topic} failed: {self._failure}") from self._failure

    # ------------------------------------------------------------------ the current state

    def models(self) -> list[str]:
        """The models with a correction, sorted."""
        return sorted(self._models)

    def correction(self, model: str) -> RoutingCorrection | None:
        """The latest correction kept for ``model``, as published."""
        state = self._models.get(model)
        return None if state is None else state.correction

    def is_stale(self, model: str) -> bool:
        """True when ``model`` had no record for longer than ``stale_after`` heartbeats."""
        state = self._models.get(model)
        return state is not None and state.is_stale(self.clock(), self.stale_after_s)

    def mode(self, model: str) -> Mode | None:
        """``"normal"`` or ``"panic"`` as the latest correction says; None for an unknown model."""
        state = self._models.get(model)
        return None if state is None else state.mode

    def weights(self, model: str) -> dict[str, float]:
        """replica → weight to route ``model`` with (empty for an unknown model); see the fail-static rule."""
        state = self._models.get(model)
        if state is None:
            return {}
        return state.routing_weights(self.is_stale(model), self.on_stale)

    def actions(self, model: str) -> list[Action]:
        """The actions in force for ``model`` now (unexpired; none when stale with ``equal``)."""
        state = self._models.get(model)
        if state is None:
            return []
        now = self.clock()
        return state.live_actions(now, state.is_stale(now, self.stale_after_s), self.on_stale)

    def changes(self) -> ChangeStream:
        """Every change from this call on, in order, until :meth:`stop` (a reading failure raises).

        Call it before :meth:`start` to see the changes of the initial read too.
        """
        return ChangeStream(self)


class ChangeStream:
    """An async iterator of :class:`Change`; it sees every change offered after it was created."""

    def __init__(self, subscriber: CorrectionsSubscriber) -> None:
        self._subscriber = subscriber
        self._queue: asyncio.Queue[Change | None] = asyncio.Queue()
        subscriber._queues.append(self._queue)

    def __aiter__(self) -> AsyncIterator[Change]:
        return self

    async def __anext__(self) -> Change:
        change = await self._queue.get()
        if change is None:
            self.close()
            self._subscriber._raise_failure()
            raise StopAsyncIteration
        return change

    def close(self) -> None:
        """Stop receiving changes."""
        with contextlib.suppress(ValueError):
            self._subscriber._queues.remove(self._queue)

__all__ = ["Change", "ChangeStream", "CorrectionsError", "CorrectionsSubscriber", "CorrectionsTopicMissing",
           "ModelState", "OnStale"]

