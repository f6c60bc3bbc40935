"""TLS and SASL for every Kafka client, against the project's own broker with secured listeners.

One broker for the module (tests/integration/secure_broker.py: certificates made here with
``cryptography``, SCRAM users created by Kafka's StorageTool), started once. The matrix: SASL_SSL
with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; SSL with a client certificate (mTLS); SASL_PLAINTEXT
with SCRAM-SHA-256. Then every client over SASL_SSL/SCRAM-SHA-512 (worker, generator, simulator, GPU
collector, scrape bridge, OTLP receiver, producer helper, topic admin), and the refusals: a wrong
password, an untrusted certificate, a certificate for another host, a missing client certificate;
each is one line naming the listener and the mechanism, exit code 4, and no retry loop. And the readers
of the outputs: the corrections subscriber, `skewwatch tail`, the Alertmanager bridge.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from skewwatch.client import CorrectionsSubscriber
from skewwatch.client.request_producer import RequestEventProducer
from skewwatch.config import KafkaSettings, Settings
from skewwatch.kafka_client import client_kwargs, run_blocking
from skewwatch.kafka_security import client_options
from skewwatch.topics import ensure_topics
from tests.conftest import unique_settings
from tests.integration.commands import one_line_error
from tests.integration.secure_broker import USERS, SecureBroker
from tests.integration.test_alertmanager_bridge import Alertmanager, wait_for
from tests.integration.test_telemetry_publish import _Exposition
from tests.integration.worker_proc import WorkerProcess, consume_until, free_port, produce, settings_env
from tests.unit.test_otlp_decode import vllm_request

REPO = Path(__file__).resolve().parents[2]
MATRIX = [("SASL_SSL", "PLAIN"), ("SASL_SSL", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512"), ("SSL", "MTLS"),
          ("SASL_PLAIN", "SCRAM-SHA-256")]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    broker = SecureBroker(tmp_path_factory.mktemp("secure-kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("secrets")
    files = {"worker": directory / "worker.password", "wrong": directory / "wrong.password"}
    files["worker"].write_text(USERS["worker"] + "\n")
    files["wrong"].write_text("not-the-password\n")
    for path in files.values():
        path.chmod(0o600)
    return files


def secure_settings(kafka: KafkaSettings) -> Settings:
    """Unique topic names and group (as tests/conftest.py's), these security settings, topics created."""
    settings = unique_settings(kafka.bootstrap or "")
    settings.kafka = msgspec.structs.replace(kafka, group_id=settings.kafka.group_id,
                                             partitions=settings.kafka.partitions)
    run_blocking(ensure_topics(settings.kafka.bootstrap or "", settings))
    return settings


def command_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    return {**env, **settings_env(settings), **extra}


def skewwatch(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skewwatch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


@pytest.mark.parametrize(("listener", "mechanism"), MATRIX)
def test_every_listener_and_mechanism_connects(secure: SecureBroker, secrets: dict[str, Path], listener: str,
                                               mechanism: str) -> None:
    kafka = secure.kafka(mechanism, password_file=secrets["worker"], listener=listener)
    settings = unique_settings(kafka.bootstrap or "")
    settings.kafka = msgspec.structs.replace(kafka, group_id=settings.kafka.group_id, partitions=1)
    done = skewwatch("topics", "create", env=command_env(settings))  # the admin client, as a user runs it
    assert done.returncode == 0, done.stderr
    assert f"created  {settings.topics.requests} " in done.stdout
    options = client_options(settings.kafka)
    bootstrap, topic = settings.kafka.bootstrap or "", settings.topics.requests
    asyncio.run(produce(bootstrap, topic, [(b"r0", b"over " + mechanism.encode())], client_options=options))
    records = asyncio.run(consume_until(bootstrap, [topic], lambda rs: len(rs) >= 1, 30, client_options=options))
    assert [r.value for r in records] == [b"over " + mechanism.encode()]


def test_every_client_connects_over_sasl_ssl(secure: SecureBroker, secrets: dict[str, Path], tmp_path: Path) -> None:
    settings = secure_settings(secure.kafka("SCRAM-SHA-512", password_file=secrets["worker"]))
    bootstrap, topics = settings.kafka.bootstrap or "", settings.topics
    options = client_options(settings.kafka)
    env = command_env(settings)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)  # a DCGM exporter for the scrape bridge
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    receiver_port = free_port()
    receiver_log = (tmp_path / "receiver.log").open("wb")
    receiver = subprocess.Popen([sys.executable, "-m", "skewwatch", "otlp-receiver", "--port", str(receiver_port),
                                 "--model", "otlp-model"], env=env, cwd=REPO, stdout=receiver_log,
                                stderr=subprocess.STDOUT)
    try:
        start = float(int(time.time()))
        with WorkerProcess(settings, tmp_path / "worker.log"):  # ready: broker answers, both stages have partitions
            generated = skewwatch("generate", "--replicas", "2", "--rate", "5", "--duration", "30", "--speed", "max",
                                  "--models", "gen-model", "--start-ts", str(start), env=env)
            assert generated.returncode == 0, generated.stderr
            # after the generator's event time: its events would be late on partitions the generator moved on
            simulated = skewwatch("simulate", "--replicas", "2", "--duration", "20", "--speed", "max",
                                  "--models", "sim-model", "--start-ts", str(start + 40), env=env)
            assert simulated.returncode == 0, simulated.stderr
            collected = skewwatch("collect-gpu", "--simulate", "--node", "sec-node", "--interval", "0.1",
                                  "--rounds", "2", env=env)
            assert collected.returncode == 0, collected.stderr
            scraped = skewwatch("scrape", "--kind", "dcgm", "--rounds", "1", "--target",
                                f"http://127.0.0.1:{httpd.server_address[1]}/metrics", env=env)
            assert scraped.returncode == 0, scraped.stderr
            helper = RequestEventProducer(bootstrap, replica="helper-0", model="helper-model", topic=topics.requests,
                                          kafka=settings.kafka, linger_ms=0)
            helper.record(latency_ms=12.0, prompt_tokens=10, completion_tokens=5, batch_size=1, batch_capacity=8)
            helper.close()
            assert helper.sent_total == 1
            post_spans(receiver_port)
            features = asyncio.run(consume_until(
                bootstrap, [topics.features], lambda rs: {"gen-model", "sim-model"} <= models_of(rs), 90,
                client_options=options))
            assert {"gen-model", "sim-model"} <= models_of(features)  # the worker read and wrote over SASL_SSL
        requests = asyncio.run(consume_until(bootstrap, [topics.requests],
                                             lambda rs: {b"helper-0", b"vllm-7"} <= {r.key for r in rs}, 60,
                                             client_options=options))
        assert {b"helper-0", b"vllm-7"} <= {r.key for r in requests}  # the producer helper and the receiver
        telemetry = asyncio.run(consume_until(bootstrap, [topics.gpu_telemetry],
                                              lambda rs: {"simulated", "dcgm"} <= sources_of(rs), 30,
                                              client_options=options))
        assert {"simulated", "dcgm"} <= sources_of(telemetry)  # the collector and the bridge
    finally:
        receiver.terminate()
        receiver.wait(20)
        receiver_log.close()
        httpd.shutdown()
        httpd.server_close()
    assert receiver.returncode == 0, (tmp_path / "receiver.log").read_text()


def models_of(records: list[Any]) -> set[str]:
    return {orjson.loads(r.value).get("model") for r in records}


def sources_of(records: list[Any]) -> set[str]:
    return {orjson.loads(r.value).get("source") for r in records}


def post_spans(port: int) -> None:
    """Export 3 vLLM spans to the receiver, retrying its 503 until its producer has connected."""
    body = vllm_request(3, replica="vllm-7").SerializeToString()
    deadline = time.monotonic() + 60
    while True:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST",
                                         headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                assert answer.status == 200
                return
        except OSError:  # not listening yet, or 503 while Kafka is not yet connected
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_output_readers_connect_over_sasl_ssl(secure: SecureBroker, secrets: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """The corrections subscriber with the settings' client options, `skewwatch tail`, and the Alertmanager
    bridge (a Faust app: broker_credentials from the same settings)."""
    settings = secure_settings(secure.kafka("SCRAM-SHA-512", password_file=secrets["worker"]))
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
                              env=env, stdout=(tmp_path / "bridge.log").open("wb"), stderr=subprocess.STDOUT,
                              cwd=tmp_path)  # its Faust data directory: not the checkout
    try:
        def delivered() -> list[dict[str, Any]] | bool:
            return [a for a in am.alerts() if a["labels"].get("model") == "m"] or bridge.poll() is not None

        found = wait_for(delivered, "the alert over SASL_SSL", 90)
        assert bridge.poll() is None, (tmp_path / "bridge.log").read_text()
        assert found[0]["labels"]["detector"] == "gpu_health"
    finally:
        bridge.terminate()
        bridge.wait(timeout=30)
        am.stop()


# --------------------------------------------------------------------------------------------- refusals


def test_a_wrong_password_is_one_line_naming_the_listener_and_mechanism(secure: SecureBroker,
                                                                        secrets: dict[str, Path]) -> None:
    settings = unique_settings(secure.bootstrap("SASL_SSL"))
    settings.kafka = secure.kafka("SCRAM-SHA-512", password_file=secrets["wrong"])
    env = command_env(settings)
    line = one_line_error(skewwatch("topics", "create", env=env), 4, "SASL_SSL", "SCRAM-SHA-512",
                                 "refused the login")
    assert USERS["worker"] not in line and "not-the-password" not in line  # never a secret
    started = time.monotonic()
    worker = skewwatch("worker", "--web-port", str(free_port()), env=env, timeout=60)
    one_line_error(worker, 4, "SASL_SSL", "SCRAM-SHA-512")  # a service too: waiting would not help
    assert time.monotonic() - started < 30  # one attempt, no retry loop
    plain = secure.kafka("PLAIN", password_file=secrets["wrong"])
    settings.kafka = plain
    one_line_error(skewwatch("generate", "--duration", "5", env=command_env(settings)), 4, "SASL_SSL",
                          "PLAIN", "refused the login")


def test_an_untrusted_broker_certificate_is_one_line(secure: SecureBroker, secrets: dict[str, Path]) -> None:
    settings = unique_settings(secure.bootstrap("SASL_SSL"))
    settings.kafka = secure.kafka("SCRAM-SHA-256", password_file=secrets["worker"], cafile=secure.certs.other_ca)
    one_line_error(skewwatch("topics", "create", env=command_env(settings)), 4, "SASL_SSL", "SCRAM-SHA-256",
                          "certificate is not trusted")
    settings.kafka = secure.kafka("MTLS", cafile=secure.certs.other_ca)
    one_line_error(skewwatch("simulate", "--duration", "5", env=command_env(settings)), 4,
                          "(SSL, client certificate)", "not trusted")


def test_hostname_verification_is_on_by_default(secure: SecureBroker, secrets: dict[str, Path]) -> None:
    """The broker's certificate names localhost: dialled as 127.0.0.1 it is refused, unless told not to check."""
    settings = unique_settings(secure.bootstrap("SASL_SSL", host="127.0.0.1"))
    settings.kafka = secure.kafka("PLAIN", password_file=secrets["worker"])
    settings.kafka.bootstrap = secure.bootstrap("SASL_SSL", host="127.0.0.1")
    one_line_error(skewwatch("topics", "create", env=command_env(settings)), 4, "127.0.0.1", "SASL_SSL",
                          "not trusted")
    settings.kafka.ssl_check_hostname = False
    settings.kafka.partitions = 1
    done = skewwatch("topics", "create", env=command_env(settings))
    assert done.returncode == 0, done.stderr


def test_the_mtls_listener_refuses_clients_without_a_trusted_certificate(secure: SecureBroker) -> None:
    settings = unique_settings(secure.bootstrap("SSL"))
    settings.kafka = secure.kafka("MTLS")
    settings.kafka.ssl_certfile = settings.kafka.ssl_keyfile = None  # no client certificate
    one_line_error(skewwatch("topics", "create", env=command_env(settings)), 4, "SSL")
    settings.kafka = secure.kafka("MTLS")
    settings.kafka.ssl_certfile = str(secure.certs.stranger_cert)
    settings.kafka.ssl_keyfile = str(secure.certs.stranger_key)
    one_line_error(skewwatch("topics", "create", env=command_env(settings)), 4, "SSL")


def test_a_missing_password_is_a_config_error(secure: SecureBroker, tmp_path: Path) -> None:
    settings = unique_settings(secure.bootstrap("SASL_SSL"))
    settings.kafka = secure.kafka("SCRAM-SHA-256", password_file=tmp_path / "absent")
    one_line_error(skewwatch("topics", "create", env=command_env(settings)), 2,
                          "kafka.sasl_password_file")
    settings.kafka.sasl_password_file = None
    env = command_env(settings)
    env.pop("SKEWWATCH_KAFKA_PASSWORD", None)
    one_line_error(skewwatch("topics", "create", env=env), 2, "SKEWWATCH_KAFKA_PASSWORD")
    env["SKEWWATCH_KAFKA_PASSWORD"] = USERS["worker"]  # the environment is the other way to give it
    done = skewwatch("topics", "create", env=env)
    assert done.returncode == 0, done.stderr
