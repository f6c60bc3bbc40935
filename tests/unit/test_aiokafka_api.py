"""The aiokafka API skewwatch relies on beyond aiokafka's documented clients, on the installed aiokafka.

skewwatch.kafka_client's helpers use aiokafka's private and internal API where the public one has
nothing equivalent; a few modules import names from aiokafka's submodules rather than its top-level
exports. A new aiokafka that moves any of it fails here, naming the helper or module to revisit,
instead of at run time against a broker.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

import aiokafka
import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer

PACKAGE = Path(__file__).parents[2] / "skewwatch"


def _parameters(function: Callable[..., object]) -> list[str]:
    return list(inspect.signature(function).parameters)


def _moved(what: str, helper: str) -> str:
    return (f"aiokafka {aiokafka.__version__}: {what} moved; skewwatch.kafka_client.{helper} relies on it "
            "(update the helper and the pin in pyproject.toml)")


def test_the_pin_admits_the_installed_aiokafka() -> None:
    """The helpers were checked against the versions the pin admits; an aiokafka outside it is unchecked."""
    major, minor = (int(part) for part in aiokafka.__version__.split(".")[:2])
    assert (0, 13) <= (major, minor) < (0, 15), f"aiokafka {aiokafka.__version__} is outside the pin >=0.13,<0.15"


async def test_refresh_metadata_and_wait_for_topic_rely_on_the_consumers_client() -> None:
    """``consumer._client``, an AIOKafkaClient made by the consumer's constructor (nothing connects here)."""
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:9")
    try:
        client = getattr(consumer, "_client", None)
        assert isinstance(client, AIOKafkaClient), _moved("AIOKafkaConsumer._client", "refresh_metadata")
        assert client.cluster.partitions_for_topic("absent") is None  # what partitions_for_topic() reads
    finally:
        await consumer.stop()
    assert _parameters(AIOKafkaClient.force_metadata_update) == ["self"], \
        _moved("AIOKafkaClient.force_metadata_update()", "refresh_metadata")


def test_wait_for_topic_relies_on_the_clients_wait_on_metadata() -> None:
    method = getattr(AIOKafkaClient, "_wait_on_metadata", None)
    assert method is not None and inspect.iscoroutinefunction(method), \
        _moved("AIOKafkaClient._wait_on_metadata (a coroutine)", "wait_for_topic")
    assert _parameters(method) == ["self", "topic"], _moved("AIOKafkaClient._wait_on_metadata(topic)", "wait_for_topic")


def test_new_batch_builds_what_create_batch_returns() -> None:
    """new_batch: BatchBuilder(size, compression, is_transactional=), appendable and sendable like
    ``producer.create_batch()``'s (the publisher falls back on that if the constructor is refused)."""
    from skewwatch.kafka_client import new_batch

    try:
        module = importlib.import_module("aiokafka.producer.message_accumulator")
    except ImportError:
        pytest.fail(_moved("aiokafka.producer.message_accumulator", "new_batch"))
    assert hasattr(module, "BatchBuilder"), _moved("aiokafka.producer.message_accumulator.BatchBuilder", "new_batch")
    assert _parameters(AIOKafkaProducer.send_batch)[:3] == ["self", "batch", "topic"], \
        _moved("AIOKafkaProducer.send_batch(batch, topic, partition=)", "new_batch")
    batch = new_batch(1024)
    assert isinstance(batch, module.BatchBuilder), _moved("BatchBuilder", "new_batch")
    assert batch.append(key=b"k", value=b"v", timestamp=None) is not None, _moved("BatchBuilder.append", "new_batch")
    assert batch.record_count() == 1, _moved("BatchBuilder.record_count", "new_batch")


def test_check_connection_relies_on_create_conn() -> None:
    try:
        from aiokafka.conn import create_conn
    except ImportError:
        pytest.fail(_moved("aiokafka.conn.create_conn", "check_connection"))
    assert inspect.iscoroutinefunction(create_conn), \
        _moved("aiokafka.conn.create_conn (a coroutine)", "check_connection")
    parameters = _parameters(create_conn)
    needed = {"client_id", "request_timeout_ms", "security_protocol", "ssl_context", "sasl_mechanism",
              "sasl_plain_username", "sasl_plain_password"}
    assert parameters[:2] == ["host", "port"] and needed <= set(parameters), \
        _moved(f"aiokafka.conn.create_conn(host, port, {', '.join(sorted(needed))})", "check_connection")


def test_the_broker_watch_metadata_request_is_exported() -> None:
    """skewwatch.broker_watch keeps an AIOKafkaClient (in ``aiokafka.__all__``) and asks it for metadata."""
    assert "AIOKafkaClient" in aiokafka.__all__
    assert inspect.iscoroutinefunction(AIOKafkaClient.fetch_all_metadata)
    assert inspect.iscoroutinefunction(AIOKafkaClient.bootstrap)


def _submodule_imports() -> dict[str, set[str]]:
    """``from aiokafka.<module> import name`` anywhere in the package: module -> names."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("aiokafka."):
                found.setdefault(node.module or "", set()).update(alias.name for alias in node.names)
    return found


def test_every_name_imported_from_an_aiokafka_submodule_exists() -> None:
    imported = _submodule_imports()
    assert "aiokafka.admin" in imported  # the walk reads the package
    missing = [f"{module}.{name}" for module, names in sorted(imported.items()) for name in sorted(names)
               if not hasattr(importlib.import_module(module), name)]
    assert missing == [], f"aiokafka {aiokafka.__version__} no longer has {missing}"


# files that still call a consumer's private _client themselves rather than skewwatch.kafka_client's
# helper (refresh_metadata); an entry that no longer does fails the test below
PRIVATE_API_PENDING: frozenset[str] = frozenset()


def test_only_kafka_client_uses_aiokafkas_internal_api() -> None:
    """aiokafka's internal modules, and its clients' private ``_client``, are reached through
    skewwatch.kafka_client's helpers only."""
    internal = ("aiokafka.client", "aiokafka.conn", "aiokafka.producer")
    users: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "kafka_client.py" and path.parent == PACKAGE:
            continue
        name = str(path.relative_to(PACKAGE.parent))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(internal):
                users.setdefault(name, []).append(node.module or "")
            if isinstance(node, ast.Attribute) and node.attr == "_client" and not (
                    isinstance(node.value, ast.Name) and node.value.id == "self"):
                users.setdefault(name, []).append("._client")
    assert set(users) == PRIVATE_API_PENDING, f"aiokafka's internal API outside skewwatch.kafka_client: {users}"
