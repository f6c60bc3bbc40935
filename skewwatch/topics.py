"""skewwatch's Kafka topics, created explicitly with their intended configs.

Topics are created explicitly with their intended configs (partitions, ``cleanup.policy=compact``
for corrections), never by auto-creation (the embedded broker runs with
``auto.create.topics.enable=false``). Routing corrections are compacted so a new subscriber reads the
current state; window state is checkpointed to a compacted topic with the input offset it covers.

>>> from skewwatch.config import Settings
>>> specs = {spec.name: spec for spec in topic_specs(Settings())}
>>> specs["llm.routing-corrections"].configs["cleanup.policy"], specs["llm.requests"].partitions
('compact', 8)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from skewwatch.cli import command_settings
from skewwatch.config import KafkaSettings, Settings
from skewwatch.errors import ConfigProblem, KafkaRefused, KafkaUnreachable, SkewwatchError
from skewwatch.kafka_client import (
    check_kafka,
    client_kwargs,
    describe_exception,
    quiet_client_logs,
    require_bootstrap,
    run_blocking,
)
from skewwatch.logs import quiet_libraries

_TOPIC_ALREADY_EXISTS = 36  # Kafka error code TOPIC_ALREADY_EXISTS: another process won the race
_CHECKPOINT_MAX_BYTES = 16 * 1024 * 1024  # a partition's window-state snapshot can exceed the 1 MiB default


class TopicError(SkewwatchError, RuntimeError):
    """Kafka answered but a topic could not be created (an ACL, a replication factor it cannot meet) or
    has no leader in time; one actionable line. No Kafka answering is
    :class:`~skewwatch.errors.KafkaUnreachable`."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as skewwatch wants it: name, partition count and topic-level configs."""

    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    replication_factor: int = 1


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic in ``settings.topics`` with its partitions and configs."""
    topics = settings.topics
    partitions = settings.kafka.partitions
    replication = settings.kafka.replication_factor
    request_limit = settings.limits.max_message_bytes
    compact = {"cleanup.policy": "compact"}

    def spec(name: str, configs: dict[str, str] | None = None) -> TopicSpec:
        return TopicSpec(name, partitions, dict(configs or {}), replication)

    return [
        # The worker, not the broker, must refuse an oversized request message (it goes to the dead-letter
        # topic with a reason), so the topic accepts up to 4x the worker's limit.
        spec(topics.requests, {"max.message.bytes": str(4 * request_limit)}),
        spec(topics.gpu_telemetry),
        spec(topics.features),
        spec(topics.alerts),
        spec(topics.routing_corrections, compact),
        # A dead letter carries the rejected message's original bytes (base64 grows them by 4/3).
        spec(topics.dead_letter, {"max.message.bytes": str(8 * request_limit)}),
        spec(topics.replica_steps),  # internal: stage 1 -> stage 2, keyed by model
        spec(topics.checkpoints, {**compact, "max.message.bytes": str(_CHECKPOINT_MAX_BYTES)}),
        # OTLP spans from the OTel Collector's Kafka exporter, only when configured; a Collector
        # batch is one record, so it gets the same room as a request message
        *([spec(topics.otlp_spans, {"max.message.bytes": str(4 * request_limit)})] if topics.otlp_spans else []),
    ]


async def ensure_topics(bootstrap: str, settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the topics of :func:`topic_specs` that do not exist yet; the names created.

    Idempotent: existing topics are left as they are (their partitions and configs are not changed), and a
    topic another process creates at the same moment counts as existing. Returns once every created
    topic has a leader for each partition, so a producer can use it right away.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import for_code

    specs = list({spec.name: spec for spec in topic_specs(settings)}.values())  # one spec per name
    admin = AIOKafkaAdminClient(
        **client_kwargs(settings.kafka, bootstrap=bootstrap),
        client_id=f"{settings.kafka.client_id}-admin",
        request_timeout_ms=int(timeout * 1000),
    )
    try:
        try:
            async with asyncio.timeout(timeout):
                await admin.start()
                existing = set(await admin.list_topics())
        except Exception as exc:
            raise KafkaUnreachable(
                f"no Kafka answers at {bootstrap} ({describe_exception(exc)}); start one with "
                "`skewwatch broker` or set KAFKA_BOOTSTRAP"
            ) from exc
        missing = [spec for spec in specs if spec.name not in existing]
        if not missing:
            return []
        response = await admin.create_topics(
            [
                NewTopic(spec.name, spec.partitions, spec.replication_factor, topic_configs=spec.configs)
                for spec in missing
            ],
            timeout_ms=int(timeout * 1000),
        )
        created: list[str] = []
        for result in response.to_object()["topic_errors"]:
            code = result["error_code"]
            if code == 0:
                created.append(result["topic"])
            elif code != _TOPIC_ALREADY_EXISTS:
                error = for_code(code)
                detail = result.get("error_message") or error.description
                raise TopicError(f"cannot create topic {result['topic']}: {error.__name__}: {detail}")
        await _wait_for_leaders(admin, created, deadline=time.monotonic() + timeout)
        return [spec.name for spec in missing if spec.name in created]  # in spec order
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _wait_for_leaders(admin: Any, names: list[str], deadline: float) -> None:
    # CreateTopics answers once the controller committed the topics; the broker's metadata (what a
    # producer asks for) can lag a moment behind, and an early producer would see UNKNOWN_TOPIC.
    pending = set(names)
    while pending:
        for topic in await admin.describe_topics(sorted(pending)):
            partitions = topic.get("partitions") or []
            if topic["error_code"] == 0 and partitions and all(p["leader"] >= 0 for p in partitions):
                pending.discard(topic["topic"])
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TopicError(
                f"topics created but without a partition leader yet: {', '.join(sorted(pending))}"
            )
        await asyncio.sleep(0.1)


async def delete_topics(bootstrap: str, names: list[str], timeout: float = 30.0,
                        kafka: KafkaSettings | None = None) -> None:
    """Delete topics (tests clean up after themselves on a shared cluster); missing ones are ignored."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**client_kwargs(kafka, bootstrap=bootstrap), request_timeout_ms=int(timeout * 1000))
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        doomed = [name for name in names if name in existing]
        if doomed:
            await admin.delete_topics(doomed, timeout_ms=int(timeout * 1000))
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


@dataclass(frozen=True, slots=True)
class TopicState:
    """One topic as the cluster has it: partitions (id -> leader, replicas, in-sync replicas), configs."""

    name: str
    partitions: dict[int, tuple[int, list[int], list[int]]]
    configs: dict[str, str]
    end_offsets: dict[int, int] = field(default_factory=dict)


async def describe_topics(bootstrap: str, settings: Settings, names: list[str], timeout: float = 30.0,
                          offsets: bool = False) -> dict[str, TopicState | None]:
    """name -> its :class:`TopicState` at the cluster, or None where it does not exist."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    options = client_kwargs(settings.kafka, bootstrap=bootstrap)
    admin = AIOKafkaAdminClient(**options, client_id=f"{settings.kafka.client_id}-admin",
                                request_timeout_ms=int(timeout * 1000))
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
            found = {t["topic"]: t for t in await admin.describe_topics(names) if t["error_code"] == 0}
            configs: dict[str, dict[str, str]] = {name: {} for name in found}
            if found:
                responses = await admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, name) for name in found])
                for response in responses:
                    for resource in response.to_object()["resources"]:
                        configs[resource["resource_name"]] = {
                            entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
                            if entry["config_value"] is not None}
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    ends: dict[TopicPartition, int] = {}
    if offsets and found:
        consumer = AIOKafkaConsumer(**options, group_id=None)
        try:
            await consumer.start()
            ends = await consumer.end_offsets([TopicPartition(name, p["partition"])
                                               for name, topic in found.items() for p in topic["partitions"]])
        finally:
            await consumer.stop()
    out: dict[str, TopicState | None] = {}
    for name in names:
        topic = found.get(name)
        if topic is None:
            out[name] = None
            continue
        partitions = {p["partition"]: (p["leader"], list(p["replicas"]), list(p["isr"])) for p in topic["partitions"]}
        out[name] = TopicState(name, dict(sorted(partitions.items())), configs.get(name, {}),
                               {tp.partition: offset for tp, offset in ends.items() if tp.topic == name})
    return out


# --------------------------------------------------------------------------------------------------
# `skewwatch topics ...`


@click.group("topics")
def topics_command() -> None:
    """Manage skewwatch's Kafka topics."""


@topics_command.command("create")
@click.option(
    "--bootstrap",
    metavar="HOST:PORT",
    help="Kafka to use; default: settings kafka.bootstrap or env KAFKA_BOOTSTRAP.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Settings TOML file (default: env SKEWWATCH_CONFIG).",
)
def create_command(bootstrap: str | None, config_path: Path | None) -> None:
    """Create the topics that do not exist yet, with their partitions and configs."""
    quiet_client_logs()
    quiet_libraries()
    settings = command_settings(config_path)
    bootstrap = require_bootstrap(bootstrap, settings, "to create topics on")
    check_kafka(bootstrap, settings)  # nothing answering: exit 3; TLS or SASL refused: exit 4
    try:
        created = run_blocking(ensure_topics(bootstrap, settings))
    except TopicError as exc:  # Kafka answered and refused (an ACL, a replication factor it cannot meet)
        raise KafkaRefused(str(exc)) from None
    specs = topic_specs(settings)
    for spec in specs:
        state = "created" if spec.name in created else "exists"
        configs = " ".join(f"{key}={value}" for key, value in spec.configs.items())
        click.echo(f"{state:8} {spec.name} partitions={spec.partitions} {configs}".rstrip())


_BOOTSTRAP_HELP = "Kafka to use; default: settings kafka.bootstrap or env KAFKA_BOOTSTRAP."
_CONFIG_HELP = "Settings TOML file (default: env SKEWWATCH_CONFIG)."


def _cluster_topics(bootstrap: str | None, config_path: Path | None, names: list[str] | None,
                    offsets: bool = False) -> tuple[Settings, dict[str, TopicState | None]]:
    """The settings and the state of ``names`` (default: the settings' topics), after the checks every
    command makes: the bootstrap (exit code 2), Kafka answering (3), TLS or the login (4)."""
    from aiokafka.errors import KafkaError

    quiet_client_logs()
    quiet_libraries()
    settings = command_settings(config_path)
    bootstrap = require_bootstrap(bootstrap, settings, "to read topics from")
    check_kafka(bootstrap, settings)
    wanted = names or [spec.name for spec in topic_specs(settings)]
    try:
        return settings, run_blocking(describe_topics(bootstrap, settings, wanted, offsets=offsets))
    except (KafkaError, OSError, TimeoutError) as exc:
        from skewwatch.kafka_client import kafka_failure

        raise kafka_failure(exc, bootstrap, "to describe the topics") from None


@topics_command.command("list")
@click.option("--bootstrap", metavar="HOST:PORT", help=_BOOTSTRAP_HELP)
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), help=_CONFIG_HELP)
def list_command(bootstrap: str | None, config_path: Path | None) -> None:
    """Each of skewwatch's topics: exists or missing, its partitions, and where its configs differ from
    what `topics create` would set."""
    settings, states = _cluster_topics(bootstrap, config_path, None)
    for spec in topic_specs(settings):
        state = states.get(spec.name)
        if state is None:
            click.echo(f"missing  {spec.name} (`skewwatch topics create` creates it)")
            continue
        differs = [f"{key}={state.configs.get(key)} (want {value})" for key, value in spec.configs.items()
                   if state.configs.get(key) != value]
        if len(state.partitions) != spec.partitions:
            differs.append(f"partitions want {spec.partitions}")
        note = f"  differs: {', '.join(differs)}" if differs else ""
        click.echo(f"exists   {spec.name} partitions={len(state.partitions)}{note}")


@topics_command.command("describe")
@click.argument("names", nargs=-1, metavar="[TOPIC]...")
@click.option("--bootstrap", metavar="HOST:PORT", help=_BOOTSTRAP_HELP)
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False), help=_CONFIG_HELP)
def describe_command(names: tuple[str, ...], bootstrap: str | None, config_path: Path | None) -> None:
    """Partitions (leader, replicas, in-sync replicas, end offset), cleanup, size and retention configs of
    the named topics (default: skewwatch's)."""
    settings, states = _cluster_topics(bootstrap, config_path, list(names) or None, offsets=True)
    missing = [name for name, state in states.items() if state is None]
    if names and missing:
        raise ConfigProblem(f"no such topic at {settings.kafka.bootstrap}: {', '.join(missing)}")
    for name, state in states.items():
        if state is None:
            click.echo(f"{name}: missing (`skewwatch topics create` creates it)\n")
            continue
        click.echo(f"{name}: {len(state.partitions)} partitions, {sum(state.end_offsets.values())} records written")
        for key, value in sorted(state.configs.items()):
            if key in _SHOWN_CONFIGS:
                click.echo(f"  {key}={value}")
        for partition, (leader, replicas, isr) in state.partitions.items():
            click.echo(f"  partition {partition}: leader {leader}, replicas {replicas}, in-sync {isr}, "
                       f"end offset {state.end_offsets.get(partition, '?')}")
        click.echo("")


# what an operator checks on skewwatch's topics: the ones `topics create` sets, and how long records stay
_SHOWN_CONFIGS = {"cleanup.policy", "max.message.bytes", "retention.ms", "retention.bytes", "min.insync.replicas"}


__all__ = ["TopicError", "TopicSpec", "TopicState", "delete_topics", "describe_topics",
           "ensure_topics", "topic_specs", "topics_command"]
