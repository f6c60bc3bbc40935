"""The ``skewwatch`` command line (click). Each sub-command lives beside the code it drives.

Exit codes: :mod:`skewwatch.errors` (0 done; 2 a usage error or invalid settings, :data:`EXIT_CONFIG`;
3 Kafka (or HAProxy's runtime API) not answering as a one-shot command or a bridge starts; 4 Kafka
refused TLS or the login; 5 a port in use; 6 the broker's data directory locked; 7 nothing sent; 8
the embedded broker failed; 1 a bug). Every command loads its settings (:func:`command_settings`)
before it starts anything, so invalid settings stop it with one line on stderr naming the key and
where its value came from, and no traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from skewwatch.config_section import ConfigError
from skewwatch.errors import ConfigProblem, KafkaUnreachable

if TYPE_CHECKING:
    from skewwatch.config import Settings

EXIT_CONFIG = ConfigProblem.exit_code  # invalid settings, like click's usage errors
# Invalid settings: ``Error: <key> = <value> (from <file or variable>): <problem>``, exit code 2.
SettingsError = ConfigProblem


def command_settings(path: str | Path | None = None, profile: str | None = None) -> Settings:
    """The settings of a command (``--config`` file, else ``SKEWWATCH_CONFIG``, then the environment;
    ``profile``, from ``--profile``, wins over ``[detectors] profile``), the ``[kafka]`` TLS/SASL
    settings checked too (a missing password file is a setting problem), or
    :class:`~skewwatch.errors.ConfigProblem` before the command starts anything."""
    from skewwatch.config import load_settings
    from skewwatch.kafka_security import check_security

    env = dict(os.environ)
    if profile is not None:
        env["SKEWWATCH_DETECTORS__PROFILE"] = profile
    try:
        settings = load_settings(path, env)
        check_security(settings.kafka)
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from None
    return settings

# name -> "module:attribute" of a click command; imported lazily so `skewwatch broker`
# does not pay for importing Faust and numpy.
COMMANDS: dict[str, str] = {
    "broker": "skewwatch.broker.command:broker_command",
    "topics": "skewwatch.topics:topics_command",
    "config": "skewwatch.config_command:config_command",
    "worker": "skewwatch.agents.app:worker_command",
    "generate": "skewwatch.sim.generate_command:generate_command",
    "simulate": "skewwatch.sim.simulate_command:simulate_command",
    "demo": "skewwatch.demo:demo_command",
    "otlp-receiver": "skewwatch.otlp.receiver:otlp_receiver_command",
    "collect-gpu": "skewwatch.collect.collect_gpu_command:collect_gpu_command",
    "scrape": "skewwatch.collect.scrape_command:scrape_command",
    "tail": "skewwatch.tail:tail_command",
    "apply": "skewwatch.bridges.haproxy:apply_command",
    "alertmanager-bridge": "skewwatch.bridges.alertmanager:alertmanager_bridge_command",
}


class LazyGroup(click.Group):
    """Sub-commands imported on use; a configuration error anywhere is one line with exit code 2."""

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
        except Exception as exc:
            # A Kafka client that found no broker where a command did not expect it is still the documented
            # exit code 3, not a traceback. Only when aiokafka is loaded can the exception be one of its own.
            kafka_errors = sys.modules.get("aiokafka.errors")
            if kafka_errors is not None and isinstance(exc, kafka_errors.KafkaConnectionError):
                from skewwatch.kafka_client import describe_exception

                raise KafkaUnreachable(f"no Kafka answers: {describe_exception(exc)}; start one with `skewwatch "
                                       "broker` or point --bootstrap / KAFKA_BOOTSTRAP at a running cluster") \
                    from None
            raise


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skewwatch")
def main() -> None:
    """Watch an LLM inference fleet through Kafka and tell its router what to do."""
