"""Every long-running command stops within a few seconds of SIGTERM, with exit code 0, whatever its peer is
doing: its peer down (Alertmanager, HAProxy's runtime API, Kafka, a scrape target) or answering.

Real processes and a real broker (the session's); the peers that are down are ports where nothing listens.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.kafka_client import run_blocking
from tests.integration.worker_proc import free_port, produce, settings_env

pytestmark = pytest.mark.kafka
STOP_WITHIN_S = 10.0  # Kubernetes' default grace period is 30 s; a healthy stop takes one or two
NOWHERE = f"127.0.0.1:{free_port()}"  # nothing listens here


class FakeRuntimeApi:
    """HAProxy's runtime API as far as the bridge needs it: every command answered with nothing (done)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: HAProxy went away
                return
            with conn:
                conn.recv(4096)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def runtime_api() -> Iterator[FakeRuntimeApi]:
    api = FakeRuntimeApi()
    yield api
    api.close()


def start(args: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "skewwatch", *args], env=env, cwd=cwd,
                            stdout=log_path.open("wb"), stderr=subprocess.STDOUT)


def wait_for_text(proc: subprocess.Popen[bytes], log_path: Path, text: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_path.read_text(errors="replace"):
        assert proc.poll() is None, f"exited with {proc.returncode}: {log_path.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout:.0f} s: {log_path.read_text()[-3000:]}"
        time.sleep(0.2)


def stop_with_sigterm(proc: subprocess.Popen[bytes], log_path: Path) -> float:
    """SIGTERM, then the seconds until the process exited (with code 0)."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {STOP_WITHIN_S:.0f} s after SIGTERM: {log_path.read_text()[-3000:]}")
    took = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    assert proc.returncode == 0, (proc.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    return took


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP" and not k.startswith("SKEWWATCH_")}
    return {**env, **settings_env(settings), **extra}


def alert(state: str = "open") -> bytes:
    return orjson.dumps({"ts": time.time(), "model": "llama", "replica": "r1", "detector": "long_tail",
                         "severity": "WARNING", "state": state, "message": "P99/P50 = 4.2 on r1",
                         "evidence": {"p99_p50": 4.2}})


async def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0}


def test_the_alertmanager_bridge_stops_on_sigterm_while_alertmanager_does_not_answer(
        kafka_settings: Settings, tmp_path: Path) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.alerts
    asyncio.run(produce(bootstrap, topic, [(b"llama/r1", alert())]))
    group = f"skewwatch-am-stop-{uuid.uuid4().hex[:8]}"
    log_path = tmp_path / "bridge.log"
    bridge = start(["alertmanager-bridge", "--url", "http://127.0.0.1:1", "--group-id", group, "--log-format", "json"],
                   env_for(kafka_settings), log_path, tmp_path)
    try:
        wait_for_text(bridge, log_path, "does not answer")  # the POST is being retried with back-off
        time.sleep(3)  # a retry or two later: the agent sleeps in its back-off
    finally:
        took = stop_with_sigterm(bridge, log_path)
    assert took < STOP_WITHIN_S
    assert_json_lines(log_path, "skewwatch alertmanager-bridge")
    # the alert it could not deliver is not committed: the next start sends it
    assert all(offset == 0 for offset in run_blocking(committed_offsets(bootstrap, group, topic)).values())


def test_apply_haproxy_stops_on_sigterm_with_haproxy_up_and_down(kafka_settings: Settings, tmp_path: Path,
                                                                 runtime_api: FakeRuntimeApi) -> None:
    backend_map = tmp_path / "map.toml"
    backend_map.write_text('[models."llama"]\nbackend = "llama"\n')
    log_path = tmp_path / "apply.log"
    bridge = start(["apply", "haproxy", "--admin", runtime_api.address, "--backend-map", str(backend_map),
                    "--resync-s", "1", "--log-format", "json"], env_for(kafka_settings), log_path, tmp_path)
    try:
        wait_for_text(bridge, log_path, "caught up on")
        runtime_api.close()  # HAProxy goes away: the bridge retries at every tick
        time.sleep(2)
    finally:
        stop_with_sigterm(bridge, log_path)
    assert_json_lines(log_path, "caught up on")


def assert_json_lines(log_path: Path, first: str) -> None:
    """--log-format json: every line of the log is one JSON object (Faust's and aiokafka's too)."""
    records = [orjson.loads(line) for line in log_path.read_text().splitlines()]
    assert records and all({"ts", "level", "logger", "message"} <= record.keys() for record in records)
    assert any(first in record["message"] for record in records)


def test_tail_follow_stops_on_sigterm(kafka_settings: Settings, tmp_path: Path) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.alerts
    asyncio.run(produce(bootstrap, topic, [(b"llama/r1", alert())]))
    log_path = tmp_path / "tail.log"
    tail = start(["tail", "alerts", "--follow", "--json"], env_for(kafka_settings), log_path, tmp_path)
    try:
        wait_for_text(tail, log_path, '"state":"open"')
    finally:
        stop_with_sigterm(tail, log_path)


@pytest.mark.parametrize(("args", "ready"), [
    (["worker", "--web-port", "0"], "skewwatch worker"),
    (["otlp-receiver", "--port", "0"], "skewwatch otlp-receiver"),
    (["collect-gpu", "--simulate", "--interval", "0.5"], "skewwatch collect-gpu"),
], ids=["worker", "otlp-receiver", "collect-gpu"])
def test_a_service_without_kafka_stops_on_sigterm(args: list[str], ready: str, tmp_path: Path) -> None:
    settings = Settings()
    settings.kafka.bootstrap = NOWHERE
    log_path = tmp_path / "service.log"
    service = start(args, env_for(settings), log_path, tmp_path)
    try:
        wait_for_text(service, log_path, ready)
        time.sleep(3)  # waiting for its broker, with back-off
    finally:
        stop_with_sigterm(service, log_path)


def test_scrape_without_its_target_stops_on_sigterm(kafka_settings: Settings, tmp_path: Path) -> None:
    log_path = tmp_path / "scrape.log"
    scrape = start(["scrape", "--kind", "dcgm", "--target", "http://127.0.0.1:1/metrics", "--interval", "0.5"],
                   env_for(kafka_settings), log_path, tmp_path)
    try:
        wait_for_text(scrape, log_path, "scrape failed")
    finally:
        stop_with_sigterm(scrape, log_path)


def test_generate_stops_on_sigterm(kafka_settings: Settings, tmp_path: Path) -> None:
    log_path = tmp_path / "generate.log"
    generate = start(["generate", "--duration", "600", "--rate", "20"], env_for(kafka_settings), log_path, tmp_path)
    try:
        time.sleep(6)  # producing, paced by event time
    finally:
        stop_with_sigterm(generate, log_path)
    assert "generated events=" in log_path.read_text()
