"""Live traffic for the scale-out and failure tests: the generator's fleet, produced in event time on a
background thread, with a ledger of every event the broker acknowledged.

The statistical generator (:mod:`skewwatch.sim.generator`) draws each replica's requests and telemetry
in 5 s chunks; :class:`LiveTraffic` sends a chunk when the wall clock reaches its end (``speed`` x faster
than real time), keyed by replica, several events of a replica per message, and once every message of
the chunk is acknowledged adds its events to the :class:`Ledger`: the ground truth a window count is
compared with. :meth:`LiveTraffic.burst` sends a stretch of event time at once instead, at a multiple
of the rate (a backlog arriving all together), and :meth:`LiveTraffic.pause` holds the traffic back.

Events are produced in event-time order per replica (a chunk holds only requests finished before its
end), so none is late when the worker reads it: a window count must equal the ledger's exactly.

>>> ledger = Ledger()
>>> ledger.add(["m/a", "m/a", "m/b"], [1.0, 7.0, 9.5])
>>> ledger.count("m/a", 0.0, 10.0), ledger.count("m", 5.0, 10.0), ledger.total
(2, 2, 3)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer

from skewwatch.schemas.requests import encode_request_events
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.emit import ReplicaBatcher, merged_items
from skewwatch.sim.faults import Injection
from skewwatch.sim.generator import GeneratorConfig, TrafficChunk, TrafficGenerator, replica_ids

STEP_S = 5.0  # the generator's chunk: one pipeline step


class Ledger:
    """Event times of every acknowledged request event, per ``model/replica`` key (and per model)."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = defaultdict(list)
        self._sorted: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self.total = 0

    def add(self, keys: Iterable[str], ts: Iterable[float]) -> None:
        """Events acknowledged: one ``model/replica`` key and event time each."""
        by_key: dict[str, list[float]] = defaultdict(list)
        for key, t in zip(keys, ts, strict=True):
            by_key[key].append(t)
            by_key[key.partition("/")[0]].append(t)
        with self._lock:
            for key, values in by_key.items():
                self._parts[key].append(np.asarray(values, dtype=float))
                self._sorted.pop(key, None)
                if "/" in key:
                    self.total += len(values)

    def _times(self, key: str) -> np.ndarray:
        with self._lock:
            found = self._sorted.get(key)
            if found is None:
                parts = self._parts.get(key, [])
                found = self._sorted[key] = np.sort(np.concatenate(parts)) if parts else np.empty(0)
            return found

    def count(self, key: str, start: float, end: float) -> int:
        """Events of ``key`` (``model/replica`` or ``model``) with ``start <= ts < end``."""
        times = self._times(key)
        return int(np.searchsorted(times, end, "left") - np.searchsorted(times, start, "left"))

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._parts)

    def first(self, key: str) -> float | None:
        times = self._times(key)
        return float(times[0]) if len(times) else None


def _shifted(injections: Iterable[Injection], offset: float) -> tuple[Injection, ...]:
    """The injections of a run as seen by a run starting ``offset`` seconds later."""
    out = []
    for inj in injections:
        at, until = inj.at_s - offset, inj.at_s + inj.for_s - offset
        if until > 0:
            out.append(dataclasses.replace(inj, at_s=max(at, 0.0), for_s=until - max(at, 0.0)))
    return tuple(out)


def _merge(chunks: list[TrafficChunk], until: float) -> TrafficChunk:
    """One chunk of several generators' chunks over the same step, cut at ``until`` (event time)."""
    requests = RequestColumns.concat([c.requests for c in chunks])
    requests = requests.take(np.argsort(requests.ts, kind="stable"))
    requests = requests.take(requests.ts < until)
    telemetry = sorted((s for c in chunks for s in c.telemetry), key=lambda s: s.ts)
    return TrafficChunk(end_ts=chunks[0].end_ts, requests=requests, telemetry=telemetry)


@dataclasses.dataclass
class _Messages:
    """A chunk encoded: Kafka messages and the events they carry."""

    records: list[tuple[str, bytes, bytes]]  # (topic kind "requests"|"telemetry", key, value)
    keys: list[str]
    ts: list[float]
    end_ts: float


class LiveTraffic:
    """The generator's fleet, produced live (see the module docstring).

    ``speed``: event seconds per wall second. ``batch``: events of one replica per message at most.
    """

    def __init__(self, bootstrap: str, requests_topic: str, telemetry_topic: str | None,
                 config: GeneratorConfig, start_ts: float, *, speed: float = 1.0, batch: int = 50) -> None:
        self.bootstrap = bootstrap
        self.requests_topic = requests_topic
        self.telemetry_topic = telemetry_topic
        self.config = config
        self.start_ts = start_ts
        self.speed = speed
        self.batch = batch
        self.ledger = Ledger()
        self.telemetry_sent = 0
        self.messages_sent = 0
        self.error: BaseException | None = None
        self._event_time = start_ts  # end of the last chunk acknowledged
        self._generator = TrafficGenerator(config, start_ts, None)
        self._chunks = self._generator.chunks()
        self._bursts = 0
        self._requests: list[tuple[str, Any, threading.Event]] = []  # (what, argument, done)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread: threading.Thread | None = None
        self.models = {replica: model for model, replica in replica_ids(config)}

    # -- the caller's side
    @property
    def event_time(self) -> float:
        """Event time up to which everything is produced and acknowledged."""
        return self._event_time

    def start(self) -> LiveTraffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="live-traffic", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.raise_error()

    def raise_error(self) -> None:
        if self.error is not None:
            raise AssertionError(f"live traffic failed: {self.error!r}") from self.error

    def pause(self) -> None:
        """Hold the traffic back (event time stops; :meth:`resume` goes on from there)."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def burst(self, duration_s: float, factor: float, timeout: float = 300.0) -> tuple[int, float, float]:
        """Send the next ``duration_s`` of event time at once, at ``factor`` x the rate; returns
        (events, wall seconds encoding took, wall seconds sending and acknowledging took) once the
        broker has acknowledged all of it."""
        done = threading.Event()
        result: dict[str, Any] = {}
        with self._lock:
            self._requests.append(("burst", (duration_s, factor, result), done))
        if not done.wait(timeout):
            raise AssertionError(f"the burst was not sent within {timeout:.0f} s")
        self.raise_error()
        return result["events"], result["encode_s"], result["send_s"]

    def wait_event_time(self, ts: float, timeout: float) -> None:
        """Until everything up to event time ``ts`` is produced."""
        deadline = time.monotonic() + timeout
        while self._event_time < ts:
            self.raise_error()
            if time.monotonic() > deadline:
                raise AssertionError(f"traffic reached only {self._event_time - ts:+.0f} s of {ts}")
            time.sleep(0.2)

    # -- the producing thread
    async def _run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5,
                                    enable_idempotence=True, max_batch_size=1 << 20, max_request_size=8 << 20,
                                    request_timeout_ms=120_000)
        await producer.start()
        try:
            anchor = (time.monotonic(), self.start_ts)  # (wall, event time) that map onto each other
            while not self._stop.is_set():
                with self._lock:
                    request = self._requests.pop(0) if self._requests else None
                if request is not None:
                    _, (duration_s, factor, result), done = request
                    try:
                        result.update(await self._burst(producer, duration_s, factor))
                    finally:
                        done.set()
                    anchor = (time.monotonic(), self._event_time)
                    continue
                if self._paused.is_set():
                    await asyncio.sleep(0.1)
                    anchor = (time.monotonic(), self._event_time)
                    continue
                due = anchor[0] + (self._event_time + STEP_S - anchor[1]) / self.speed
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(min(wait, 0.1))
                    continue
                await self._send(producer, self._encode(next(self._chunks)))
        except BaseException as exc:  # noqa: BLE001 - reported to the test by raise_error()
            self.error = exc
        finally:
            await producer.stop()

    def _encode(self, chunk: TrafficChunk) -> _Messages:
        records: list[tuple[str, bytes, bytes]] = []
        batcher = ReplicaBatcher(self.batch, max_delay_s=1.0)
        keys: list[str] = []
        ts: list[float] = []

        def add_groups(groups: list[tuple[str, list[Any]]]) -> None:
            for replica, group in groups:
                records.append(("requests", replica.encode(), encode_request_events(group)))

        for item in merged_items(chunk):
            if isinstance(item, TelemetrySample):
                if self.telemetry_topic is not None:
                    records.append(("telemetry", item.replica.encode(), orjson.dumps(item.to_dict())))
                continue
            keys.append(f"{item['model']}/{item['replica']}")
            ts.append(float(item["ts"]))
            add_groups(batcher.add(item))
        add_groups(batcher.flush())
        return _Messages(records, keys, ts, chunk.end_ts)

    async def _send(self, producer: AIOKafkaProducer, messages: _Messages) -> None:
        futures = []
        for kind, key, value in messages.records:
            topic = self.requests_topic if kind == "requests" else self.telemetry_topic
            futures.append(await producer.send(topic, key=key, value=value))  # type: ignore[arg-type]
        await asyncio.gather(*futures)
        self.messages_sent += len(messages.records)
        self.telemetry_sent += sum(1 for kind, _, _ in messages.records if kind == "telemetry")
        self.ledger.add(messages.keys, messages.ts)
        self._event_time = messages.end_ts

    def _burst_chunks(self, duration_s: float, factor: float) -> Iterator[TrafficChunk]:
        """The next ``duration_s`` of event time at ``factor`` x the rate: the live generator's chunks
        plus a second generator's at ``factor - 1`` x (its telemetry left out: one sample per step)."""
        start = self._event_time
        self._bursts += 1
        extra = None
        if factor > 1:
            config = dataclasses.replace(self.config, rate=self.config.rate * (factor - 1), telemetry=False,
                                         seed=self.config.seed + 1000 * self._bursts,
                                         injections=_shifted(self.config.injections, start - self.start_ts))
            extra = TrafficGenerator(config, start, duration_s).chunks()
        for _ in range(math.ceil(duration_s / STEP_S)):
            chunks = [next(self._chunks)]
            if extra is not None:
                chunks.append(next(extra))
            yield _merge(chunks, until=chunks[0].end_ts)

    async def _burst(self, producer: AIOKafkaProducer, duration_s: float, factor: float) -> dict[str, Any]:
        started = time.monotonic()
        encoded = [self._encode(chunk) for chunk in self._burst_chunks(duration_s, factor)]
        sending = time.monotonic()
        events = 0
        for messages in encoded:
            await self._send(producer, messages)
            events += len(messages.keys)
        return {"events": events, "encode_s": sending - started, "send_s": time.monotonic() - sending}
