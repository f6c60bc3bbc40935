"""Three workers in one consumer group on the real broker: losing one, adding one, a rolling restart and
a burst, with live traffic flowing the whole time.

One set of three ``skewwatch worker`` processes serves the module (topics of 12 partitions, 24 replicas
over 2 models, one replica with a context burst so that an alert is open across the failures): the
tests run in order on it, each checking everything published so far (tests/integration/output_check.py):
every per-replica and per-model 60 s count equals what the broker acknowledged from the producer, no
per-model vector merges fewer than its model's replicas, no correction ``seq`` goes backwards on the
topic, no alert opens twice for one episode, and during the rolling restart no model goes longer than
the heartbeat without a correction.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.kafka_client import run_blocking
from skewwatch.sim.faults import Injection
from skewwatch.sim.generator import GeneratorConfig
from skewwatch.topics import delete_topics, ensure_topics
from tests.conftest import topic_names, unique_settings
from tests.integration.live_traffic import LiveTraffic
from tests.integration.output_check import (
    check_alerts,
    check_corrections,
    check_windows,
    longest_pause,
    split_outputs,
)
from tests.integration.worker_group import ResourceSampler, WorkerGroup
from tests.integration.worker_proc import consume_until

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0  # a multiple of the 5 s step
PARTITIONS = 12
MODELS = ("llama", "qwen")
REPLICAS_PER_MODEL = 12
SPEED = 3.0  # event seconds per wall second: a 60 s window passes in 20 s
HEARTBEAT_S = 30.0  # [detectors.corrections] heartbeat_s, the default
LATENESS_S = 5.0
# one replica's prompts burst from 40 s on for 4 minutes of event time: a context_burst alert is open
# across the kill, the replacement and most of the rolling restart
FAULTY = "r5"
FAULT = Injection("context_burst", FAULTY, at_s=40.0, for_s=240.0)


@dataclass
class Fleet:
    settings: Settings
    workers: WorkerGroup
    traffic: LiveTraffic
    sampler: ResourceSampler


@pytest.fixture(scope="module")
def fleet(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    settings = unique_settings(kafka_bootstrap, partitions=PARTITIONS)
    run_blocking(ensure_topics(kafka_bootstrap, settings))
    config = GeneratorConfig(models=MODELS, replicas=REPLICAS_PER_MODEL, rate=4.0, seed=16, injections=(FAULT,))
    workers = WorkerGroup(settings, tmp_path_factory.mktemp("fleet"), size=3)
    traffic = LiveTraffic(kafka_bootstrap, settings.topics.requests, settings.topics.gpu_telemetry, config, T0,
                          speed=SPEED)
    sampler = ResourceSampler(workers.pids)
    try:
        workers.start()
        traffic.start()
        sampler.start()
        yield Fleet(settings, workers, traffic, sampler)
    finally:
        sampler.stop()
        traffic.stop()
        workers.stop()
        try:
            if not os.environ.get("SKEWWATCH_TEST_KEEP_TOPICS"):
                run_blocking(delete_topics(kafka_bootstrap, topic_names(settings)))
        except Exception as exc:  # noqa: BLE001 - cleanup of a shared broker is not the test's outcome
            print(f"could not delete test topics: {exc}")


def closed_until(fleet: Fleet) -> float:
    """The newest window end every partition has surely closed by now (the traffic's event time,
    less the allowed lateness and one step)."""
    return (fleet.traffic.event_time - LATENESS_S) // 5.0 * 5.0 - 5.0


def read_outputs(fleet: Fleet, until: float, timeout: float = 90.0) -> dict[str, list[Any]]:
    """Every record of the output topics so far, once every replica and model has a feature vector for
    ``until``."""
    topics = fleet.settings.topics
    want = {f"{m}/{r}" for r, m in fleet.traffic.models.items()} | set(MODELS)
    have: set[str] = set()
    looked = [0]  # records already looked at

    def done(records: list[Any]) -> bool:
        for r in records[looked[0]:]:
            if r.topic == topics.features and orjson.loads(r.value)["window_end"] == until:
                have.add(r.key.decode())
        looked[0] = len(records)
        return have >= want

    records = asyncio.run(consume_until(fleet.settings.kafka.bootstrap or "",
                                        [topics.features, topics.alerts, topics.routing_corrections], done, timeout))
    assert have >= want, (f"no feature vector for {until} from {sorted(want - have)[:5]} after {timeout:.0f} s\n"
                          + fleet.workers.log_tails())
    return split_outputs(records, topics.features, topics.alerts)


def assert_outputs_match(fleet: Fleet, outputs: dict[str, list[Any]], until: float) -> None:
    windows = check_windows(outputs["features"], fleet.traffic.ledger,
                            dict.fromkeys(MODELS, REPLICAS_PER_MODEL), until=until)
    assert windows.windows > 0 and windows.counted > 0
    assert windows.problems() == [], "\n".join(windows.problems())
    assert (windows.lost, windows.duplicated) == (0, 0)
    corrections = check_corrections(outputs["corrections"], HEARTBEAT_S)
    assert corrections.regressions == [], corrections.regressions
    alerts = check_alerts(outputs["alerts"])
    assert alerts.reopens == [], alerts.reopens
    print(f"windows {windows.windows} (replayed {windows.replayed}), events counted {windows.counted}, "
          f"corrections {corrections.records} (republished {corrections.republished}), alerts opened "
          f"{alerts.opens} (republished {alerts.republished})")


def test_a_killed_worker_and_its_replacement_lose_and_double_nothing(fleet: Fleet) -> None:
    traffic, workers = fleet.traffic, fleet.workers
    traffic.wait_event_time(T0 + 75, timeout=60)  # the burst alert is open by now
    workers.kill(0)
    # the survivors take its partitions over once the group notices (the consumer's session timeout)
    traffic.wait_event_time(traffic.event_time + 15 * SPEED, timeout=60)
    workers.replace(0)
    traffic.wait_event_time(traffic.event_time + 10 * SPEED, timeout=60)
    until = closed_until(fleet)
    outputs = read_outputs(fleet, until)
    assert_outputs_match(fleet, outputs, until)
    opened = [a for a in outputs["alerts"] if a["replica"] == FAULTY and a["state"] == "open"]
    assert opened and opened[0]["detector"] == "context_burst", outputs["alerts"]


def test_a_rolling_restart_keeps_corrections_flowing(fleet: Fleet) -> None:
    traffic, workers = fleet.traffic, fleet.workers
    since = time.time()
    for index in range(len(workers.workers)):
        workers.terminate(index)
        workers.replace(index)
    traffic.wait_event_time(traffic.event_time + 10 * SPEED, timeout=60)
    until = closed_until(fleet)
    outputs = read_outputs(fleet, until)
    assert_outputs_match(fleet, outputs, until)
    corrections = check_corrections(outputs["corrections"], HEARTBEAT_S, wall_since=since)
    assert corrections.gaps == [], corrections.gaps  # every model's heartbeat came, step by step
    pause, where = longest_pause(outputs["features"], since_ms=int(since * 1000))
    print(f"rolling restart: longest gap between corrections {corrections.max_gap_event_s:.0f} s of event "
          f"time, {corrections.max_gap_wall_s:.1f} s of wall time; the per-model outputs paused at most "
          f"{pause:.1f} s (before {where})")
    assert pause < HEARTBEAT_S  # restarting the workers one by one never stops the decisions for a heartbeat


def test_a_burst_drains_with_bounded_memory(fleet: Fleet) -> None:
    traffic, workers = fleet.traffic, fleet.workers
    before = workers.metrics()
    started = time.monotonic()
    events, encode_s, send_s = traffic.burst(duration_s=30.0, factor=10.0)
    until = closed_until(fleet)
    outputs = read_outputs(fleet, until)
    drained = time.monotonic() - started
    after = workers.metrics()
    assert_outputs_match(fleet, outputs, until)
    peak = fleet.sampler.peak_between(started, time.monotonic())
    held = after.get("skewwatch_telemetry_held", 0.0)
    print(f"burst: {events} events (encoded in {encode_s:.1f} s, sent in {send_s:.1f} s) drained in "
          f"{drained:.1f} s; peak worker RSS {peak / 2**20:.0f} MiB; telemetry held {held:.0f}; "
          f"events in {after.get('skewwatch_events_in_total', 0) - before.get('skewwatch_events_in_total', 0):.0f}")
    assert peak < 500 * 2**20  # the worker's memory target at 10k replicas; this is 24
