"""RequestEventProducer at the call site: the worker's validation, drop-oldest, bounded blocking.
(Delivery through a real broker, down and back up: tests/integration/test_request_producer.py.)"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from skewwatch.client import RequestEventProducer
from skewwatch.schemas.requests import check_request_event

GOOD = {"latency_ms": 120.0, "prompt_tokens": 10, "completion_tokens": 20, "batch_size": 4, "batch_capacity": 16}


def offline(**kwargs: object) -> RequestEventProducer:
    """A producer whose sender never runs: what record() does on its own."""
    return RequestEventProducer("127.0.0.1:9", replica="r1", model="m", start=False, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [
    ("latency_ms", -3.0),
    ("latency_ms", float("nan")),
    ("prompt_tokens", 12.5),
    ("completion_tokens", -1),
    ("batch_size", 40),  # > batch_capacity 16
    ("batch_capacity", 0),
    ("kv_cache_hit_rate", 1.5),
    ("status", "failed"),
    ("ts", 1.7e12),  # milliseconds, not seconds
    ("prompt_tokens", 20_000_000),  # > limits.max_tokens
])
def test_bad_fields_raise_with_the_workers_reason(field: str, value: object) -> None:
    producer = offline()
    event = {"request_id": "x", "ts": 1.7e9, "model": "m", "replica": "r1", "status": "ok", **GOOD, field: value}
    expected = check_request_event(event)
    assert expected is not None  # the worker would reject this event...
    with pytest.raises(ValueError) as raised:
        producer.record(**{**GOOD, "request_id": "x", "ts": 1.7e9, field: value})  # type: ignore[arg-type]
    assert str(raised.value) == expected.reason  # ...and the caller reads the same sentence
    assert producer.buffered == 0


def test_optional_fields_are_left_out_when_unknown_and_kept_when_given() -> None:
    producer = offline()
    producer.record(**GOOD)  # type: ignore[arg-type]
    producer.record(**GOOD, ttft_ms=30.0, queue_length=3, kv_cache_hit_rate=0.9, status="error",  # type: ignore[arg-type]
                    cuda_error="cudaErrorMemoryAllocation", request_id="req-7", ts=1.7e9)
    first, second = list(producer._events)
    assert "ttft_ms" not in first and "cuda_error" not in first and first["status"] == "ok"
    assert len(first["request_id"]) == 32 and abs(first["ts"] - time.time()) < 60  # generated
    assert (second["ttft_ms"], second["queue_length"], second["cuda_error"], second["request_id"]) == (
        30.0, 3, "cudaErrorMemoryAllocation", "req-7")
    assert (second["model"], second["replica"]) == ("m", "r1")


def test_a_gateway_without_the_batch_leaves_the_batch_fields_out() -> None:
    producer = offline()
    producer.record(latency_ms=120.0, prompt_tokens=10, completion_tokens=20)
    producer.record(latency_ms=120.0, prompt_tokens=10, completion_tokens=20, batch_capacity=2)
    first, second = list(producer._events)
    assert "batch_size" not in first and "batch_capacity" not in first and check_request_event(first) is None
    assert second["batch_capacity"] == 2 and "batch_size" not in second and check_request_event(second) is None


def test_full_buffer_drops_the_oldest_and_counts() -> None:
    producer = offline(max_buffer=100)
    for i in range(250):
        producer.record(**GOOD, request_id=f"r{i}")  # type: ignore[arg-type]
    assert producer.buffered == 100 and producer.dropped_total == 150
    assert [e["request_id"] for e in producer._events] == [f"r{i}" for i in range(150, 250)]
    producer.close()
    assert producer.dropped_total == 250  # unsent at close counts as dropped


def test_block_timeout_bounds_the_wait_and_then_drops() -> None:
    producer = offline(max_buffer=2, block_timeout_s=0.2)
    producer.record(**GOOD)  # type: ignore[arg-type]
    producer.record(**GOOD)  # type: ignore[arg-type]
    start = time.monotonic()
    producer.record(**GOOD)  # type: ignore[arg-type]
    waited = time.monotonic() - start
    assert 0.15 <= waited < 1.0 and producer.dropped_total == 1


async def test_record_never_blocks_an_event_loop_even_with_a_block_timeout() -> None:
    producer = offline(max_buffer=1, block_timeout_s=5.0)
    start = time.monotonic()
    for _ in range(100):
        producer.record(**GOOD)  # type: ignore[arg-type]
    assert time.monotonic() - start < 0.5  # called on the loop's thread: drop, do not wait
    assert producer.dropped_total == 99
    await producer.aclose(timeout_s=0.1)


def test_records_from_many_threads_are_all_accounted_for() -> None:
    producer = offline(max_buffer=500)

    def worker() -> None:
        for _ in range(1000):
            producer.record(**GOOD)  # type: ignore[arg-type]

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert producer.buffered == 500 and producer.dropped_total == 3500


def test_constructor_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RequestEventProducer("127.0.0.1:9", replica="", model="m", start=False)
    with pytest.raises(ValueError):
        RequestEventProducer("127.0.0.1:9", replica="r", model="m", max_buffer=0, start=False)


def test_context_manager_closes_the_sender_thread() -> None:
    with RequestEventProducer("127.0.0.1:9", replica="r1", model="m", send_timeout_s=0.5,
                              close_timeout_s=0.5) as producer:
        producer.record(**GOOD)  # type: ignore[arg-type]
        thread = producer._thread
        assert thread is not None and thread.is_alive()
    assert not thread.is_alive()
    assert producer.dropped_total == 1 and producer.sent_total == 0


def test_asyncio_callers_use_the_same_object() -> None:
    async def server_loop(producer: RequestEventProducer) -> None:
        for _ in range(10):
            producer.record(**GOOD)  # type: ignore[arg-type]
            await asyncio.sleep(0)

    producer = offline()
    asyncio.run(server_loop(producer))
    assert producer.buffered == 10
