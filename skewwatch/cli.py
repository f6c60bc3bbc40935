"""The ``skewwatch`` command line (click). Each sub-command lives beside the code it drives.

Exit codes: 0 done; 1 a run-time failure (no broker answers, a topic cannot be created, ...);
2 a usage error or invalid settings (:data:`EXIT_CONFIG`). Every command loads its settings
(:func:`command_settings`) before it starts anything, so invalid settings stop it with one line
on stderr naming the key and where its value came from, and no traceback.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from skewwatch.config_section import ConfigError

if TYPE_CHECKING:
    from skewwatch.config import Settings

EXIT_CONFIG = 2  # invalid settings, like click's usage errors


class SettingsError(click.ClickException):
    """Invalid settings: ``Error: <key> = <value> (from <file or variable>): <problem>``, exit code 2."""

    exit_code = EXIT_CONFIG


def command_settings(path: str | Path | None = None) -> Settings:
    """The settings of a command (``--config`` file, else ``SKEWWATCH_CONFIG``, then the environment),
    or :class:`SettingsError` before the command starts anything."""
    from skewwatch.config import load_settings

    try:
        return load_settings(path)
    except ConfigError as exc:
        raise SettingsError(str(exc)) from None

# name -> "module:attribute" of a click command; imported lazily so `skewwatch broker`
# does not pay for importing Faust and numpy.
COMMANDS: dict[str, str] = {
    "broker": "skewwatch.broker.command:broker_command",
    "topics": "skewwatch.topics:topics_command",
    "worker": "skewwatch.agents.app:worker_command",
    "generate": "skewwatch.generate:generate_command",
    "simulate": "skewwatch.sim.cli:simulate_command",
    "demo": "skewwatch.demo:demo_command",
    "otlp-receiver": "skewwatch.otlp.receiver:otlp_receiver_command",
    "collect-gpu": "skewwatch.telemetry.collector:collect_gpu_command",
    "scrape": "skewwatch.telemetry.bridges:scrape_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:  # a command that read settings without command_settings
            raise SettingsError(str(exc)) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skewwatch")
def main() -> None:
    """Watch an LLM inference fleet through Kafka and tell its router what to do."""
