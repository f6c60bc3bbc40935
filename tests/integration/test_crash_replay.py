"""A worker killed long after its last checkpoint: the steps it replays publish no correction and no alert
a second time.

With ``limits.checkpoint_interval_s`` far above the run, a partition is checkpointed once (its first
close) and the new worker replays everything after it. Its per-replica and per-model feature vectors come
out again, keyed and identical; its corrections (one every step: a 5 s heartbeat) and the alert it opened
do not, so no ``seq`` goes backwards on the compacted corrections topic and nobody is paged twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.sim.faults import Injection
from skewwatch.sim.generator import GeneratorConfig
from tests.integration.live_traffic import LiveTraffic
from tests.integration.output_check import check_alerts, check_corrections, check_windows
from tests.integration.worker_proc import WorkerProcess, consume_until

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0
ENV = {"SKEWWATCH_DETECTORS__CORRECTIONS__HEARTBEAT_S": "5", "SKEWWATCH_LIMITS__CHECKPOINT_INTERVAL_S": "3600"}


def read(settings: Settings, correction_until: float) -> list[Any]:
    topics = settings.topics

    def done(records: list[Any]) -> bool:
        return any(r.topic == topics.routing_corrections and orjson.loads(r.value)["ts"] >= correction_until
                   for r in records)

    records = asyncio.run(consume_until(settings.kafka.bootstrap or "", [topics.features, topics.alerts,
                                                                          topics.routing_corrections], done, 90))
    assert done(records), f"no correction for {correction_until - T0:.0f} s"
    return records


def test_a_replay_after_a_crash_publishes_no_decision_twice(kafka_settings: Settings, tmp_path: Path) -> None:
    config = GeneratorConfig(models=("m",), replicas=4, rate=4.0, seed=3,
                             injections=(Injection("context_burst", "r1", at_s=40.0, for_s=600.0),))
    traffic = LiveTraffic(kafka_settings.kafka.bootstrap or "", kafka_settings.topics.requests,
                          kafka_settings.topics.gpu_telemetry, config, T0, speed=1.0)
    traffic.pause()
    traffic.start()
    worker = WorkerProcess(kafka_settings, tmp_path / "w1.log", ENV).start()
    try:
        traffic.burst(duration_s=90.0, factor=1.0)
        before = read(kafka_settings, T0 + 75)
        assert any(r.topic == kafka_settings.topics.alerts for r in before), "the burst alert did not open"
        worker.kill()  # its only checkpoints are of the first steps
        worker = WorkerProcess(kafka_settings, tmp_path / "w2.log", ENV).start()
        traffic.burst(duration_s=30.0, factor=1.0)
        records = read(kafka_settings, T0 + 105)
    finally:
        worker.stop()
        traffic.stop()
    topics = kafka_settings.topics
    corrections = check_corrections([(r.timestamp, orjson.loads(r.value)) for r in records
                                     if r.topic == topics.routing_corrections], heartbeat_s=5.0)
    alerts = check_alerts(orjson.loads(r.value) for r in records if r.topic == topics.alerts)
    windows = check_windows(({**orjson.loads(r.value), "key": r.key.decode()} for r in records
                             if r.topic == topics.features), traffic.ledger, {"m": 4}, until=T0 + 100)
    assert windows.problems() == [] and windows.counted > 0, windows.problems()
    assert windows.replayed > 0  # the replay did happen: its feature vectors came out again
    assert corrections.regressions == [] and corrections.republished == 0, (corrections.regressions,
                                                                           corrections.republished)
    assert corrections.max_gap_event_s == 5.0
    assert alerts.opens == 1 and alerts.republished == 0 and alerts.reopens == []
