"""``skewwatch broker``: the embedded broker in the foreground until Ctrl-C (and skewwatch's topics)."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from skewwatch.broker.errors import BrokerError, DataDirInUse, PortBusy
from skewwatch.broker.jars import kafka_version
from skewwatch.broker.process import EmbeddedBroker
from skewwatch.errors import AddressInUse, BrokerFailed, CommandError, DataDirLocked, KafkaUnreachable, SkewwatchError
from skewwatch.kafka_client import describe_cluster, quiet_client_logs, run_blocking
from skewwatch.logs import logging_options, quiet_libraries, setup_logging

if TYPE_CHECKING:
    from skewwatch.config import Settings


class _Terminated(SkewwatchError):
    """SIGTERM arrived: stop like on Ctrl-C."""

    exit_code = 0  # stopping on SIGTERM is a success, as on Ctrl-C


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


@click.command("broker")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".skewwatch/kafka"),
    show_default=True,
    help="Where the broker keeps its topics and logs (formatted on first use, kept across restarts).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=9092, show_default=True, help="Client port.")
@click.option(
    "--bootstrap",
    envvar="KAFKA_BOOTSTRAP",
    metavar="HOST:PORT",
    help="Use this existing cluster instead (env KAFKA_BOOTSTRAP): start nothing, check that it answers.",
)
@click.option(
    "--topics/--no-topics",
    default=True,
    show_default=True,
    help="Create skewwatch's topics (from the settings) once the broker is ready.",
)
@click.option("--heap", default="512m", show_default=True, help="JVM heap (-Xmx) of the broker.")
@logging_options
@click.pass_context
def broker_command(
    ctx: click.Context, data_dir: Path, port: int, bootstrap: str | None, topics: bool, heap: str, loglevel: str,
    log_format: str,
) -> None:
    """Run a single-node Apache Kafka (KRaft) on loopback in the foreground until Ctrl-C.

    The first run fetches the pinned Kafka from Maven Central (needs Java 17+ and Maven on PATH).
    Exit codes (skewwatch.errors): 3 the --bootstrap cluster does not answer, 5 the port is taken,
    6 the data directory is locked by another broker, 8 anything else that stops it.
    """
    setup_logging(loglevel, log_format)
    quiet_client_logs()
    quiet_libraries(loglevel)
    if bootstrap:
        source = ctx.get_parameter_source("bootstrap")
        origin = "KAFKA_BOOTSTRAP" if source == click.core.ParameterSource.ENVIRONMENT else "--bootstrap"
        click.echo(f"{origin}={bootstrap} is set: using that cluster, starting no broker")
        try:
            cluster = run_blocking(describe_cluster(bootstrap, timeout=15.0))
        except KafkaUnreachable as exc:
            raise KafkaUnreachable(f"{exc} (from {origin}; unset it to start the embedded broker)") from None
        click.echo(f"cluster {cluster.get('cluster_id')} at {bootstrap} answers: {len(cluster['brokers'])} broker(s)")
        return

    from skewwatch.cli import command_settings

    settings = command_settings() if topics else None  # invalid settings stop it before the JVM starts
    broker = EmbeddedBroker(
        data_dir, port=port, heap=heap, echo_console=True, progress=lambda m: click.echo(m, err=True)
    )
    previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_sigint = signal.getsignal(signal.SIGINT)
    try:
        try:
            broker.start()
            if settings is not None:
                _create_topics(broker.bootstrap, settings)
            click.echo(f"Kafka {kafka_version()} ready: bootstrap {broker.bootstrap} (data {broker.data_dir})")
            click.echo(f"KAFKA_BOOTSTRAP={broker.bootstrap}")
            click.echo(f"broker log: {broker.log_path}; Ctrl-C stops it")
            code = broker.wait()
            raise _as_command_error(broker.failure(f"Kafka exited by itself with code {code}"))
        except (KeyboardInterrupt, _Terminated):
            click.echo("stopping Kafka...", err=True)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abandon the JVM
            broker.stop()
            click.echo("Kafka stopped", err=True)
        except BrokerError as exc:
            raise _as_command_error(exc) from None
    finally:
        broker.stop()
        signal.signal(signal.SIGTERM, previous_sigterm)
        signal.signal(signal.SIGINT, previous_sigint)


def _as_command_error(exc: BrokerError) -> CommandError:
    """The one-line error and exit code of ``skewwatch broker`` for ``exc``."""
    if isinstance(exc, PortBusy):
        return AddressInUse(str(exc))
    if isinstance(exc, DataDirInUse):
        return DataDirLocked(str(exc))
    return BrokerFailed(str(exc))


def _create_topics(bootstrap: str, settings: Settings) -> None:
    from skewwatch.topics import TopicError, ensure_topics

    try:
        created = run_blocking(ensure_topics(bootstrap, settings))
    except (TopicError, KafkaUnreachable) as exc:
        raise BrokerError(f"Kafka started, but creating topics failed: {exc}") from exc
    if created:
        click.echo(f"created topics: {', '.join(created)}", err=True)


__all__ = ["broker_command"]
