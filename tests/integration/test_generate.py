"""The generator on the real broker: what is produced comes back, single and batched, keyed by replica."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from click.testing import CliRunner

from skewwatch.config import Settings
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.emit import TopicMissingError, produce_events, produce_traffic
from skewwatch.sim.faults import read_labels
from skewwatch.sim.generate_command import generate_command
from skewwatch.sim.generator import GeneratorConfig, generate_chunks, generate_events

T0 = 1_700_000_000.0


async def consume(bootstrap: str, topic: str, count: int, timeout: float = 30.0,
                  events: int | None = None) -> list[tuple[str, Any]]:
    """(key, decoded value) of the first ``count`` messages of ``topic`` (all partitions), or
    of as many as hold ``events`` request events."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    out: list[tuple[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            if events is not None and len(events_of(out)) >= events:
                break
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                out.extend((r.key.decode(), orjson.loads(r.value)) for r in records)
    finally:
        await consumer.stop()
    return out


def events_of(messages: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key, value in messages:
        events = value.get("events", [value])
        assert all(e["replica"] == key for e in events), "every event of a message belongs to its key"
        out.extend(events)
    return out


@pytest.mark.parametrize("batch", [1, 10])
async def test_produced_events_come_back_unchanged(kafka_settings: Settings, batch: int) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap, kafka_settings.topics.requests
    assert bootstrap is not None
    events = list(generate_events(GeneratorConfig(replicas=3, seed=11), T0, 20.0))
    stats = await produce_events(bootstrap, topic, events, batch=batch)
    assert stats.events == len(events)
    if batch == 1:
        assert stats.messages == len(events)
    else:
        assert stats.messages < len(events) / 5  # really batched
    messages = await consume(bootstrap, topic, stats.messages)
    assert len(messages) == stats.messages
    if batch > 1:
        assert all("events" in v and 1 <= len(v["events"]) <= batch for _, v in messages)
    back = events_of(messages)
    key = lambda e: e["request_id"]  # noqa: E731
    assert sorted(back, key=key) == sorted(events, key=key)


async def test_traffic_with_telemetry_and_pacing(kafka_settings: Settings) -> None:
    bootstrap = kafka_settings.kafka.bootstrap
    assert bootstrap is not None
    config = GeneratorConfig(replicas=2, seed=12)
    began = time.monotonic()
    stats = await produce_traffic(bootstrap, generate_chunks(config, T0, 20.0),
                                  requests_topic=kafka_settings.topics.requests,
                                  telemetry_topic=kafka_settings.topics.gpu_telemetry, batch=5, speed=10.0)
    wall = time.monotonic() - began
    assert 1.5 < wall < 10.0  # 20 s of event time at 10x: about 2 s
    assert stats.telemetry == 2 * 4  # one sample per replica every 5 s
    samples = await consume(bootstrap, kafka_settings.topics.gpu_telemetry, stats.telemetry)
    assert len(samples) == stats.telemetry
    for key, value in samples:
        sample = TelemetrySample.from_dict(value)
        assert sample.replica == key and sample.source == "simulated"
    back = events_of(await consume(bootstrap, kafka_settings.topics.requests, stats.messages))
    assert len(back) == stats.events


async def test_missing_topic_is_a_clear_error(kafka_bootstrap: str) -> None:
    with pytest.raises(TopicMissingError, match="does not exist"):
        await produce_events(kafka_bootstrap, "llm.requests.no-such-topic", [], topic_wait_s=2.0)


@pytest.mark.parametrize("inject", [
    ["--inject", "gpu_fault", "--replica", "r1", "--at", "10", "--for", "10", "--param", "class=resource"],
    ["--inject", "gpu_fault --replica r1 --at 10 --for 10 --param class=resource"],  # as `demo --inject` takes it
], ids=["separate-options", "one-quoted-value"])
def test_generate_command_with_injection_and_labels(kafka_settings: Settings, tmp_path: Path,
                                                    inject: list[str]) -> None:
    labels = tmp_path / "labels.json"
    result = CliRunner().invoke(generate_command, [
        "--bootstrap", str(kafka_settings.kafka.bootstrap), "--topic", kafka_settings.topics.requests,
        "--telemetry-topic", kafka_settings.topics.gpu_telemetry, "--replicas", "3", "--duration", "30",
        "--speed", "max", "--batch", "20", "--seed", "3", "--start-ts", str(T0), *inject,
        "--labels", str(labels),
    ])
    assert result.exit_code == 0, result.output
    assert read_labels(labels) == [{"replica": "r1", "kind": "gpu_fault", "start": T0 + 10, "end": T0 + 20,
                                    "model": "llama-3-70b", "params": {"class": "resource"}}]
    expected = list(generate_events(GeneratorConfig(replicas=3, seed=3, injections=()), T0, 30.0))
    back = asyncio.run(consume(str(kafka_settings.kafka.bootstrap), kafka_settings.topics.requests,
                               10**9, timeout=20.0, events=len(expected)))
    events = events_of(back)
    assert len(events) == len(expected)
    errors = [e for e in events if e["status"] == "error"]
    assert errors and {e["replica"] for e in errors} == {"r1"}
    assert {e["cuda_error"] for e in errors} <= {"cudaErrorMemoryAllocation", "cudaErrorInvalidValue"}
    assert all(T0 + 10 <= e["ts"] - e["latency_ms"] / 1000 < T0 + 20 + 1e-3 for e in errors)


def test_simulate_command_produces_the_fleet_to_kafka(kafka_settings: Settings) -> None:
    from skewwatch.sim.simulate_command import simulate_command

    result = CliRunner().invoke(simulate_command, [
        "--bootstrap", str(kafka_settings.kafka.bootstrap), "--topic", kafka_settings.topics.requests,
        "--telemetry-topic", kafka_settings.topics.gpu_telemetry, "--replicas", "2", "--duration", "30",
        "--start-ts", str(T0), "--batch", "50", "--seed", "2",
    ])
    assert result.exit_code == 0, result.output
    summary = orjson.loads(result.stdout)
    back = asyncio.run(consume(str(kafka_settings.kafka.bootstrap), kafka_settings.topics.requests,
                               10**9, timeout=20.0, events=summary["arrivals"]))
    events = events_of(back)
    assert len(events) == summary["arrivals"] > 50
    assert len(back) < len(events)  # batched
    samples = asyncio.run(consume(str(kafka_settings.kafka.bootstrap), kafka_settings.topics.gpu_telemetry,
                                  2 * 6, timeout=20.0))
    assert len(samples) >= 2 * 6 and {k for k, _ in samples} == {"r0", "r1"}


def test_simulate_dynamic_closes_the_loop_through_the_real_worker(kafka_settings: Settings, tmp_path: Path) -> None:
    """The closed loop: lockstep on event time with the worker's routing corrections; the slow replica loses traffic."""
    import os
    import subprocess
    import sys

    from tests.integration.worker_proc import WorkerProcess, settings_env

    worker = WorkerProcess(kafka_settings, tmp_path / "worker.log",
                           extra_env={"SKEWWATCH_DETECTORS__CORRECTIONS__HEARTBEAT_S": "5"}).start()
    try:
        env = {**os.environ, **settings_env(kafka_settings)}
        env.pop("KAFKA_BOOTSTRAP", None)
        run = subprocess.run(
            [sys.executable, "-m", "skewwatch", "simulate", "--policy", "dynamic", "--weights", "kafka",
             "--replicas", "4", "--load", "0.6", "--duration", "180", "--start-ts", str(T0), "--seed", "9",
             "--inject", "slow_replica", "--replica", "r1", "--at", "30", "--for", "400", "--param", "factor=4",
             "--lockstep-timeout", "30"],
            env=env, capture_output=True, text=True, timeout=600)
    finally:
        worker.stop()
    assert run.returncode == 0, run.stderr[-3000:] + worker.log_tail()
    summary = orjson.loads(run.stdout)
    assert summary["lockstep_misses"] == 0, run.stderr[-2000:]
    assert summary["arrivals"] == summary["finished"] + summary["failed"]
    shares = {r: v["share"] for r, v in summary["results"]["replicas"].items()}
    assert shares["r1"] < 0.23 and min(shares[r] for r in ("r0", "r2", "r3")) > 0.25  # round robin: 0.25 each
