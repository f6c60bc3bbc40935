"""What the commands that read skewwatch's outputs share: their settings and the Kafka to read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from skewwatch.config import Settings
from skewwatch.errors import ConfigProblem


def reader_settings(config_path: Path | None, bootstrap: str | None) -> tuple[Settings, str, dict[str, Any]]:
    """The settings (``--config`` / ``SKEWWATCH_CONFIG`` / environment), the bootstrap servers and every
    Kafka client's connection options, after one connection to Kafka as the clients will make it; or
    the one-line error of :mod:`skewwatch.errors`, as ``topics create`` reports it: no or a malformed
    bootstrap address (exit code 2), no Kafka answering (3), TLS or the login refused (4)."""
    from skewwatch.cli import command_settings
    from skewwatch.kafka_client import check_kafka, client_kwargs, require_bootstrap

    settings = command_settings(config_path)
    bootstrap = require_bootstrap(bootstrap, settings, "to read from")
    check_kafka(bootstrap, settings)
    return settings, bootstrap, client_kwargs(settings.kafka, bootstrap=bootstrap)


def topic_missing(topic: str, bootstrap: str) -> ConfigProblem:
    """A topic the command reads does not exist: a ``[topics]`` name that is wrong, or nothing created it."""
    return ConfigProblem(f"topic {topic} does not exist at {bootstrap}: start a worker or run `skewwatch topics "
                         "create` (or check the [topics] names in the settings)")


async def topic_partitions(bootstrap: str, topic: str, timeout: float = 15.0,
                           client_kwargs: dict[str, Any] | None = None) -> int:
    """The partition count of ``topic``, or one line: no Kafka answers (exit code 3), or no such topic (2)."""
    from aiokafka import AIOKafkaConsumer

    from skewwatch.kafka_client import client_kwargs as connection
    from skewwatch.kafka_client import kafka_failure, refresh_metadata

    consumer = AIOKafkaConsumer(**{**connection(bootstrap=bootstrap), **(client_kwargs or {})}, group_id=None)
    try:
        async with asyncio.timeout(timeout):
            await consumer.start()
            await refresh_metadata(consumer)  # the metadata of a topic the consumer is not assigned
    except Exception as exc:
        raise kafka_failure(exc, bootstrap, f"to describe {topic}") from None
    finally:
        await consumer.stop()
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise topic_missing(topic, bootstrap)
    return len(partitions)
