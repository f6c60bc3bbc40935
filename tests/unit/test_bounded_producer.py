"""BoundedProducer with the broker unreachable: offer never blocks, memory stays bounded, drops are counted.

Two kinds of unreachable: a closed loopback port (connection refused at once) and a "black hole" that
accepts TCP connections but never answers (aiokafka would wait for its request timeout). The real-broker
side (delivery, and a broker that comes up later accepting what was buffered) is in
tests/integration/test_telemetry_publish.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator

import pytest

from skewwatch.client.bounded_producer import BoundedProducer


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there any more


@pytest.fixture
async def black_hole() -> AsyncIterator[str]:
    """host:port of a server that accepts connections and never says a word."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        # until the client gives up; a cancelled handler at teardown is expected, not an error
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await reader.read()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"127.0.0.1:{port}"
    for writer in held:
        writer.close()
    server.close()


async def offer_many(producer: BoundedProducer, n: int) -> float:
    """Offer n messages; return the slowest single offer() in seconds, checking the bound as it goes."""
    slowest = 0.0
    for i in range(n):
        started = time.perf_counter()
        producer.offer(b"replica-%d" % (i % 4), b"sample-%d" % i)
        slowest = max(slowest, time.perf_counter() - started)
        assert producer.buffered <= producer.max_buffered + producer.max_batch
        if i % 1000 == 0:
            await asyncio.sleep(0)  # let the sender task run and fail meanwhile
    return slowest


@pytest.mark.parametrize("unreachable", ["closed-port", "black-hole"])
async def test_offer_never_blocks_and_drops_the_oldest_when_the_broker_is_unreachable(
    unreachable: str, black_hole: str
) -> None:
    bootstrap = f"127.0.0.1:{closed_port()}" if unreachable == "closed-port" else black_hole
    producer = BoundedProducer(bootstrap, "llm.gpu-telemetry", max_buffered=500, max_batch=50, send_timeout_s=1.0,
                               backoff_initial_s=0.05, backoff_max_s=0.2)
    await producer.start()
    started = time.perf_counter()
    slowest = await offer_many(producer, 20_000)
    elapsed = time.perf_counter() - started
    assert slowest < 0.05, f"one offer() took {slowest:.3f} s"
    assert elapsed < 5.0
    assert producer.buffered == 500  # bounded: never more than max_buffered waiting
    assert producer.dropped_total == 20_000 - 500 and producer.sent_total == 0
    assert list(producer._queue)[0] == (b"replica-0", b"sample-19500")  # the newest kept, the oldest dropped
    deadline = time.monotonic() + 5.0
    while producer.last_error is None and time.monotonic() < deadline:  # a connection attempt fails
        await asyncio.sleep(0.05)
    assert not producer.connected and producer.last_error is not None
    started = time.perf_counter()
    assert await producer.flush(timeout=0.3) is False
    await producer.close(timeout=0.5)
    assert time.perf_counter() - started < 3.0  # close is bounded too, even against the black hole
    assert producer.buffered == 0 and producer.dropped_total == 20_000  # unsent at close counts as dropped


async def test_offer_from_another_thread() -> None:
    producer = BoundedProducer(f"127.0.0.1:{closed_port()}", "t", max_buffered=100, backoff_initial_s=0.05)
    await producer.start()

    def server_thread() -> None:
        for i in range(1000):
            producer.offer(None, b"%d" % i)

    thread = threading.Thread(target=server_thread)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert producer.buffered == 100 and producer.dropped_total == 900
    await producer.close(timeout=0.2)


async def test_offer_before_start_buffers_and_validation() -> None:
    producer = BoundedProducer("127.0.0.1:9", "t", max_buffered=3)
    for i in range(5):
        producer.offer(b"k", b"%d" % i)
    assert [v for _, v in producer._queue] == [b"2", b"3", b"4"]
    assert await producer.flush(timeout=0.1) is False  # never started: nothing can be sent
    await producer.close(timeout=0.1)
    assert producer.stats()["dropped_total"] == 5
    with pytest.raises(ValueError):
        BoundedProducer("127.0.0.1:9", "t", max_buffered=0)
