"""RequestEventProducer against a real broker that is down, then reachable: the caller never blocks
longer than a bound, memory stays bounded, drops are counted, and what is recorded afterwards arrives.

"The broker comes back" is a loopback TCP forwarder started on the producer's bootstrap port in front
of the session broker: before it listens, connections are refused exactly as with a stopped broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer

from skewwatch.client import RequestEventProducer
from skewwatch.config import Settings
from skewwatch.ports import free_port

GOOD = {"latency_ms": 120.0, "prompt_tokens": 10, "completion_tokens": 20, "batch_size": 4, "batch_capacity": 16}
WORST_CALL_S = 0.5  # no record() call may take longer, even with GC pauses on 2 shared cores


class Forwarder:
    """A TCP forwarder 127.0.0.1:port -> target, started and stopped at will."""

    def __init__(self, port: int, target: str) -> None:
        self.port = port
        self.target_host, target_port = target.rsplit(":", 1)
        self.target_port = int(target_port)
        self.server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(self.target_host, self.target_port)
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)


async def consume_request_ids(bootstrap: str, topic: str, count: int, timeout: float = 30.0,
                              key: bytes = b"r1") -> list[str]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"producer-test-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest")
    await consumer.start()
    ids: list[str] = []
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(ids) < count:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        for record in records:
                            message = orjson.loads(record.value)
                            assert record.key == key and message["v"] == 1
                            ids.extend(e["request_id"] for e in message["events"])
            await asyncio.sleep(1.0)  # and nothing more than that
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    ids.extend(e["request_id"] for e in orjson.loads(record.value)["events"])
    finally:
        await consumer.stop()
    return ids


def record_timed(producer: RequestEventProducer, prefix: str, n: int) -> list[float]:
    """Record n events; the duration of each call, in seconds."""
    durations = []
    for i in range(n):
        start = time.perf_counter()
        producer.record(**GOOD, request_id=f"{prefix}-{i}")  # type: ignore[arg-type]
        durations.append(time.perf_counter() - start)
    return durations


def test_broker_down_caller_never_blocks_memory_bounded_drops_counted() -> None:
    closed_port = free_port()  # nothing listens there: connection refused, as with a stopped broker
    # send_timeout_s is long on purpose: a record() that waited on the network would take seconds
    producer = RequestEventProducer(f"127.0.0.1:{closed_port}", replica="r1", model="m", max_buffer=1_000,
                                    batch_size=100, linger_ms=20, send_timeout_s=5.0, close_timeout_s=0.5)
    try:
        durations = sorted(record_timed(producer, "down", 50_000))
        # microseconds typically; the max allows for GC pauses and a loaded shared machine, and is still
        # 10x below the send timeout a network wait would cost
        assert durations[len(durations) // 2] < 0.001 and durations[-1] < WORST_CALL_S, (
            f"median {durations[len(durations) // 2] * 1e6:.0f} us, max {durations[-1] * 1e3:.1f} ms")
        tracemalloc.start()
        baseline, _ = tracemalloc.get_traced_memory()
        record_timed(producer, "more", 20_000)
        current, _peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # 20k more events recorded, at most ~1,100 kept: memory does not grow with what is recorded
        assert current - baseline < 1024 * 1024
        assert producer.sent_total == 0
        assert producer.buffered <= producer.max_buffer + producer.batch_size
        assert producer.dropped_total + producer.buffered == 70_000
        assert producer.dropped_total >= 70_000 - producer.max_buffer - producer.batch_size
    finally:
        start = time.monotonic()
        producer.close()
        assert time.monotonic() - start < 5.0  # close is bounded too
    assert producer.dropped_total == 70_000 and producer.sent_total == 0


def test_opt_in_block_timeout_is_the_bound_on_waiting() -> None:
    producer = RequestEventProducer(f"127.0.0.1:{free_port()}", replica="r1", model="m", max_buffer=10,
                                    batch_size=5, block_timeout_s=0.05, send_timeout_s=5.0, close_timeout_s=0.2)
    try:
        record_timed(producer, "fill", 20)  # fills the buffer (and the one batch in flight)
        durations = record_timed(producer, "full", 10)
        assert all(0.04 <= d < 0.05 + 0.2 for d in durations), durations
        assert producer.dropped_total >= 10
    finally:
        producer.close()


async def test_events_recorded_after_the_broker_returns_arrive(kafka_settings: Settings) -> None:
    assert kafka_settings.kafka.bootstrap
    topic = kafka_settings.topics.requests
    port = free_port()
    forwarder = Forwarder(port, kafka_settings.kafka.bootstrap)
    producer = RequestEventProducer(f"127.0.0.1:{port}", replica="r1", model="m", topic=topic, max_buffer=300,
                                    batch_size=50, linger_ms=20, send_timeout_s=2.0)
    try:
        # 1. broker unreachable: record more than the buffer holds, from the event loop's thread
        assert max(record_timed(producer, "before", 1_000)) < WORST_CALL_S
        await asyncio.sleep(0.5)
        assert producer.sent_total == 0 and producer.dropped_total >= 1_000 - 300 - 50
        # 2. the broker becomes reachable
        await forwarder.start()
        async with asyncio.timeout(30):  # the sender retries with back-off (at most 5 s apart)
            while producer.sent_total == 0:
                await asyncio.sleep(0.1)
        # 3. recorded afterwards, at a server's pace (bursts of 50, a buffer-full is 300): all of them arrive
        for burst in range(10):
            for i in range(50):
                producer.record(**GOOD, request_id=f"after-{burst * 50 + i}")  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
        assert await producer.aflush(timeout_s=30)
    finally:
        await producer.aclose(timeout_s=5)
        await forwarder.stop()
    ids = await consume_request_ids(kafka_settings.kafka.bootstrap, topic, producer.sent_total)
    after = [i for i in ids if i.startswith("after-")]
    assert sorted(after) == sorted(f"after-{i}" for i in range(500))
    assert len(ids) == len(set(ids)) == producer.sent_total  # what the counter says arrived, arrived, once
    before = {int(i.split("-")[1]) for i in ids if i.startswith("before-")}
    # kept from the outage: the newest buffer-full (drop-oldest) plus at most the one batch in flight
    assert set(range(1_000 - 300, 1_000)) <= before and len(before) <= 300 + 50
    assert producer.dropped_total == 1_000 - len(before)


def test_the_docs_sample_runs(kafka_settings: Settings, capsys: Any) -> None:
    """Recipe 3 of docs/connect.md, executed as written (broker address and topic swapped for the test's)."""
    assert kafka_settings.kafka.bootstrap
    doc = (Path(__file__).parents[2] / "docs" / "connect.md").read_text()
    section = doc[doc.index("## 3. The producer helper"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    code = code.replace('"localhost:9092"', repr(kafka_settings.kafka.bootstrap))
    code = code.replace('"llm.requests"', repr(kafka_settings.topics.requests))
    exec(compile(code, "docs/connect.md", "exec"), {"__name__": "docs_sample"})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["latency_ms: must be ≥ 0, got -1", "1 0"]  # the reason, then sent_total dropped_total
    ids = asyncio.run(consume_request_ids(kafka_settings.kafka.bootstrap, kafka_settings.topics.requests, 1,
                                          key=b"vllm-0"))
    assert len(ids) == 1
