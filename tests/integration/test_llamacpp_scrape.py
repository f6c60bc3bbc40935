"""llama.cpp in the scrape bridge: the real ``llama-server`` (built by scripts/engines.sh) on loopback.

It serves SmolLM2-135M on two slots (``-np 2``); three chat completions at once hold both slots and
leave the third deferred. The bridge (the scrape command's Scraper and run_bridge, publishing through
BoundedProducer onto the real broker) must see that as ``running_requests`` 2 and ``queue_length`` 1,
and count every generated token once in ``tpot_count``. ``skewwatch scrape --once`` reads the idle
server as a command does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skewwatch.client.bounded_producer import BoundedProducer
from skewwatch.collect.publish import publish_sample
from skewwatch.collect.scrape_command import Scraper, run_bridge
from skewwatch.config import Settings
from skewwatch.schemas.telemetry_sample import TelemetrySample
from tests.integration.test_telemetry_publish import consume, decode
from tests.integration.worker_proc import free_port
from tests.tools import smollm2_model, tool

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]
TOKENS = 48  # per request; ignore_eos makes every request generate exactly this many


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a llama-server with two slots and /metrics, once it answers /health."""
    port = free_port()
    log = tmp_path / "llama-server.log"
    command = [str(tool("llama-server")), "-m", str(smollm2_model()), "--host", "127.0.0.1", "--port", str(port),
               "-t", "1", "-np", "2", "-c", "2048", "--metrics"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _healthy(url):
            assert proc.poll() is None, f"llama-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"llama-server not ready in 30 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:  # not listening yet, or 503 while the model loads
        return False


def chat(url: str, content: str) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, "temperature": 0,
            "ignore_eos": True}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


async def test_llamacpp_busy_slots_and_deferred_request_reach_the_topic(llama_server: str,
                                                                        kafka_settings: Settings) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.gpu_telemetry
    scraper = Scraper(llama_server, "llamacpp", replica="llama-0")
    stop = asyncio.Event()
    published: list[TelemetrySample] = []
    async with BoundedProducer(bootstrap, topic) as producer:

        def publish(sample: TelemetrySample) -> None:
            published.append(sample)
            publish_sample(producer, sample)

        bridge = asyncio.create_task(run_bridge(scraper, publish, interval_s=0.05, stop=stop))
        while not published:  # the first scrape: the counters' starting point, before any request
            await asyncio.sleep(0.05)
        answers = await asyncio.gather(*(asyncio.to_thread(chat, llama_server, f"Tell story number {i}.")
                                         for i in range(3)))
        await asyncio.sleep(0.3)  # a few scrapes of the idle server after the last request released its slot
        stop.set()
        rounds = await bridge
        assert await producer.flush(timeout=30.0)
    assert [a["usage"]["completion_tokens"] for a in answers] == [TOKENS] * 3

    records = await consume(bootstrap, topic, rounds)
    samples = [decode(r.value) for r in records]
    assert len(samples) == rounds and {r.key for r in records} == {b"llama-0"}
    assert samples == published
    assert {s.source for s in samples} == {"llamacpp"}
    # both slots busy and the third request waiting for one, as the engine itself reported it
    assert any((s.running_requests, s.queue_length) == (2, 1) for s in samples), \
        [(s.running_requests, s.queue_length) for s in samples]
    assert (samples[-1].running_requests, samples[-1].queue_length) == (0, 0)
    # every generated token counted once across the intervals (none before the first scrape)
    assert samples[0].tpot_count is None
    assert sum(s.tpot_count or 0 for s in samples) == 3 * TOKENS
    assert all(s.tpot_mean_s > 0 for s in samples if s.tpot_count and s.tpot_mean_s is not None)
    assert all(s.batch_capacity is None and s.kv_cache_usage is None for s in samples)  # not on /metrics


def test_scrape_once_reads_an_idle_llama_server(llama_server: str) -> None:
    command = [sys.executable, "-m", "skewwatch", "scrape", "--target", llama_server, "--kind", "llamacpp",
               "--replica", "llama-0", "--once"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.strip().splitlines()
    wire = json.loads(line)
    assert (wire["replica"], wire["source"], wire["running_requests"], wire["queue_length"]) == \
        ("llama-0", "llamacpp", 0, 0)
    assert "tpot_count" not in wire  # one scrape is no interval
