"""A Kafka producer that never blocks its caller: a bounded buffer in front of aiokafka.

A telemetry collector must survive broker outages: it buffers a bounded number of samples,
drops the oldest with a counter, and never blocks its NVML reads. The same holds for an
inference server that publishes request events: a down broker must cost it a counter, not a
stall and not unbounded memory.

How it works:

* :meth:`BoundedProducer.offer` is synchronous and O(1). It appends ``(key, value)`` to a
  ``collections.deque``; when ``max_buffered`` items are already waiting it drops the
  OLDEST one and counts it in ``dropped_total`` (fresh telemetry is worth more than old).
  It may be called from the event loop's thread or from any other thread.
* One background task takes up to ``max_batch`` items at a time, hands them to aiokafka
  (which batches, retries retriable errors and reconnects by itself) and waits for the
  acknowledgements. A batch that fails (broker down, ``send_timeout_s`` elapsed) goes back
  to the FRONT of the buffer, trimmed to ``max_buffered`` (the oldest go first, counted),
  and the task backs off exponentially before trying again. When the broker cannot even be
  bootstrapped the task keeps retrying ``start()`` with the same back-off.
* Memory is bounded by ``max_buffered + max_batch`` messages: the waiting buffer plus the
  one batch in flight.
* Delivery is at least once: a batch whose acknowledgement was lost may be sent again.

>>> import asyncio
>>> async def demo() -> tuple[int, int, int]:
...     producer = BoundedProducer("127.0.0.1:9", "t", max_buffered=2)   # never started
...     for i in range(5):
...         producer.offer(b"k", b"%d" % i)
...     return producer.buffered, producer.dropped_total, producer.sent_total
>>> asyncio.run(demo())
(2, 3, 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer

from skewwatch.kafka_client import client_kwargs

log = logging.getLogger(__name__)

Message = tuple[bytes | None, bytes]  # (key, value)


class BoundedProducer:
    """Publish ``(key, value)`` pairs to one topic without ever blocking the caller.

    Counters (plain attributes / properties, read them any time):
    ``sent_total`` acknowledged by the broker, ``dropped_total`` discarded because the
    buffer was full (or still unsent at :meth:`close`), ``buffered`` waiting or in flight.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        max_buffered: int = 10_000,
        max_batch: int = 500,
        send_timeout_s: float = 10.0,
        client_id: str = "skewwatch",
        linger_ms: int = 5,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 5.0,
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_buffered < 1 or max_batch < 1:
            raise ValueError("max_buffered and max_batch must be >= 1")
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_buffered = max_buffered
        self.max_batch = max_batch
        self.send_timeout_s = send_timeout_s
        self._client_id = client_id
        self._linger_ms = linger_ms
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._producer_options = dict(producer_options or {})

        self.sent_total = 0
        self.dropped_total = 0
        self.send_failures_total = 0  # batches that failed and went back to the buffer
        self.last_error: str | None = None

        # A lock, not just the deque's atomic append: offer() checks the length and drops in
        # one step, and may run on another thread than the sender's requeue.
        self._lock = threading.Lock()
        self._queue: deque[Message] = deque()
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wakeup: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set when nothing is queued or in flight
        self._task: asyncio.Task[None] | None = None
        self._producer: AIOKafkaProducer | None = None
        self._closing = False

    # ------------------------------------------------------------------ counters
    @property
    def buffered(self) -> int:
        """Messages not yet acknowledged: waiting in the buffer plus the batch in flight."""
        return len(self._queue) + self._in_flight

    @property
    def connected(self) -> bool:
        """True once aiokafka bootstrapped (it reconnects by itself after that)."""
        return self._producer is not None

    def stats(self) -> dict[str, Any]:
        return {
            "sent_total": self.sent_total,
            "dropped_total": self.dropped_total,
            "buffered": self.buffered,
            "send_failures_total": self.send_failures_total,
            "connected": self.connected,
            "last_error": self.last_error,
        }

    # ------------------------------------------------------------------ caller side
    def offer(self, key: bytes | None, value: bytes) -> None:
        """Queue one message; never blocks. When full, the oldest waiting message is dropped."""
        with self._lock:
            if len(self._queue) >= self.max_buffered:
                self._queue.popleft()
                self.dropped_total += 1
            self._queue.append((key, value))
        self._wake()

    def _wake(self) -> None:
        loop, wakeup = self._loop, self._wakeup
        if loop is None or wakeup is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            wakeup.set()
        else:
            loop.call_soon_threadsafe(wakeup.set)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the background sender. Never fails because the broker is down."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        if self._queue:
            self._wakeup.set()
        else:
            self._idle.set()
        self._task = asyncio.create_task(self._run(), name=f"bounded-producer:{self.topic}")

    async def __aenter__(self) -> BoundedProducer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def flush(self, timeout: float) -> bool:
        """Wait until everything offered so far is acknowledged; False if ``timeout`` passed first."""
        if self._idle is None:  # never started: nothing can be sent
            return self.buffered == 0
        try:
            await asyncio.wait_for(self._wait_idle(), timeout)
        except TimeoutError:
            return False
        return True

    async def _wait_idle(self) -> None:
        assert self._idle is not None
        while self.buffered:
            self._idle.clear()
            if not self.buffered:
                break
            await self._idle.wait()

    async def close(self, timeout: float = 5.0) -> None:
        """Flush for up to ``timeout`` seconds, then stop. What is still unsent counts as dropped."""
        if self._closing:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._task is not None:
            await self.flush(max(deadline - loop.time(), 0.0))
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._producer is not None:
            await self._stop_producer(self._producer, max(deadline - loop.time(), 0.5))
            self._producer = None
        with self._lock:
            unsent = len(self._queue) + self._in_flight
            self._queue.clear()
            self._in_flight = 0
            self.dropped_total += unsent
        if unsent:
            log.warning("bounded producer for %s closed with %d unsent messages", self.topic, unsent)

    # ------------------------------------------------------------------ sender task
    async def _run(self) -> None:
        assert self._wakeup is not None and self._idle is not None
        backoff = self._backoff_initial_s
        while not self._closing:
            if self._producer is None:
                self._producer = await self._try_start_producer()
                if self._producer is None:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._backoff_max_s)
                    continue
            batch = self._take_batch()
            if not batch:
                self._idle.set()
                self._wakeup.clear()
                if not self._queue:
                    await self._wakeup.wait()
                continue
            ok = await self._send_batch(self._producer, batch)
            if ok:
                if self.last_error is not None:  # the recovery, logged once
                    log.info("bounded producer: delivering to %s again (buffered %d, dropped %d)", self.topic,
                             self.buffered, self.dropped_total)
                    self.last_error = None
                backoff = self._backoff_initial_s
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)

    async def _try_start_producer(self) -> AIOKafkaProducer | None:
        options: dict[str, Any] = {
            **client_kwargs(bootstrap=self.bootstrap),
            "client_id": self._client_id,
            "linger_ms": self._linger_ms,
            # aiokafka expires an unacknowledged batch after request_timeout_ms: that is our send timeout.
            "request_timeout_ms": int(self.send_timeout_s * 1000),
        }
        options.update(self._producer_options)
        producer = AIOKafkaProducer(**options)
        try:
            await asyncio.wait_for(producer.start(), self.send_timeout_s)
        except Exception as exc:  # broker down, DNS, timeout: all mean "try again later"
            self._note_error(f"cannot connect to {self.bootstrap}: {exc!r}")
            await self._stop_producer(producer, 1.0)
            return None
        if self.last_error is not None:
            log.info("bounded producer connected to %s", self.bootstrap)
        self.last_error = None
        return producer

    async def _stop_producer(self, producer: AIOKafkaProducer, timeout: float) -> None:
        # stop() flushes aiokafka's own buffer; with the broker down that waits for the
        # request timeout, so it is bounded here.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), timeout)

    def _take_batch(self) -> list[Message]:
        with self._lock:
            n = min(len(self._queue), self.max_batch)
            batch = [self._queue.popleft() for _ in range(n)]
            self._in_flight = n
        return batch

    async def _send_batch(self, producer: AIOKafkaProducer, batch: list[Message]) -> bool:
        """Send one batch and wait for its acknowledgements; requeue what was not acknowledged."""
        futures: list[asyncio.Future[Any]] = []
        error: BaseException | None = None
        try:
            for key, value in batch:
                # send() itself only waits for topic metadata and a free batch slot; bound it.
                send = producer.send(self.topic, value=value, key=key)
                futures.append(await asyncio.wait_for(send, self.send_timeout_s))
        except Exception as exc:
            error = exc
        acknowledged: list[bool] = []
        if futures:
            # aiokafka fails each future after request_timeout_ms; the extra second covers scheduling.
            done, _pending = await asyncio.wait(futures, timeout=self.send_timeout_s + 1.0)
            for fut in futures:
                ok = fut in done and not fut.cancelled() and fut.exception() is None
                acknowledged.append(ok)
                if not ok and error is None:
                    error = fut.exception() if fut in done and not fut.cancelled() else TimeoutError()
        failed = [msg for msg, ok in zip(batch, acknowledged, strict=False) if not ok]
        failed += batch[len(acknowledged):]  # never handed to aiokafka
        with self._lock:
            self.sent_total += len(batch) - len(failed)
            self._in_flight = 0
            if failed:
                self.send_failures_total += 1
                self._queue.extendleft(reversed(failed))
                while len(self._queue) > self.max_buffered:
                    self._queue.popleft()
                    self.dropped_total += 1
        if failed:
            self._note_error(f"send to {self.topic} failed: {error!r}")
            return False
        return True

    def _note_error(self, message: str) -> None:
        if message != self.last_error:
            log.warning("bounded producer: %s (buffered %d, dropped %d)", message, self.buffered,
                        self.dropped_total)
        self.last_error = message
