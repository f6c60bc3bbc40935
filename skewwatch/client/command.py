"""What the commands that read skewwatch's outputs share: their settings and the Kafka to read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from skewwatch.config import Settings


def reader_settings(config_path: Path | None, bootstrap: str | None) -> tuple[Settings, str, dict[str, Any]]:
    """The settings (``--config`` / ``SKEWWATCH_CONFIG`` / environment), the bootstrap servers and every
    Kafka client's connection options; or one :class:`click.ClickException` line naming what is wrong."""
    from skewwatch.cli import command_settings
    from skewwatch.kafka_client import client_kwargs

    settings = command_settings(config_path)
    bootstrap = bootstrap or settings.kafka.bootstrap
    if not bootstrap:
        raise click.ClickException("no Kafka to read: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
    return settings, bootstrap, client_kwargs(settings.kafka, bootstrap=bootstrap)


async def topic_partitions(bootstrap: str, topic: str, timeout: float = 15.0,
                           client_kwargs: dict[str, Any] | None = None) -> int:
    """The partition count of ``topic``, or one ClickException line: no Kafka answers, or no such topic."""
    from aiokafka import AIOKafkaConsumer

    from skewwatch.kafka_client import client_kwargs as connection
    from skewwatch.kafka_client import describe_exception

    consumer = AIOKafkaConsumer(**{**connection(bootstrap=bootstrap), **(client_kwargs or {})}, group_id=None)
    try:
        async with asyncio.timeout(timeout):
            await consumer.start()
            await consumer._client.force_metadata_update()  # aiokafka: metadata of an unsubscribed topic
    except Exception as exc:
        raise click.ClickException(f"no Kafka answers at {bootstrap}: {describe_exception(exc)}") from None
    finally:
        await consumer.stop()
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise click.ClickException(f"topic {topic} does not exist at {bootstrap}: start a worker, or run "
                                   "`skewwatch topics create`")
    return len(partitions)
