"""``skewwatch config show`` and ``config check``: the effective settings, without starting anything.

``show`` prints every setting as ``section.key = value  # source`` (the TOML file, the environment
variable, ``profile <name>``, or ``default``): what a command started with the same file and
environment would use. ``check`` loads and checks them as every command does before it starts (types,
ranges, unknown keys, the ``[kafka]`` TLS/SASL files) and says ``ok`` or prints the one-line error
(exit code 2); with ``--kafka`` it also connects once, as the clients would (3 nothing answers, 4 TLS
or the login refused).

>>> flatten({"kafka": {"bootstrap": None, "partitions": 8}, "detectors": {"weights": {"floor": 0.1}}})
[(('kafka', 'bootstrap'), None), (('kafka', 'partitions'), 8), (('detectors', 'weights', 'floor'), 0.1)]
>>> source_of(("kafka", "partitions"), {("kafka",): "SKEWWATCH_KAFKA__PARTITIONS"})
'default'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import msgspec
import orjson

from skewwatch.config_section import ConfigError
from skewwatch.errors import ConfigProblem

Key = tuple[str, ...]


def flatten(values: Mapping[str, Any], path: Key = ()) -> list[tuple[Key, Any]]:
    """Every leaf of nested tables, in order; a table that is empty is a leaf (``{}``)."""
    out: list[tuple[Key, Any]] = []
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            out.extend(flatten(value, (*path, key)))
        else:
            out.append(((*path, key), value))
    return out


def source_of(key: Key, sources: Mapping[Key, str]) -> str:
    """Where ``key``'s value came from (the loader records every leaf it was given), else ``default``."""
    return sources.get(key, "default")


def _load(config_path: Path | None, profile: str | None) -> tuple[Any, dict[Key, str]]:
    from skewwatch.config import load_settings_and_sources
    from skewwatch.kafka_security import check_security

    env = dict(os.environ)
    if profile is not None:
        env["SKEWWATCH_DETECTORS__PROFILE"] = profile
    try:
        settings, sources = load_settings_and_sources(config_path, env)
        check_security(settings.kafka)
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from None
    if profile is not None:
        sources[("detectors", "profile")] = "--profile"
    return settings, sources


_CONFIG = click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
                       help="Settings TOML file (default: env SKEWWATCH_CONFIG).")
_PROFILE = click.option("--profile", help="Detector profile, as the worker's --profile.")


@click.group("config")
def config_command() -> None:
    """Show or check the effective settings without starting anything."""


@config_command.command("show")
@_CONFIG
@_PROFILE
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per setting: {"key", "value", "source"}.')
def show_command(config_path: Path | None, profile: str | None, as_json: bool) -> None:
    """Every setting's effective value and where it came from (file, variable, profile or default)."""
    settings, sources = _load(config_path, profile)
    for key, value in flatten(msgspec.to_builtins(settings)):
        source = source_of(key, sources)
        name = ".".join(key)
        if as_json:
            click.echo(orjson.dumps({"key": name, "value": value, "source": source}).decode())
        else:
            shown = "none" if value is None else orjson.dumps(value).decode()
            click.echo(f"{name} = {shown}  # {source}")


@config_command.command("check")
@_CONFIG
@_PROFILE
@click.option("--kafka", "with_kafka", is_flag=True,
              help="Also connect to kafka.bootstrap once, as the clients would (TLS, SASL).")
@click.option("--bootstrap", metavar="HOST:PORT", help="Kafka to check with --kafka (default: the settings').")
def check_command(config_path: Path | None, profile: str | None, with_kafka: bool, bootstrap: str | None) -> None:
    """Check the settings as every command does before it starts: `ok`, or one line and exit code 2."""
    settings, sources = _load(config_path, profile)
    where = str(config_path or os.environ.get("SKEWWATCH_CONFIG") or "no config file")
    if with_kafka:
        from skewwatch.kafka_client import check_kafka, quiet_client_logs, require_bootstrap

        quiet_client_logs()
        servers = require_bootstrap(bootstrap, settings, "to check")
        check_kafka(servers, settings)
        where += f"; Kafka at {servers} answers"
    changed = sum(1 for key, _ in flatten(msgspec.to_builtins(settings)) if source_of(key, sources) != "default")
    click.echo(f"ok: {where}; {changed} settings not at their defaults")


__all__ = ["check_command", "config_command", "flatten", "show_command", "source_of"]
