"""The broker goes away under load and comes back: the worker tells the truth, stays quiet, loses nothing.

A broker of this module's own (the session's is shared), stopped while a producer helper sends a
steady stream of request events and the worker windows them. While it is gone: ``/readyz`` fails
within 15 s, ``POST /api/v1/update_weights`` answers 503 within 2 s, and the worker writes a bounded
number of log lines (one per distinct error per 30 s; before, an outage of 100 s wrote 26,121 lines).
Once it is back: ready again, the recovery logged once, and every 60 s window closed over the whole
run, before, during and after the outage, counts exactly the events the producer recorded in it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from skewwatch.broker import EmbeddedBroker
from skewwatch.client.request_producer import RequestEventProducer
from skewwatch.kafka_client import run_blocking
from skewwatch.topics import ensure_topics
from tests.conftest import unique_settings
from tests.integration.worker_proc import WorkerProcess, consume_until

RATE = 100.0  # events per second, one replica (one producer: its events reach the worker in order)
OUTAGE_S = 15.0


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(tmp_path_factory.mktemp("outage-kafka"), port=0, heap="384m")
    broker.start(timeout=120)
    try:
        yield broker
    finally:
        broker.stop()


class Load:
    """Records RATE events a second through the producer helper until stopped; keeps every ts it recorded."""

    def __init__(self, producer: RequestEventProducer) -> None:
        self.producer = producer
        self.recorded: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            ts = time.time()
            self.producer.record(latency_ms=100.0 + len(self.recorded) % 50, prompt_tokens=100,
                                 completion_tokens=20, batch_size=4, batch_capacity=16, ts=ts)
            self.recorded.append(ts)
            self._stop.wait(1.0 / RATE)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def status_of(url: str, method: str = "GET", token: str | None = None) -> tuple[int, float]:
    """HTTP status and how long the answer took."""
    started = time.monotonic()
    request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, time.monotonic() - started


def log_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()


def test_a_broker_outage_under_load(own_broker: EmbeddedBroker, tmp_path: Path) -> None:
    settings = unique_settings(own_broker.bootstrap, partitions=1)
    run_blocking(ensure_topics(own_broker.bootstrap, settings))
    log = tmp_path / "worker.log"
    worker = WorkerProcess(settings, log).start()
    base = f"http://127.0.0.1:{worker.port}"
    producer = RequestEventProducer(own_broker.bootstrap, replica="r0", model="m", topic=settings.topics.requests,
                                    max_buffer=50_000, linger_ms=100)
    try:
        with Load(producer) as load:
            time.sleep(8)  # the worker windows a steady stream
            quiet_before = len(log_lines(log))
            own_broker.stop()
            stopped = time.monotonic()
            while status_of(base + "/readyz")[0] != 503:
                assert time.monotonic() - stopped < 15, "/readyz still ready 15 s into the outage"
                time.sleep(0.5)
            status, took = status_of(base + "/api/v1/update_weights", "POST", worker.token)
            assert status == 503 and took < 2.0
            time.sleep(max(OUTAGE_S - (time.monotonic() - stopped), 0))
            during = log_lines(log)[quiet_before:]
            assert len(during) <= 40, "\n".join(during)  # one line per distinct error per 30 s
            own_broker.start(timeout=120)  # same port, same data
            back = time.monotonic()
            while status_of(base + "/readyz")[0] != 200:
                assert time.monotonic() - back < 90, worker.log_tail()
                time.sleep(0.5)
            time.sleep(5)  # load after the recovery too
        last = max(load.recorded)
        for offset in (70.0, 71.0):  # close every window that holds a recorded event
            producer.record(latency_ms=1.0, prompt_tokens=1, completion_tokens=1, batch_size=1, batch_capacity=16,
                            ts=last + offset)
        assert producer.flush(timeout_s=60)
        assert producer.dropped_total == 0
        recorded = sorted(load.recorded)
        first_full = (int(recorded[0] // 5) + 13) * 5.0  # the first window end with 60 s of the stream behind it
        ends = [first_full + 5 * k for k in range(int((last - first_full) // 5) + 1)]
        features = asyncio.run(consume_until(
            own_broker.bootstrap, [settings.topics.features],
            lambda rs: {e for e in ends} <= {orjson.loads(r.value)["window_end"] for r in rs if r.key == b"m"},
            120))
        counts: dict[float, set[int]] = {}
        for record in features:
            if record.key == b"m":
                vector = orjson.loads(record.value)
                counts.setdefault(vector["window_end"], set()).add(vector["count"])
        for end in ends:
            exact = sum(1 for ts in recorded if end - 60 <= ts < end)
            assert counts.get(end) == {exact}, (end, counts.get(end), exact)  # replays are identical duplicates
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert "skewwatch_late_events_total 0.0" in metrics
        lines = log_lines(log)
        assert sum("is reachable again" in line for line in lines) == 1  # the recovery, logged once
        assert sum("is unreachable" in line for line in lines) == 1
        assert not any("Traceback" in line for line in lines)
    finally:
        producer.close(timeout_s=5)
        worker.stop()
