"""What the commands that read skewwatch's outputs share: their settings and the Kafka to read."""

from __future__ import annotations

from pathlib import Path

import click

from skewwatch.config import Settings


def reader_settings(config_path: Path | None, bootstrap: str | None) -> tuple[Settings, str]:
    """The settings (``--config`` / ``SKEWWATCH_CONFIG`` / environment) and the bootstrap servers, or one
    :class:`click.ClickException` line naming what is wrong."""
    from skewwatch.config import ConfigError, load_settings

    try:
        settings = load_settings(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    bootstrap = bootstrap or settings.kafka.bootstrap
    if not bootstrap:
        raise click.ClickException("no Kafka to read: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
    return settings, bootstrap
