"""Shared fixtures: one real Kafka broker per test session, and per-test topic names on it.

Integration tests run against a real Apache Kafka, never a mock. ``KAFKA_BOOTSTRAP``
points the suite at an existing cluster; otherwise the session starts the embedded broker
(skewwatch.broker.EmbeddedBroker) on a free loopback port in a temporary directory, once.

The fixtures are sync and run their async setup with ``run_blocking`` (a fresh loop in a helper thread):
pytest-asyncio gives each async test its own loop, and a session-scoped fixture holding a loop of its
own would outlive them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import msgspec
import pytest

from skewwatch.broker import BrokerError, EmbeddedBroker
from skewwatch.config import Settings
from skewwatch.kafka_client import run_blocking
from skewwatch.topics import delete_topics, ensure_topics

TEST_PARTITIONS = 2  # enough to exercise partitioning, few enough to create quickly


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # every test that needs the broker carries the `kafka` marker: `pytest -m "not kafka"` runs the rest
    for item in items:
        if {"kafka_bootstrap", "embedded_broker"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def embedded_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker | None]:
    """The session's embedded broker; None when ``KAFKA_BOOTSTRAP`` points the suite at another cluster."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield None
        return
    broker = EmbeddedBroker(tmp_path_factory.mktemp("kafka"), port=0)
    try:
        broker.start(timeout=120)  # generous: a shared 2-core machine, and the first run fetches jars
    except BrokerError as exc:
        pytest.fail(f"cannot start the test Kafka broker: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(embedded_broker: EmbeddedBroker | None) -> str:
    """``host:port`` of a real Kafka: ``KAFKA_BOOTSTRAP`` if set, else an embedded broker for the session."""
    return os.environ.get("KAFKA_BOOTSTRAP") or (embedded_broker.bootstrap if embedded_broker else "")


def unique_settings(bootstrap: str, partitions: int = TEST_PARTITIONS) -> Settings:
    """Settings whose topic names and group id carry a fresh suffix, so tests never see each other's data."""
    suffix = uuid.uuid4().hex[:8]
    settings = Settings()
    settings.kafka.bootstrap = bootstrap
    settings.kafka.partitions = partitions
    settings.kafka.group_id = f"skewwatch-test-{suffix}"
    settings.topics = msgspec.structs.replace(
        settings.topics,
        **{
            topic.name: f"{getattr(settings.topics, topic.name)}.t{suffix}"
            for topic in msgspec.structs.fields(settings.topics)
            if getattr(settings.topics, topic.name)  # "" = not used (topics.otlp_spans): stays off
        },
    )
    return settings


def topic_names(settings: Settings) -> list[str]:
    return [getattr(settings.topics, topic.name) for topic in msgspec.structs.fields(settings.topics)
            if getattr(settings.topics, topic.name)]


@pytest.fixture
def kafka_settings(kafka_bootstrap: str) -> Iterator[Settings]:
    """Settings for one test: bootstrap set, unique topic names and group id, the topics already created."""
    settings = unique_settings(kafka_bootstrap)
    run_blocking(ensure_topics(kafka_bootstrap, settings))
    yield settings
    try:  # best effort: keep a shared (KAFKA_BOOTSTRAP) cluster clean; a failure here is not the test's
        run_blocking(delete_topics(kafka_bootstrap, topic_names(settings)))
    except Exception as exc:
        print(f"could not delete test topics: {exc}")
