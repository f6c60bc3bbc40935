"""The embedded Kafka broker, explicit topic creation and the `skewwatch broker` / `topics` commands."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from msgspec.structs import fields

from skewwatch.broker import EmbeddedBroker
from skewwatch.config import Settings
from skewwatch.errors import AddressInUse, BrokerFailed, ConfigProblem, KafkaUnreachable
from skewwatch.kafka_client import run_blocking
from skewwatch.ports import free_port
from skewwatch.topics import delete_topics, ensure_topics, topic_specs
from tests.conftest import TEST_PARTITIONS, topic_names, unique_settings
from tests.integration.commands import one_line_error

# --------------------------------------------------------------------------------------------------
# helpers


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def consume(bootstrap: str, topic: str, count: int, group_id: str, timeout: float = 20.0) -> list:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group_id, auto_offset_reset="earliest")
    await consumer.start()
    records: list = []
    try:
        async with asyncio.timeout(timeout):
            while len(records) < count:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
        await consumer.commit()
    finally:
        await consumer.stop()
    return records


async def topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
    finally:
        await admin.close()
    return {
        resource["resource_name"]: {
            entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
        }
        for response in responses
        for resource in response.to_object()["resources"]
    }


async def partition_counts(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {topic["topic"]: len(topic["partitions"]) for topic in await admin.describe_topics(names)}
    finally:
        await admin.close()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`skewwatch ARGS` in a child process, as a user runs it (exit code, stdout, stderr)."""
    # the user's own Kafka / skewwatch settings must not leak in (the jar cache location may)
    base = {
        key: value
        for key, value in os.environ.items()
        if key != "KAFKA_BOOTSTRAP" and (not key.startswith("SKEWWATCH_") or key == "SKEWWATCH_CACHE")
    }
    return subprocess.run(
        [sys.executable, "-c", "from skewwatch.cli import main; main()", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def listening_socket() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# the broker and the topics


async def test_broker_round_trips_records_through_aiokafka(kafka_settings: Settings) -> None:
    bootstrap = kafka_settings.kafka.bootstrap or ""
    topic = kafka_settings.topics.requests
    sent = [(f"replica-{i % 3}".encode(), f'{{"n": {i}}}'.encode()) for i in range(30)]
    await produce(bootstrap, topic, sent)
    received = await consume(bootstrap, topic, len(sent), kafka_settings.kafka.group_id)
    assert sorted((r.key, r.value) for r in received) == sorted(sent)
    # keyed records: one replica's records all land on one partition, in the order they were sent
    partitions_of = {key: {r.partition for r in received if r.key == key} for key, _ in sent}
    assert all(len(parts) == 1 for parts in partitions_of.values())
    for key in partitions_of:
        assert [r.value for r in received if r.key == key] == [v for k, v in sent if k == key]


def test_ensure_topics_creates_every_topic_with_its_configs(kafka_bootstrap: str) -> None:
    settings = unique_settings(kafka_bootstrap, partitions=3)
    names = topic_names(settings)
    try:
        created = run_blocking(ensure_topics(kafka_bootstrap, settings))
        assert sorted(created) == sorted(names)
        assert run_blocking(partition_counts(kafka_bootstrap, names)) == dict.fromkeys(names, 3)
        configs = run_blocking(topic_configs(kafka_bootstrap, names))
        topics = settings.topics
        assert configs[topics.routing_corrections]["cleanup.policy"] == "compact"
        assert configs[topics.checkpoints]["cleanup.policy"] == "compact"
        assert configs[topics.checkpoints]["max.message.bytes"] == str(16 * 1024 * 1024)
        for plain in (
            topics.requests,
            topics.features,
            topics.alerts,
            topics.dead_letter,
            topics.replica_steps,
        ):
            assert configs[plain]["cleanup.policy"] == "delete"
        # an oversized request must reach the worker (which dead-letters it), not bounce off the broker
        assert int(configs[topics.requests]["max.message.bytes"]) > settings.limits.max_message_bytes
        assert run_blocking(ensure_topics(kafka_bootstrap, settings)) == []  # idempotent
    finally:
        run_blocking(delete_topics(kafka_bootstrap, names))


async def test_concurrent_ensure_topics_create_each_topic_once(kafka_bootstrap: str) -> None:
    settings = unique_settings(kafka_bootstrap, partitions=1)
    try:
        first, second = await asyncio.gather(
            ensure_topics(kafka_bootstrap, settings), ensure_topics(kafka_bootstrap, settings)
        )
        # a topic the other call created first counts as existing, not as an error
        assert sorted(first + second) == sorted(topic_names(settings))
    finally:
        await delete_topics(kafka_bootstrap, topic_names(settings))


def test_topic_specs_cover_every_configured_topic() -> None:
    settings = Settings()
    settings.kafka.partitions = 5
    specs = topic_specs(settings)
    assert sorted(spec.name for spec in specs) == sorted(topic_names(settings))
    assert {spec.partitions for spec in specs} == {5}


def test_restarted_broker_keeps_its_data(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "kafka", port=0)
    settings = unique_settings("", partitions=1)
    topic = settings.topics.features
    try:
        broker.start()
        bootstrap = broker.bootstrap
        run_blocking(ensure_topics(bootstrap, settings))
        run_blocking(produce(bootstrap, topic, [(b"m/r0", b"kept across restarts")]))
        meta = (broker.kafka_data_dir / "meta.properties").read_text()
        broker.stop()
        assert not broker.running
        broker.start()
        assert broker.bootstrap == bootstrap  # a picked port is kept, so clients can reconnect
        assert (broker.kafka_data_dir / "meta.properties").read_text() == meta  # not re-formatted
        assert run_blocking(ensure_topics(bootstrap, settings)) == []
        (record,) = run_blocking(consume(bootstrap, topic, 1, "restart-check"))
        assert (record.key, record.value) == (b"m/r0", b"kept across restarts")
        assert broker.log_path.is_file() and "Kafka Server started" in broker.log_path.read_text()
    finally:
        broker.stop()


# --------------------------------------------------------------------------------------------------
# the commands


def test_broker_command_without_java_is_one_clear_line(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    done = run_cli("broker", "--data-dir", str(tmp_path / "kafka"), env={"PATH": str(empty_bin)})
    one_line_error(done, BrokerFailed.exit_code, "needs Java 17+ on PATH", "found: no java",
                          "openjdk-17-jre-headless")
    assert not (tmp_path / "kafka" / "data").exists()


def test_broker_command_on_a_busy_port_is_one_clear_line(tmp_path: Path, listening_socket: int) -> None:
    done = run_cli("broker", "--port", str(listening_socket), "--data-dir", str(tmp_path / "kafka"))
    one_line_error(done, AddressInUse.exit_code, f"port {listening_socket}", "already in use", "--port")


def test_broker_command_with_bootstrap_starts_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    done = run_cli("broker", "--data-dir", str(tmp_path / "kafka"), env={"KAFKA_BOOTSTRAP": kafka_bootstrap})
    assert done.returncode == 0, done.stderr
    assert "starting no broker" in done.stdout and "answers" in done.stdout
    assert not (tmp_path / "kafka").exists()


def test_broker_command_with_unreachable_bootstrap_fails_in_one_line() -> None:
    dead = f"127.0.0.1:{free_port()}"
    done = run_cli("broker", "--bootstrap", dead)
    one_line_error(done, KafkaUnreachable.exit_code, f"no Kafka answers at {dead}")


def test_topics_create_command(kafka_bootstrap: str, tmp_path: Path) -> None:
    settings = unique_settings(kafka_bootstrap, partitions=TEST_PARTITIONS)
    config = tmp_path / "skewwatch.toml"
    config.write_text(
        "[kafka]\npartitions = 2\n[topics]\n"
        + "".join(f'{field.name} = "{getattr(settings.topics, field.name)}"\n' for field in fields(settings.topics))
    )
    try:
        first = run_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--config", str(config))
        assert first.returncode == 0, first.stderr
        assert first.stdout.count("created ") == len(topic_names(settings))
        assert f"{settings.topics.routing_corrections} partitions=2 cleanup.policy=compact" in first.stdout
        again = run_cli("topics", "create", "--config", str(config), env={"KAFKA_BOOTSTRAP": kafka_bootstrap})
        assert again.returncode == 0, again.stderr
        assert again.stdout.count("exists ") == len(topic_names(settings))
    finally:
        run_blocking(delete_topics(kafka_bootstrap, topic_names(settings)))


def test_topics_create_without_a_cluster_says_how_to_get_one() -> None:
    done = run_cli("topics", "create")
    one_line_error(done, ConfigProblem.exit_code, "skewwatch broker")
