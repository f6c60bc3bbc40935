"""The ``skewwatch`` command line (click). Each sub-command lives beside the code it drives."""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command; imported lazily so `skewwatch broker`
# does not pay for importing Faust and numpy.
COMMANDS: dict[str, str] = {
    "broker": "skewwatch.broker:broker_command",
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skewwatch")
def main() -> None:
    """Watch an LLM inference fleet through Kafka and tell its router what to do."""
