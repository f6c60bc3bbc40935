"""The readers of skewwatch's outputs over SASL_SSL (SCRAM-SHA-512), against the project's secured broker
(tests/integration/secure_broker.py): the corrections subscriber with the settings' client options,
`skewwatch tail` and the Alertmanager bridge (a Faust app: broker_credentials from the same settings)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import orjson
import pytest

from skewwatch.client import CorrectionsSubscriber
from skewwatch.config import Settings
from skewwatch.kafka_client import client_kwargs, run_blocking
from skewwatch.kafka_security import client_options
from skewwatch.topics import ensure_topics
from tests.conftest import unique_settings
from tests.integration.secure_broker import USERS, SecureBroker
from tests.integration.test_alertmanager_bridge import Alertmanager, wait_for
from tests.integration.test_kafka_security import command_env
from tests.integration.worker_proc import produce


@pytest.fixture(scope="module")
def secure_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    directory = tmp_path_factory.mktemp("secure-readers")
    broker = SecureBroker(directory / "kafka")
    broker.start()
    password = directory / "worker.password"
    password.write_text(USERS["worker"] + "\n")
    password.chmod(0o600)
    try:
        kafka = broker.kafka("SCRAM-SHA-512", password_file=password)
        settings = unique_settings(kafka.bootstrap or "")
        settings.kafka = msgspec.structs.replace(kafka, group_id=settings.kafka.group_id,
                                                 partitions=settings.kafka.partitions)
        run_blocking(ensure_topics(settings.kafka.bootstrap or "", settings))
        yield settings
    finally:
        broker.stop()


def test_readers_over_sasl_ssl(secure_settings: Settings, tmp_path: Path) -> None:
    settings = secure_settings
    bootstrap, topics = settings.kafka.bootstrap or "", settings.topics
    options = client_options(settings.kafka)
    correction = {"model": "m", "ts": 60.0, "seq": 60000, "weights": {"r1": 0.8, "r2": 0.2}, "actions": []}
    alert = {"ts": time.time(), "model": "m", "replica": "r1", "detector": "gpu_health", "severity": "CRITICAL",
             "state": "open", "message": "XID 79", "evidence": {"xid": 79}}
    asyncio.run(produce(bootstrap, topics.routing_corrections, [(b"m", orjson.dumps(correction))],
                        client_options=options))
    asyncio.run(produce(bootstrap, topics.alerts, [(b"m/r1", orjson.dumps(alert))], client_options=options))

    async def subscribe() -> dict[str, float]:
        async with CorrectionsSubscriber(bootstrap, topics.routing_corrections,
                                         client_kwargs=client_kwargs(settings.kafka)) as corrections:
            await corrections.wait_caught_up(timeout=30)
            return corrections.weights("m")

    assert asyncio.run(subscribe()) == {"r1": 0.8, "r2": 0.2}

    env = command_env(settings)
    done = subprocess.run([sys.executable, "-m", "skewwatch", "tail", "alerts"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [orjson.loads(line)["message"] for line in done.stdout.splitlines()] == ["XID 79"]

    am = Alertmanager(tmp_path)
    am.start()
    bridge = subprocess.Popen([sys.executable, "-m", "skewwatch", "alertmanager-bridge", "--url", am.url,
                               "--group-id", f"skewwatch-am-secure-{uuid.uuid4().hex[:8]}"],
                              env=env, stdout=(tmp_path / "bridge.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        found = wait_for(lambda: ours_m(am.alerts()) or bridge.poll() is not None, "the alert over SASL_SSL", 90)
        assert bridge.poll() is None, (tmp_path / "bridge.log").read_text()
        assert found[0]["labels"]["detector"] == "gpu_health"
    finally:
        bridge.terminate()
        bridge.wait(timeout=30)
        am.stop()


def ours_m(alerts: list[dict[str, object]]) -> list[dict[str, object]]:
    return [a for a in alerts if a["labels"].get("model") == "m"]  # type: ignore[attr-defined]

