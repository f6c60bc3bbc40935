"""Corrections that fail static, end to end on the real broker and a real worker.

A quiet pool: four healthy replicas at ~0.08 requests/s with 9 s requests, then the whole pool
silent for longer than its window (and than stage 1 keeps reporting a replica) while another
model keeps event time moving. No correction is all-zero, no serving replica is weighted 0, the
silent pool is still decided and says so (mode panic, why, a pool-level alert), and every alert
opened on it resolves. Then all traffic stops: the worker's idle clock lets alerts resolve and
corrections continue instead of freezing. The HTTP API shows and publishes seqs that go out.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from skewwatch.config import Settings
from tests.integration.worker_proc import WorkerProcess, consume_until, produce

pytestmark = pytest.mark.kafka

START = 1_700_000_000.0
QUIET = ("q0", "q1", "q2", "q3")
SERVE_S, SILENT_S = 900.0, 300.0


def _events(rng: random.Random, model: str, replicas: tuple[str, ...], rate: float, start: float, end: float,
            latency: Any) -> list[dict[str, Any]]:
    events = []
    for replica in replicas:
        t = start + rng.expovariate(rate)
        while t < end:
            events.append({"request_id": f"{replica}-{len(events)}", "ts": round(t, 3), "model": model,
                           "replica": replica, "latency_ms": latency(rng), "prompt_tokens": rng.randint(100, 3000),
                           "completion_tokens": rng.randint(50, 500)})
            t += rng.expovariate(rate)
    return events


def _send(settings: Settings, events: list[dict[str, Any]]) -> None:
    events.sort(key=lambda e: e["ts"])
    messages = [(e["replica"].encode(), orjson.dumps(e)) for e in events]
    asyncio.run(produce(settings.kafka.bootstrap or "", settings.topics.requests, messages))


def _read(settings: Settings, done: Any, timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    topics = settings.topics
    records = asyncio.run(consume_until(settings.kafka.bootstrap or "", [topics.alerts, topics.routing_corrections],
                                        done, timeout))
    alerts = [orjson.loads(r.value) for r in records if r.topic == topics.alerts]
    corrections = [orjson.loads(r.value) for r in records if r.topic == topics.routing_corrections]
    return alerts, corrections


def test_a_quiet_pool_fails_static_and_the_api_publishes_what_it_shows(kafka_settings: Settings,
                                                                       tmp_path: Path) -> None:
    rng = random.Random(14)
    quiet_until = START + SERVE_S
    end = quiet_until + SILENT_S
    events = _events(rng, "quiet", QUIET, 0.08, START, quiet_until, lambda r: r.uniform(7000.0, 11000.0))
    events += _events(rng, "busy", ("b0", "b1"), 2.0, START, end, lambda r: r.uniform(200.0, 400.0))
    topics = kafka_settings.topics
    with WorkerProcess(kafka_settings, tmp_path / "worker.log", cwd=tmp_path / "worker") as worker:
        _send(kafka_settings, events)

        def done(records: list[Any]) -> bool:
            return any(r.topic == topics.routing_corrections and orjson.loads(r.value)["model"] == "quiet"
                       and orjson.loads(r.value)["ts"] >= end - 40 for r in records)

        alerts, corrections = _read(kafka_settings, done, 240)
        shown = worker.get("/api/v1/weights")["models"]
        posted = worker.post("/api/v1/update_weights")["published"]
        _, after_post = _read(kafka_settings, lambda records: any(
            r.topic == topics.routing_corrections and orjson.loads(r.value)["seq"] == posted.get("quiet")
            for r in records), 60)
    quiet = [c for c in corrections if c["model"] == "quiet"]
    assert quiet and quiet[-1]["ts"] >= end - 40, worker.log_tail()
    # never all-zero, never a serving replica at 0
    assert all(sum(c["weights"].values()) == pytest.approx(1.0) for c in quiet)
    serving = [c for c in quiet if START + 120 <= c["ts"] <= quiet_until]
    assert serving and all(w > 0 for c in serving for w in c["weights"].values())
    assert all(c["mode"] == "normal" for c in serving)
    # the silent pool is still decided long after stage 1 stopped reporting its replicas, and says so
    silent = [c for c in quiet if c["ts"] > quiet_until + 150]
    assert silent and all(set(c["weights"]) == set(QUIET) and min(c["weights"].values()) > 0 for c in silent)
    assert silent[-1]["mode"] == "panic" and "the whole pool is silent" in silent[-1]["mode_reason"]
    pool = [(a["detector"], a["evidence"]["rule"], a["severity"], a["state"])
            for a in alerts if a["model"] == "quiet" and a["replica"] is None]
    assert ("fail_static", "pool_silent", "WARNING", "open") in pool
    # every replica alert opened on the quiet pool has resolved
    state: dict[tuple[str, str, str], str] = {}
    for a in alerts:
        if a["model"] == "quiet" and a["replica"] is not None:
            state[(a["replica"], a["detector"], str(a["evidence"].get("rule")))] = a["state"]
    assert all(s == "resolved" for s in state.values()), state
    # GET shows a published record; POST publishes the latest step with its own seq, not last + 1
    published = {c["seq"] for c in corrections + after_post if c["model"] == "quiet"}
    assert shown["quiet"]["seq"] in published
    assert posted["quiet"] in {c["seq"] for c in after_post if c["model"] == "quiet"}
    assert posted["quiet"] % 5000 == 0 and posted["quiet"] >= shown["quiet"]["seq"]


def test_when_all_traffic_stops_alerts_resolve_and_corrections_go_on(kafka_settings: Settings,
                                                                      tmp_path: Path) -> None:
    rng = random.Random(3)
    end = START + 240.0
    # r0 has a tail no detector can miss: 30 % of its requests 10x slower than the rest
    events = _events(rng, "m", ("r0",), 10.0, START, end,
                     lambda r: r.uniform(1000.0, 1200.0) if r.random() < 0.3 else r.uniform(90.0, 110.0))
    events += _events(rng, "m", ("r1", "r2", "r3"), 10.0, START, end, lambda r: r.uniform(90.0, 110.0))
    topics = kafka_settings.topics
    extra = {"SKEWWATCH_DETECTORS__DECIDER__IDLE_ADVANCE_S": "5"}
    with WorkerProcess(kafka_settings, tmp_path / "worker.log", extra, cwd=tmp_path / "worker"):
        _send(kafka_settings, events)
        opened = _read(kafka_settings, lambda records: any(
            r.topic == topics.alerts and orjson.loads(r.value)["replica"] == "r0"
            and orjson.loads(r.value)["state"] == "open" for r in records), 120)[0]
        assert opened, "no alert opened on r0"
        started = time.monotonic()

        def resolved(records: list[Any]) -> bool:
            return any(r.topic == topics.alerts and orjson.loads(r.value)["replica"] == "r0"
                       and orjson.loads(r.value)["state"] == "resolved" for r in records) and any(
                r.topic == topics.routing_corrections and orjson.loads(r.value)["mode"] == "panic" for r in records)

        alerts, corrections = _read(kafka_settings, resolved, 150)
    waited = time.monotonic() - started
    r0 = [a for a in alerts if a["replica"] == "r0" and a["state"] == "resolved"]
    assert r0 and all("no evidence" in a["message"] for a in r0), (r0, waited)
    # event time went on past the last request, at the wall clock's pace
    assert max(c["ts"] for c in corrections) > end
    assert corrections[-1]["mode"] == "panic" and "silent" in corrections[-1]["mode_reason"]
    assert all(sum(c["weights"].values()) == pytest.approx(1.0) for c in corrections)
