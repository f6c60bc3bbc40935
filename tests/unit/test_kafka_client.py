"""skewwatch.kafka_client: every aiokafka client gets its connection options from one function."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from skewwatch.config import KafkaSettings
from skewwatch.errors import KafkaUnreachable
from skewwatch.kafka_client import (
    client_kwargs,
    describe_cluster,
    describe_exception,
    faust_app_kwargs,
    group_consumer_kwargs,
    run_blocking,
)
from skewwatch.ports import free_port

PACKAGE = Path(__file__).parents[2] / "skewwatch"
CLIENTS = {"AIOKafkaConsumer", "AIOKafkaProducer", "AIOKafkaAdminClient"}


def test_the_command_line_bootstrap_wins_over_the_settings() -> None:
    kafka = KafkaSettings(bootstrap="settings:9092")
    plain = {"security_protocol": "PLAINTEXT"}  # and TLS / SASL when [kafka] says so (skewwatch.kafka_security)
    assert client_kwargs(kafka) == {"bootstrap_servers": "settings:9092", **plain}
    assert client_kwargs(kafka, bootstrap="cli:9092") == {"bootstrap_servers": "cli:9092", **plain}
    assert client_kwargs(bootstrap="cli:9092") == {"bootstrap_servers": "cli:9092"}
    assert faust_app_kwargs(kafka) == {"broker": "kafka://settings:9092", "broker_session_timeout": 10.0,
                                       "broker_heartbeat_interval": 3.0}
    with pytest.raises(ValueError, match="no Kafka bootstrap address"):
        client_kwargs(KafkaSettings())


def test_the_group_timeouts_reach_every_group_consumer_and_faust() -> None:
    kafka = KafkaSettings(bootstrap="b:9092", session_timeout_ms=20_000, heartbeat_interval_ms=5_000)
    options = group_consumer_kwargs(kafka)
    assert options["session_timeout_ms"] == 20_000 and options["heartbeat_interval_ms"] == 5_000
    assert options["bootstrap_servers"] == "b:9092"
    app = faust_app_kwargs(kafka)
    assert app["broker_session_timeout"] == 20.0 and app["broker_heartbeat_interval"] == 5.0
    assert "session_timeout_ms" not in client_kwargs(kafka)  # producers and admin clients take no group options


def test_the_faust_apps_keep_their_data_where_the_settings_say(tmp_path: Path) -> None:
    import faust

    assert "datadir" not in faust_app_kwargs(KafkaSettings(bootstrap="b:9092"))  # Faust's default
    kafka = KafkaSettings(bootstrap="b:9092", faust_datadir=str(tmp_path / "faust"))
    app = faust.App("skewwatch-test", **faust_app_kwargs(kafka), autodiscover=False, store="memory://")
    assert Path(app.conf.datadir) == tmp_path / "faust"


def test_every_stage_consumer_is_built_with_the_group_timeouts() -> None:
    from aiokafka import AIOKafkaConsumer

    from skewwatch.agents.metrics import WorkerMetrics
    from skewwatch.agents.model_stage import ModelStage
    from skewwatch.agents.replica_stage import ReplicaStage
    from skewwatch.config import Settings

    settings = Settings(kafka=KafkaSettings(bootstrap="127.0.0.1:9", session_timeout_ms=7_000,
                                            heartbeat_interval_ms=2_000))

    async def consumers() -> list[AIOKafkaConsumer]:
        return [cls(settings, "127.0.0.1:9", None, WorkerMetrics()).new_consumer()  # type: ignore[arg-type]
                for cls in (ReplicaStage, ModelStage)]

    for consumer in asyncio.run(consumers()):  # built, not started: no connection is made
        assert consumer._session_timeout_ms == 7_000 and consumer._heartbeat_interval_ms == 2_000


def test_every_client_in_the_package_is_built_with_client_kwargs() -> None:
    """No aiokafka client names its cluster by itself (aiokafka would default to localhost):
    each is built with ``**`` options, and only kafka_client.py spells ``bootstrap_servers``."""
    built = 0
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if path.name != "kafka_client.py":
            assert "bootstrap_servers" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in CLIENTS:
                built += 1
                assert any(keyword.arg is None for keyword in node.keywords), f"{path}:{node.lineno}"
    assert built >= 10  # the stages, checkpoints, topics, producers, the simulator, the demo


def test_run_blocking_works_inside_a_running_loop() -> None:
    async def inside() -> str:
        return run_blocking(asyncio.sleep(0, result="from a helper thread"))

    assert asyncio.run(inside()) == "from a helper thread"


def test_describe_cluster_with_nothing_listening_is_one_line() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnreachable, match=f"no Kafka answers at {dead}") as caught:
        run_blocking(describe_cluster(dead, timeout=2.0))
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 3 and caught.value.retriable
    assert describe_exception(OSError("OSError: [Errno 111]\n refused")) == "OSError: [Errno 111] refused"
