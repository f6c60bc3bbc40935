"""Telemetry onto the real broker: BoundedProducer delivery and recovery, collect-gpu and scrape end to end.

Samples go on ``llm.gpu-telemetry`` keyed by replica; the collector survives broker outages: it
buffers a bounded number of samples and drops the oldest with a counter. Here the broker is real
(fixture ``kafka_settings`` from tests/conftest.py: topics created, names unique per test). The outage
is a port where nothing listens at first; a TCP relay to the real broker then opens on that very port,
and what was buffered (the newest ``max_buffered`` messages) arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.collect.publish import publish_sample
from skewwatch.collect.scrape_command import Scraper, run_bridge
from skewwatch.config import Settings
from skewwatch.schemas.telemetry import decode_telemetry
from skewwatch.schemas.telemetry_sample import TelemetrySample

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def decode(value: bytes) -> TelemetrySample:
    """Through the worker's own decoder: what the collector and the bridges publish passes the contract."""
    sample = decode_telemetry(value)
    assert isinstance(sample, TelemetrySample), sample
    return sample


async def consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0,
                  linger_s: float = 1.0) -> list[ConsumerRecord[Any, Any]]:
    """Read the topic from the beginning until ``expected`` records came, then ``linger_s`` more for extras."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    records: list[ConsumerRecord[Any, Any]] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(records) < expected and loop.time() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        for batch in (await consumer.getmany(timeout_ms=int(linger_s * 1000))).values():
            records.extend(batch)
    finally:
        await consumer.stop()
    return records


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def relay(listen_port: int, target: str) -> AsyncIterator[None]:
    """A TCP relay 127.0.0.1:listen_port -> target: the "broker" appearing on a port that was dead."""
    host, _, port = target.rpartition(":")
    tasks: set[asyncio.Task[None]] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        for task in (asyncio.create_task(pipe(client_reader, server_writer)),
                     asyncio.create_task(pipe(server_reader, client_writer))):
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    try:
        yield
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()


async def test_bounded_producer_delivers_keyed_messages(kafka_settings: Settings) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.gpu_telemetry
    async with BoundedProducer(bootstrap, topic, max_buffered=1000) as producer:
        for i in range(200):
            producer.offer(b"replica-%d" % (i % 5), b"value-%d" % i)
        assert await producer.flush(timeout=30.0)
        assert (producer.sent_total, producer.dropped_total, producer.buffered) == (200, 0, 0)
    records = await consume(bootstrap, topic, 200)
    assert sorted(r.value for r in records) == sorted(b"value-%d" % i for i in range(200))
    assert all(r.key == b"replica-%d" % (int(r.value.split(b"-")[1]) % 5) for r in records)


async def test_a_broker_that_comes_up_later_receives_the_newest_buffered_messages(kafka_settings: Settings) -> None:
    real, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.gpu_telemetry
    port = free_port()
    producer = BoundedProducer(f"127.0.0.1:{port}", topic, max_buffered=100, send_timeout_s=5.0,
                               backoff_initial_s=0.1, backoff_max_s=0.5)
    await producer.start()
    for i in range(300):  # the broker is down: only the newest 100 stay
        producer.offer(b"gpu-node-7-gpu0", b"%04d" % i)
    await asyncio.sleep(0.5)
    assert (producer.buffered, producer.dropped_total, producer.sent_total) == (100, 200, 0)
    assert not producer.connected
    async with relay(port, real):  # the broker comes (back) up on the address the producer knows
        assert await producer.flush(timeout=60.0), producer.stats()
    assert (producer.sent_total, producer.dropped_total) == (100, 200)
    await producer.close()
    records = await consume(real, topic, 100)
    # one key, one partition: the survivors arrive complete and in order
    assert [r.value for r in records] == [b"%04d" % i for i in range(200, 300)]


async def test_collect_gpu_simulate_publishes_one_sample_per_gpu_per_round(kafka_settings: Settings) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.gpu_telemetry
    command = [sys.executable, "-m", "skewwatch", "collect-gpu", "--simulate", "--simulate-gpus", "2",
               "--node", "sim-node", "--interval", "0.2", "--rounds", "3", "--bootstrap", bootstrap,
               "--topic", topic]
    proc = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120,
                                   cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    records = await consume(bootstrap, topic, 6)
    assert len(records) == 6
    samples = [decode(r.value) for r in records]
    assert sorted(r.key for r in records) == [b"sim-node-gpu0"] * 3 + [b"sim-node-gpu1"] * 3
    assert all(r.key == s.replica.encode() and s.source == "simulated" for r, s in zip(records, samples, strict=True))
    assert all(s.memory_total_bytes and s.memory_used_bytes and s.memory_used_bytes < s.memory_total_bytes
               for s in samples)


class _Exposition(BaseHTTPRequestHandler):
    body = (FIXTURES / "dcgm_3.3.txt").read_bytes()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        return


async def test_scrape_bridge_publishes_dcgm_samples_keyed_by_replica(kafka_settings: Settings) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.gpu_telemetry
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        scraper = Scraper(f"http://127.0.0.1:{httpd.server_address[1]}/metrics", "dcgm")
        async with BoundedProducer(bootstrap, topic) as producer:
            rounds = await run_bridge(scraper, lambda s: publish_sample(producer, s), interval_s=0.1, max_rounds=1)
            assert rounds == 1 and await producer.flush(timeout=30.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    records = await consume(bootstrap, topic, 2)
    by_key = {r.key: decode(r.value) for r in records}
    assert set(by_key) == {b"llama-70b-0", b"llama-70b-1"} and len(records) == 2
    broken = by_key[b"llama-70b-1"]
    assert (broken.source, broken.xid_last, broken.xid_count_5m, broken.gpu_index) == ("dcgm", 79, 1, 1)
    assert by_key[b"llama-70b-0"].xid_last is None


@pytest.fixture(autouse=True)
def _quiet_aiokafka(caplog: pytest.LogCaptureFixture) -> None:
    # connection-refused errors while the "broker" is down are expected here
    caplog.set_level("CRITICAL", logger="aiokafka")
