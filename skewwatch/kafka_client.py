"""How skewwatch talks to a Kafka cluster: every client's connection options, and small helpers.

:func:`client_kwargs` is the one place where an aiokafka client (consumer, producer, admin) gets
its connection options, and :func:`faust_app_kwargs` the same for the worker's Faust app: every
client in the project is built with them, so connection settings are added here and nowhere else:
the address, and the ``[kafka]`` section's TLS and SASL options (:mod:`skewwatch.kafka_security`).
:func:`require_bootstrap` and :func:`check_kafka` are what a command does before it starts anything.

It is also the one place that touches aiokafka's private or internal API (:func:`refresh_metadata`,
:func:`wait_for_topic`, :func:`new_batch`, :func:`check_connection`), where its public API has
nothing equivalent. These helpers
were checked against aiokafka 0.13 and 0.14 (pyproject.toml pins ``aiokafka>=0.13,<0.15``);
``tests/unit/test_aiokafka_api.py`` fails, naming the helper, when the installed aiokafka moves what
they rely on. What aiokafka exports is used directly (``AIOKafkaClient.fetch_all_metadata``, in
``aiokafka.__all__``; ``AIOKafkaProducer.create_batch``/``send_batch``).

>>> client_kwargs(bootstrap="127.0.0.1:9092")
{'bootstrap_servers': '127.0.0.1:9092'}
>>> from skewwatch.config import KafkaSettings
>>> client_kwargs(KafkaSettings(bootstrap="kafka-1:9094", security_protocol="SSL"))["security_protocol"]
'SSL'
>>> describe_exception(TimeoutError())
'TimeoutError'
>>> run_blocking(asyncio.sleep(0, result="done"))
'done'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.producer.message_accumulator import BatchBuilder

    from skewwatch.config import KafkaSettings, Settings
    from skewwatch.errors import CommandError

T = TypeVar("T")


def client_kwargs(kafka: KafkaSettings | None = None, *, bootstrap: str | None = None) -> dict[str, Any]:
    """The connection options of an aiokafka client: ``AIOKafkaConsumer(**client_kwargs(...), ...)``.

    ``bootstrap`` (a command's ``--bootstrap``) wins over ``kafka.bootstrap``. ValueError when
    neither names a cluster.
    """
    servers = bootstrap or (kafka.bootstrap if kafka is not None else None)
    if not servers:
        raise ValueError("no Kafka bootstrap address (kafka.bootstrap, KAFKA_BOOTSTRAP or --bootstrap)")
    options: dict[str, Any] = {"bootstrap_servers": servers}
    if kafka is not None:
        from skewwatch.kafka_security import client_options  # imported on use: `skewwatch broker` stays light

        options.update(client_options(kafka))
    return options


def group_consumer_kwargs(kafka: KafkaSettings | None = None, *, bootstrap: str | None = None) -> dict[str, Any]:
    """:func:`client_kwargs` plus what a consumer in a group needs: ``[kafka] session_timeout_ms`` and
    ``heartbeat_interval_ms`` (aiokafka's defaults, 10 s and 3 s, without settings)."""
    options = client_kwargs(kafka, bootstrap=bootstrap)
    if kafka is not None:
        options.update(session_timeout_ms=kafka.session_timeout_ms, heartbeat_interval_ms=kafka.heartbeat_interval_ms)
    return options


def require_bootstrap(bootstrap: str | None, settings: Settings, what: str) -> str:
    """``bootstrap`` (a command's option) or ``kafka.bootstrap``, also stored there; else, or when it is
    not ``host:port[,host:port]``, the one-line ConfigProblem (exit code 2) naming the ways to give one.
    ``what``: "to publish to", ..."""
    from skewwatch.config_section import ConfigError
    from skewwatch.errors import ConfigProblem
    from skewwatch.kafka_security import bootstrap_hosts

    servers = bootstrap or settings.kafka.bootstrap
    if not servers:
        raise ConfigProblem(f"no Kafka {what}: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP "
                            "(`skewwatch broker` starts one)")
    try:
        bootstrap_hosts(servers)
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from None
    settings.kafka.bootstrap = servers
    return servers


def check_kafka(bootstrap: str, settings: Settings, timeout: float = 10.0) -> None:
    """One connection to ``bootstrap`` as the clients will make it (TLS, SASL), before a one-shot command
    starts: nothing answering is KafkaUnreachable (exit code 3), a refused TLS handshake or login
    KafkaRefused (4), each one line, without the client's own error lines and without retries.
    Long-running services do not stop on KafkaUnreachable: they wait for their broker."""
    run_blocking(check_connection(bootstrap, settings.kafka, timeout=timeout))


def faust_app_kwargs(kafka: KafkaSettings | None = None, *, bootstrap: str | None = None) -> dict[str, Any]:
    """The connection options of a ``faust.App``, from the same settings as :func:`client_kwargs`:
    the broker URL and, on a secured cluster, Faust's ``broker_credentials`` (SASL over TLS or not, or
    TLS alone) built from the same TLS context and SASL options, and the group's session timeout and
    heartbeat interval (Faust takes seconds), and the apps' local data directory where one is set
    (``kafka.faust_datadir``)."""
    options = client_kwargs(kafka, bootstrap=bootstrap)
    app: dict[str, Any] = {"broker": f"kafka://{options['bootstrap_servers']}"}
    if kafka is not None:
        app.update(broker_session_timeout=kafka.session_timeout_ms / 1000,
                   broker_heartbeat_interval=kafka.heartbeat_interval_ms / 1000)
        if kafka.faust_datadir is not None:
            app["datadir"] = kafka.faust_datadir
    protocol = options.get("security_protocol", "PLAINTEXT")
    if protocol.startswith("SASL"):
        import faust

        app["broker_credentials"] = faust.SASLCredentials(
            username=options["sasl_plain_username"], password=options["sasl_plain_password"],
            mechanism=options["sasl_mechanism"], ssl_context=options.get("ssl_context"))
    elif protocol == "SSL":
        import faust

        app["broker_credentials"] = faust.SSLCredentials(options["ssl_context"])
    return app


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, even when called inside a running event loop.

    It runs on a fresh loop in a helper thread, so it never touches the caller's loop (pytest-asyncio's
    or a Faust worker's) — ``asyncio.run`` in the calling thread would close or replace it.
    """
    result: list[T] = []
    failure: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:  # handed back to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=runner, name="skewwatch-run-blocking", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


async def describe_cluster(bootstrap: str, timeout: float = 10.0, kafka: KafkaSettings | None = None
                           ) -> dict[str, Any]:
    """A real Kafka metadata request: ``{"brokers": [...], "cluster_id": ..., "controller_id": ...}``.

    Raises :class:`~skewwatch.errors.KafkaUnreachable` when nothing answers at ``bootstrap`` within
    ``timeout`` seconds, or the cluster lists no live broker yet.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    from skewwatch.errors import KafkaUnreachable

    admin = AIOKafkaAdminClient(**client_kwargs(kafka, bootstrap=bootstrap), client_id="skewwatch-probe",
                                request_timeout_ms=int(timeout * 1000))
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
            cluster: dict[str, Any] = await admin.describe_cluster()
    except Exception as exc:
        raise KafkaUnreachable(f"no Kafka answers at {bootstrap}: {describe_exception(exc)}") from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    if not cluster.get("brokers"):
        raise KafkaUnreachable(f"Kafka at {bootstrap} answers but lists no live broker yet")
    return cluster


def kafka_failure(exc: BaseException, bootstrap: str, what: str = "during the run") -> CommandError:
    """The one-line error of a Kafka client that failed after the command's first connection: the
    broker went away (exit code 3), or refused TLS or the login (4)."""
    from aiokafka import errors as kafka_errors

    from skewwatch.errors import KafkaRefused, KafkaUnreachable

    if isinstance(exc, kafka_errors.SaslAuthenticationFailed | kafka_errors.AuthenticationFailedError |
                  kafka_errors.TopicAuthorizationFailedError | kafka_errors.GroupAuthorizationFailedError):
        return KafkaRefused(f"Kafka at {bootstrap} refused {what}: {describe_exception(exc)}")
    return KafkaUnreachable(f"Kafka at {bootstrap} failed {what}: {describe_exception(exc)}; is the cluster up "
                            "(`skewwatch broker` starts one)?")


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` on one line, without the type twice (aiokafka's messages repeat it).

    >>> describe_exception(ValueError("ValueError: bad\\n value"))
    'ValueError: bad value'
    """
    name = type(exc).__name__
    message = " ".join(str(exc).split())
    if not message:
        return name
    return message if message.startswith(name) else f"{name}: {message}"


# aiokafka's private and internal API (see the module's docstring for the versions checked)


async def refresh_metadata(consumer: AIOKafkaConsumer) -> None:
    """Fetch the cluster's metadata into a started consumer now, so that ``partitions_for_topic()``
    knows the topics it neither subscribes to nor is assigned yet (aiokafka refreshes it only on its
    own schedule, ``metadata_max_age_ms``). Private: ``consumer._client.force_metadata_update()``;
    the public ``consumer.topics()`` fetches the metadata without storing it in the consumer."""
    await consumer._client.force_metadata_update()


async def wait_for_topic(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The partitions of ``topic``, waiting (refreshing the consumer's metadata) until the cluster lists
    them; aiokafka's UnknownTopicOrPartitionError after the consumer's ``request_timeout_ms``. Private:
    ``consumer._client._wait_on_metadata(topic)``, what the producer's public ``partitions_for(topic)``
    does; the consumer has no public equivalent."""
    partitions: set[int] = await consumer._client._wait_on_metadata(topic)
    return partitions


async def check_connection(bootstrap: str, kafka: KafkaSettings, timeout: float = 10.0) -> None:
    """Open one connection as the clients will (TLS, SASL) and make one request; raise the one-line
    :class:`~skewwatch.errors.KafkaRefused` or :class:`~skewwatch.errors.KafkaUnreachable` if that fails.

    One attempt per bootstrap server, no retry: a wrong password is reported once, not in a loop (every
    public client retries its bootstrap). Internal: ``aiokafka.conn.create_conn``, which makes the
    connection and, on a SASL listener, the login.
    """
    from aiokafka.conn import create_conn

    from skewwatch.errors import KafkaRefused
    from skewwatch.kafka_security import bootstrap_hosts, client_options, connection_problem

    options = client_options(kafka)
    problem: CommandError | None = None
    for host, port in bootstrap_hosts(bootstrap):
        try:
            async with asyncio.timeout(timeout):
                conn = await create_conn(host, port, client_id="skewwatch-check",
                                         request_timeout_ms=int(timeout * 1000), **options)
        except Exception as exc:
            problem = problem if isinstance(problem, KafkaRefused) else connection_problem(exc, bootstrap, kafka)
            continue
        with contextlib.suppress(Exception):
            conn.close()
        return
    assert problem is not None
    raise problem


def new_batch(batch_bytes: int) -> BatchBuilder:
    """An empty, uncompressed, non-transactional batch of ``batch_bytes`` for ``producer.send_batch()``:
    what the public ``producer.create_batch()`` builds, but of this size rather than the producer's
    ``max_batch_size``. Internal: ``aiokafka.producer.message_accumulator.BatchBuilder``'s constructor;
    TypeError where another aiokafka's signature differs (callers fall back on ``create_batch()``)."""
    from aiokafka.producer.message_accumulator import BatchBuilder

    return BatchBuilder(batch_bytes, 0, is_transactional=False)  # 0: no compression


def quiet_client_logs() -> None:
    """Keep aiokafka's per-connection errors off a command's terminal when no logging is configured.

    Without any handler, Python prints WARNING+ records through its last-resort handler, so a refused
    connection would show a stack of aiokafka lines above the command's own one-line error.
    """
    logging.getLogger("aiokafka").addHandler(logging.NullHandler())


__all__ = [
    "check_connection",
    "check_kafka",
    "client_kwargs",
    "describe_cluster",
    "describe_exception",
    "faust_app_kwargs",
    "group_consumer_kwargs",
    "kafka_failure",
    "new_batch",
    "quiet_client_logs",
    "refresh_metadata",
    "require_bootstrap",
    "run_blocking",
    "wait_for_topic",
]
