"""The producer helper: let an inference server publish request events with one call per request.

A small typed API, safe from synchronous and asyncio code, that never
blocks the caller's hot loop: a bounded in-memory buffer, batched ``{"events": [...]}`` messages
every ``batch_size`` events or ``linger_ms``, drop-oldest with a counter under back-pressure, flush
on close, and the worker's own validation (``check_request_event``) so a server learns about a bad
field at the call site, with the same reason text the dead-letter topic would show.

How it works: :meth:`RequestEventProducer.record` validates, then appends the event to a
``collections.deque`` under a lock (O(1), no I/O, no await). A daemon thread runs its own asyncio
loop with a :class:`~skewwatch.client.bounded_producer.BoundedProducer` (aiokafka, reconnects with
back-off). The thread takes up to ``batch_size`` events, encodes them as one message keyed by the
replica, and hands it over, one message at a time, so back-pressure stays in the event buffer
where it is counted per event. Memory is bounded by ``max_buffer + batch_size`` events (the
buffer plus the one message in flight).

>>> p = RequestEventProducer("127.0.0.1:9", replica="r1", model="m", max_buffer=2, start=False)
>>> for i in range(3):
...     p.record(latency_ms=10.0, prompt_tokens=5, completion_tokens=7, batch_size=4, batch_capacity=16)
>>> p.buffered, p.dropped_total
(2, 1)
>>> p.record(latency_ms=-1.0, prompt_tokens=5, completion_tokens=7, batch_size=4, batch_capacity=16)
Traceback (most recent call last):
ValueError: latency_ms: must be ≥ 0, got -1.0
>>> p.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from types import TracebackType
from typing import Any

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.config import KafkaSettings, LimitSettings
from skewwatch.kafka_security import client_options
from skewwatch.schemas.requests import check_request_event, encode_request_events

log = logging.getLogger(__name__)


class RequestEventProducer:
    """Publish one contract-v1 request event per finished request to ``llm.requests``.

    Counters: ``sent_total`` (events acknowledged by the broker), ``dropped_total`` (events
    discarded because the buffer was full, or still unsent at :meth:`close`), ``buffered``.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        replica: str,
        model: str,
        topic: str = "llm.requests",
        max_buffer: int = 10_000,
        batch_size: int = 100,
        linger_ms: int = 200,
        block_timeout_s: float = 0.0,
        send_timeout_s: float = 10.0,
        close_timeout_s: float = 10.0,
        limits: LimitSettings | None = None,
        kafka: KafkaSettings | None = None,
        start: bool = True,
    ) -> None:
        if not replica or not model:
            raise ValueError("replica and model must be non-empty strings")
        if max_buffer < 1 or batch_size < 1 or linger_ms < 0 or block_timeout_s < 0:
            raise ValueError("max_buffer and batch_size must be >= 1, linger_ms and block_timeout_s >= 0")
        self.bootstrap = bootstrap
        self.replica = replica
        self.model = model
        self.topic = topic
        self.max_buffer = max_buffer
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000.0
        self.block_timeout_s = block_timeout_s
        self.send_timeout_s = send_timeout_s
        self.close_timeout_s = close_timeout_s  # flush budget of close() / the context manager
        self._limits = limits or LimitSettings()
        # TLS / SASL as the [kafka] section says (skewwatch.kafka_security); checked here, at the call site
        self._client_options = client_options(kafka) if kafka is not None else {}
        self._key = replica.encode()

        self.sent_total = 0
        self.dropped_total = 0

        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # notified when the sender takes events
        self._drained = threading.Condition(self._lock)  # notified when buffer + in flight hit 0
        self._events: deque[dict[str, Any]] = deque()
        self._in_flight = 0  # events handed to the broker producer, not yet acknowledged
        self._closing = False
        self._flush_requested = False

        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._thread_main, name=f"skewwatch-producer:{replica}",
                                            daemon=True)
            self._thread.start()
            self._ready.wait(5.0)

    # ------------------------------------------------------------------ caller side
    @property
    def buffered(self) -> int:
        """Events not yet acknowledged: waiting plus in flight."""
        return len(self._events) + self._in_flight

    def record(
        self,
        *,
        latency_ms: float,
        prompt_tokens: int,
        completion_tokens: int,
        batch_size: int | None = None,
        batch_capacity: int | None = None,
        ttft_ms: float | None = None,
        queue_length: int | None = None,
        kv_cache_hit_rate: float | None = None,
        status: str = "ok",
        cuda_error: str | int | None = None,
        request_id: str | None = None,
        ts: float | None = None,
    ) -> None:
        """Queue one finished request. Raises ValueError (the worker's reason) on a bad field;
        otherwise never blocks longer than ``block_timeout_s`` (and never inside an event loop)."""
        event: dict[str, Any] = {
            "request_id": request_id if request_id is not None else uuid.uuid4().hex,
            "ts": time.time() if ts is None else ts,
            "model": self.model,
            "replica": self.replica,
            "latency_ms": latency_ms,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "status": status,
        }
        # Optional fields are left out when unknown: absent means "not reported", never zero. A server
        # that does not know its running batch (a gateway, an SDK hook) leaves the batch fields out and
        # the worker derives them from the replica's telemetry (contract v1.1).
        for name, value in (("batch_size", batch_size), ("batch_capacity", batch_capacity), ("ttft_ms", ttft_ms),
                            ("queue_length", queue_length), ("kv_cache_hit_rate", kv_cache_hit_rate),
                            ("cuda_error", cuda_error)):
            if value is not None:
                event[name] = value
        rejection = check_request_event(event, self._limits)
        if rejection is not None:
            raise ValueError(rejection.reason)

        wake = False
        with self._lock:
            if self._closing:
                self.dropped_total += 1
                return
            if len(self._events) >= self.max_buffer and self.block_timeout_s > 0 and not _in_event_loop():
                # Opt-in: wait a bounded time for the sender to make room before dropping.
                self._space.wait_for(lambda: len(self._events) < self.max_buffer or self._closing,
                                     timeout=self.block_timeout_s)
            if len(self._events) >= self.max_buffer:
                self._events.popleft()  # drop-oldest: fresh events are worth more than old ones
                self.dropped_total += 1
            self._events.append(event)
            # Wake the sender on the first event (starts the linger timer) and on a full batch.
            wake = len(self._events) in (1, self.batch_size)
        if wake:
            self._wake()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Send everything recorded so far; True when all of it was acknowledged within ``timeout_s``."""
        if self._thread is None or not self._thread.is_alive():
            return self.buffered == 0
        with self._lock:
            self._flush_requested = True
        self._wake()
        with self._lock:
            return self._drained.wait_for(lambda: not self._events and not self._in_flight, timeout=timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush for up to ``timeout_s`` (default ``close_timeout_s``), then stop; events still unsent
        count as dropped."""
        timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
        if self._thread is not None and self._thread.is_alive():
            self.flush(timeout_s)
        with self._lock:
            self._closing = True
            self._space.notify_all()
        self._wake()
        if self._thread is not None:
            self._thread.join(self.send_timeout_s + 2.0)  # the sender notices within ~0.5 s, then stops
        with self._lock:
            unsent = len(self._events) + self._in_flight
            self._events.clear()
            self._in_flight = 0
            self.dropped_total += unsent
            self._drained.notify_all()
        if unsent:
            log.warning("request event producer closed with %d unsent events", unsent)

    async def aflush(self, timeout_s: float = 10.0) -> bool:
        """:meth:`flush` for asyncio code (waits in a worker thread, not on the event loop)."""
        return await asyncio.to_thread(self.flush, timeout_s)

    async def aclose(self, timeout_s: float | None = None) -> None:
        """:meth:`close` for asyncio code."""
        await asyncio.to_thread(self.close, timeout_s)

    def __enter__(self) -> RequestEventProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _wake(self) -> None:
        loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(wakeup.set)

    # ------------------------------------------------------------------ sender thread
    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run())
        except Exception:  # the sender must never die silently: say why, then count losses at close
            log.exception("request event producer thread failed")
        finally:
            loop.close()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._ready.set()
        # One message at a time in the broker producer: back-pressure stays in our event buffer.
        broker = BoundedProducer(self.bootstrap, self.topic, max_buffered=1, max_batch=1,
                                 send_timeout_s=self.send_timeout_s,
                                 client_id=f"skewwatch-producer-{self.replica}",
                                 producer_options=self._client_options)
        await broker.start()
        try:
            while True:
                with self._lock:
                    closing, pending = self._closing, len(self._events)
                    flush_now = self._flush_requested or pending >= self.batch_size
                if closing:
                    break
                if not flush_now:
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), self.linger_s if pending else None)
                    with self._lock:
                        if self._closing:
                            break
                batch = self._take_batch()
                if batch:
                    await self._send(broker, batch)
        finally:
            # close() already spent the flush budget waiting: what is left here counts as dropped.
            await broker.close(timeout=0.1)

    def _take_batch(self) -> list[dict[str, Any]]:
        with self._lock:
            n = min(len(self._events), self.batch_size)
            batch = [self._events.popleft() for _ in range(n)]
            self._in_flight = n
            if not self._events:
                self._flush_requested = False
            if n:
                self._space.notify_all()
            else:
                self._drained.notify_all()
        return batch

    async def _send(self, broker: BoundedProducer, batch: list[dict[str, Any]]) -> None:
        broker.offer(self._key, encode_request_events(batch))
        # BoundedProducer retries with back-off until the broker acknowledges; we wait in slices so
        # close() is noticed. Meanwhile record() keeps filling (and trimming) the event buffer.
        while not await broker.flush(timeout=min(self.send_timeout_s, 0.5)):
            with self._lock:
                if self._closing:
                    return  # close() counts the in-flight events as dropped
        with self._lock:
            self.sent_total += len(batch)
            self._in_flight = 0
            if not self._events:
                self._drained.notify_all()


def _in_event_loop() -> bool:
    """True when called from a thread that is running an asyncio loop (blocking would stall it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
