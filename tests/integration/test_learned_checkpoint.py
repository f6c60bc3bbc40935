"""The learned detector's state is checkpointed with its partition: after a kill -9 the restarted worker
scores exactly as a worker that never stopped (real broker, real worker processes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.topics import ensure_topics
from tests.integration.test_worker import T0, as_messages, wait_for_windows
from tests.integration.worker_proc import WorkerProcess, consume_until, produce

pytestmark = pytest.mark.kafka

REPLICAS = ["a0", "a1", "a2", "a3"]
SLOW = "a2"
FAULT_AT = 200.0  # s after T0: the slow replica's TTFT x4 from here
END = 280.0
KILL_AFTER = 150.0  # the first worker is killed once it has published this step (warm by then)
# a short warm-up so the test stays short: every step is a sample, 20 of them before anything holds,
# and the alert opens on the second holding sample
LEARNED_ENV = {
    "SKEWWATCH_DETECTORS__LEARNED__CADENCE_STEPS": "1",
    "SKEWWATCH_DETECTORS__LEARNED__PERSISTENCE": "2",
    "SKEWWATCH_DETECTORS__LEARNED__WARMUP": "20",
    "SKEWWATCH_DETECTORS__LEARNED__GRACE": "20",
    "SKEWWATCH_DETECTORS__LEARNED__MEMORY": "120",
}


def trace(seed: int = 5) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    events: list[dict[str, Any]] = []
    for replica in REPLICAS:
        n = int(rng.poisson(8.0 * END))
        ts = np.sort(rng.uniform(T0, T0 + END, n))
        for i in range(n):
            tokens = int(rng.integers(50, 400))
            ttft = float(rng.lognormal(np.log(150.0), 0.3))
            if replica == SLOW and ts[i] >= T0 + FAULT_AT:
                ttft *= 4.0
            events.append({"request_id": f"{replica}-{i}", "ts": float(ts[i]), "model": "m", "replica": replica,
                           "latency_ms": ttft + 20.0 * tokens, "ttft_ms": ttft,
                           "prompt_tokens": int(rng.integers(100, 3000)), "completion_tokens": tokens,
                           "batch_size": 8, "batch_capacity": 32})
    ahead = [{"request_id": f"ahead-{r}", "ts": T0 + END + 30.0, "model": "m", "replica": r, "latency_ms": 1.0,
              "prompt_tokens": 1, "completion_tokens": 1, "batch_size": 1, "batch_capacity": 32} for r in REPLICAS]
    return sorted(events, key=lambda e: e["ts"]) + ahead


def learned_alerts(settings: Settings, timeout: float = 120.0) -> list[dict[str, Any]]:
    """The learned detector's alerts, once the slow replica's has opened (duplicates of replayed steps
    removed: a restarted worker publishes again the steps after its checkpoint)."""
    def opened(records: list[Any]) -> bool:
        return any(a["detector"] == "learned" and a["replica"] == SLOW and a["state"] == "open"
                   for a in (orjson.loads(r.value) for r in records))
    records = asyncio.run(consume_until(settings.kafka.bootstrap or "", [settings.topics.alerts], opened, timeout))
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        alert = orjson.loads(r.value)
        if alert["detector"] == "learned":
            seen[orjson.dumps(alert).decode()] = alert
    return sorted(seen.values(), key=lambda a: (a["ts"], a["replica"], a["state"]))


def fresh(settings: Settings, suffix: str) -> Settings:
    topics = msgspec.structs.replace(settings.topics, **{
        f.name: f"{getattr(settings.topics, f.name)}.{suffix}" for f in msgspec.structs.fields(settings.topics)})
    kafka = msgspec.structs.replace(settings.kafka, group_id=f"{settings.kafka.group_id}.{suffix}")
    out = msgspec.structs.replace(settings, topics=topics, kafka=kafka)
    asyncio.run(ensure_topics(out.kafka.bootstrap or "", out))
    return out


def test_scores_are_the_same_after_a_kill_9(kafka_settings: Settings, tmp_path: Path) -> None:
    events = trace()
    messages = as_messages(events, 1)

    # the reference: one worker that never stops
    straight = fresh(kafka_settings, "straight")
    with WorkerProcess(straight, tmp_path / "straight.log", LEARNED_ENV):
        asyncio.run(produce(straight.kafka.bootstrap or "", straight.topics.requests, messages))
        expected = learned_alerts(straight)
    slow = [a for a in expected if a["replica"] == SLOW]
    assert slow[0]["state"] == "open" and slow[0]["evidence"]["feature"] == "ttft_per_prompt_token"
    assert T0 + FAULT_AT <= slow[0]["ts"] <= T0 + FAULT_AT + 30.0
    assert all(a["ts"] > T0 + KILL_AFTER + 10.0 for a in expected)  # none before the kill: all to compare

    # the same traffic, the worker killed (SIGKILL) once warm, the rest produced while it is down
    killed = fresh(kafka_settings, "killed")
    bootstrap = killed.kafka.bootstrap or ""
    cut = next(i for i, e in enumerate(events) if e["ts"] >= T0 + KILL_AFTER + 10.0)
    first = WorkerProcess(killed, tmp_path / "first.log", LEARNED_ENV).start()
    try:
        asyncio.run(produce(bootstrap, killed.topics.requests, as_messages(events[:cut], 1)))
        wait_for_windows(killed, [(f"m/{r}", T0 + KILL_AFTER) for r in REPLICAS])
        time.sleep(7.0)  # past limits.checkpoint_interval_s (5 s): a checkpoint with the learned state
    finally:
        first.kill()
    asyncio.run(produce(bootstrap, killed.topics.requests, as_messages(events[cut:], 1)))
    with WorkerProcess(killed, tmp_path / "second.log", LEARNED_ENV):
        after = learned_alerts(killed)
    # the restarted worker went on from the checkpoint: without the scorers' state it would be warming
    # up again and open nothing, or open with other scores
    assert after == expected
