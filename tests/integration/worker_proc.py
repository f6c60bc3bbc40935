"""Test helpers: run `skewwatch worker` as a real child process and read topics back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from skewwatch.config import KafkaSettings, Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a worker use exactly these settings."""
    env = {"SKEWWATCH_KAFKA__BOOTSTRAP": settings.kafka.bootstrap or "",
           "SKEWWATCH_KAFKA__GROUP_ID": settings.kafka.group_id,
           "SKEWWATCH_KAFKA__PARTITIONS": str(settings.kafka.partitions)}
    defaults = KafkaSettings()
    for field in msgspec.structs.fields(settings.kafka):  # TLS / SASL settings, where the test set them
        value = getattr(settings.kafka, field.name)
        if field.name.startswith(("security_", "sasl_", "ssl_")) and value != getattr(defaults, field.name):
            env[f"SKEWWATCH_KAFKA__{field.name.upper()}"] = str(value)
    for field in msgspec.structs.fields(settings.topics):
        env[f"SKEWWATCH_TOPICS__{field.name.upper()}"] = getattr(settings.topics, field.name)
    for section in ("window", "limits"):
        obj = getattr(settings, section)
        for field in msgspec.structs.fields(obj):
            env[f"SKEWWATCH_{section.upper()}__{field.name.upper()}"] = str(getattr(obj, field.name))
    return env


class WorkerProcess:
    """``skewwatch worker`` as a child process with exactly ``settings`` (tests and benchmarks)."""

    def __init__(self, settings: Settings, log_path: Path, extra_env: dict[str, str] | None = None, *,
                 cwd: Path | None = None, loglevel: str = "info", args: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.port = free_port()
        self.log_path = log_path
        # its own directory (Faust's data directory is relative to it): none left in the checkout
        self.cwd = cwd if cwd is not None else log_path.parent
        self.loglevel = loglevel
        self.args = args
        self.token = f"test-token-{os.getpid()}-{self.port}"  # the API's bearer token (POST needs one)
        self.env = {**os.environ, **settings_env(settings), "SKEWWATCH_WEB_TOKEN": self.token, **(extra_env or {})}
        self.env.pop("KAFKA_BOOTSTRAP", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        """Start the worker and wait until it is healthy (partitions assigned)."""
        self.launch()
        return self.wait_healthy(timeout)

    def launch(self) -> WorkerProcess:
        """Start the worker process; :meth:`wait_healthy` waits for it."""
        if self.cwd is not None:
            self.cwd.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "skewwatch", "worker", "--web-port", str(self.port),
                 "--loglevel", self.loglevel, *self.args],
                cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> WorkerProcess:
        """Until ``/readyz`` answers 200; the worker is stopped and AssertionError raised if it exits
        or ``timeout`` passes first."""
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                # readiness, not liveness: the broker answers and both stages have their partitions
                with urllib.request.urlopen(self._request("/readyz"), timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"worker not ready after {timeout}s:\n{self.log_tail()}")

    def _request(self, path: str, body: bytes | None = None, method: str = "GET") -> urllib.request.Request:
        """With the bearer token: a worker bound beyond loopback wants it for every path but /healthz."""
        return urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body, method=method,
                                      headers={"Authorization": f"Bearer {self.token}"})

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self._request(path), timeout=5) as r:
            body = r.read()
        return body if path == "/metrics" else orjson.loads(body)

    def post(self, path: str, body: bytes = b"") -> Any:
        with urllib.request.urlopen(self._request(path, body, "POST"), timeout=10) as r:
            return orjson.loads(r.read())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes]],
                  client_options: dict[str, Any] | None = None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2, max_request_size=8 << 20,
                                **(client_options or {}))
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, key=key, value=value)
        await producer.flush()
    finally:
        await producer.stop()


async def consume_until(bootstrap: str, topics: list[str], done: Callable[[list[Any]], bool],
                        timeout: float, client_options: dict[str, Any] | None = None) -> list[Any]:
    """Read `topics` from the beginning until `done(records)` holds or `timeout` passes."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None, **(client_options or {}))
    await consumer.start()
    records: list[Any] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                records.extend(messages)
            if done(records):
                break
    finally:
        await consumer.stop()
    return records
