"""The Alertmanager bridge (a Faust agent on llm.alerts) against a real Alertmanager built from its Go module:
an alert opened on the topic appears in Alertmanager's API with its labels and annotations, stays active
while the bridge re-sends it, survives an Alertmanager that was not up yet (retries), and resolving it
ends it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from skewwatch.config import Settings
from tests.integration.worker_proc import free_port, produce, settings_env
from tests.tools import tool

pytestmark = pytest.mark.kafka


class Alertmanager:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "am.yml").write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(tool("alertmanager")), f"--config.file={self.workdir / 'am.yml'}",
             f"--storage.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--cluster.listen-address="],
            stdout=(self.workdir / "am.log").open("wb"), stderr=subprocess.STDOUT)
        wait_for(self.ready, "Alertmanager to start", 30)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as r:
            return list(json.load(r))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def ours(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if a["labels"].get("model") == "llama"]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    am = Alertmanager(tmp_path)
    yield am
    am.stop()



def test_alert_opened_on_the_topic_appears_in_alertmanager_and_resolving_ends_it(
        kafka_settings: Settings, alertmanager: Alertmanager, tmp_path: Path) -> None:
    bootstrap, topic = kafka_settings.kafka.bootstrap or "", kafka_settings.topics.alerts
    env = {**os.environ, **settings_env(kafka_settings)}
    env.pop("KAFKA_BOOTSTRAP", None)
    log_path = tmp_path / "bridge.log"
    bridge = subprocess.Popen(
        [sys.executable, "-m", "skewwatch", "alertmanager-bridge", "--url", alertmanager.url, "--resend-s", "2",
         "--group-id", f"skewwatch-am-test-{uuid.uuid4().hex[:8]}"],
        env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
        cwd=tmp_path)  # its Faust data directory goes there, not into the checkout
    try:
        opened = {"ts": time.time() - 30, "model": "llama", "replica": "r1", "detector": "long_tail",
                  "severity": "WARNING", "state": "open", "message": "P99/P50 = 4.2 on r1",
                  "evidence": {"p99_p50": 4.2, "p99_ms": 8400.0}}
        asyncio.run(produce(bootstrap, topic, [(b"llama/r1", orjson.dumps(opened))]))
        # the bridge meets no Alertmanager yet: it retries with backoff (and says so), then delivers
        wait_for(lambda: "does not answer" in log_path.read_text() or bridge.poll() is not None,
                 "the bridge to retry", 60)
        assert bridge.poll() is None, log_path.read_text()
        alertmanager.start()
        found = wait_for(lambda: ours(alertmanager.alerts()), "the alert in Alertmanager", 90)
        assert len(found) == 1
        alert = found[0]
        assert alert["labels"] == {"alertname": "SkewwatchLongTail", "source": "skewwatch", "model": "llama",
                                   "replica": "r1", "detector": "long_tail", "severity": "warning"}
        assert alert["annotations"]["summary"] == "P99/P50 = 4.2 on r1"
        assert alert["annotations"]["evidence_p99_p50"] == "4.2"
        assert alert["status"]["state"] == "active"
        first_end = datetime.fromisoformat(alert["endsAt"]).timestamp()
        assert abs(datetime.fromisoformat(alert["startsAt"]).timestamp() - opened["ts"]) < 1

        # re-sent while open: still active after its first endsAt (now + 4 x 2 s) has passed
        time.sleep(max(0.0, first_end - time.time()) + 2)
        again = ours(alertmanager.alerts())
        assert again and again[0]["status"]["state"] == "active"
        assert datetime.fromisoformat(again[0]["endsAt"]).timestamp() > first_end

        resolved = {**opened, "ts": time.time(), "state": "resolved", "message": "P99/P50 back to 1.4"}
        asyncio.run(produce(bootstrap, topic, [(b"llama/r1", orjson.dumps(resolved))]))
        wait_for(lambda: not ours(alertmanager.alerts()), "resolving to end the alert", 60)
        time.sleep(5)  # and the re-send timer does not bring it back
        assert not ours(alertmanager.alerts())
    finally:
        bridge.terminate()
        try:
            bridge.wait(timeout=30)
        except subprocess.TimeoutExpired:
            bridge.kill()
    log_text = log_path.read_text()
    assert "Traceback" not in log_text, log_text


def test_bridge_without_kafka_or_topic_is_one_line(kafka_bootstrap: str) -> None:
    for args, message, code in ((["--bootstrap", f"127.0.0.1:{free_port()}"], "Error: no Kafka answers at", 3),
                                (["--bootstrap", kafka_bootstrap], "Error: topic llm.alerts.none does not exist", 2)):
        done = subprocess.run([sys.executable, "-m", "skewwatch", "alertmanager-bridge", *args],
                              env={**os.environ, "SKEWWATCH_TOPICS__ALERTS": "llm.alerts.none"},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == code, done.stderr
        assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1, done.stderr
