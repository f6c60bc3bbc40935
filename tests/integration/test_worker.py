"""The worker end to end on the real broker: events in, feature vectors / dead letters out."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest

from skewwatch.config import Settings
from skewwatch.topics import ensure_topics
from tests.integration.worker_proc import WorkerProcess, consume_until, produce

pytestmark = pytest.mark.kafka

T0 = 1_700_000_000.0  # a multiple of 5 s: steps end at T0 + 5k


def make_events(seed: int, replicas: list[str], start: float, duration: float, rate: float,
                model: str = "m") -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    events: list[dict[str, Any]] = []
    for replica in replicas:
        n = int(rng.poisson(rate * duration))
        ts = np.sort(rng.uniform(start, start + duration, n))
        latency = rng.lognormal(np.log(400), 0.6, n)
        capacity = 32
        batch = rng.integers(1, capacity + 1, n)
        for i in range(n):
            events.append({
                "request_id": f"{replica}-{seed}-{i}", "ts": float(ts[i]), "model": model, "replica": replica,
                "latency_ms": float(latency[i]), "ttft_ms": float(latency[i] / 5),
                "prompt_tokens": int(rng.integers(10, 4000)), "completion_tokens": int(rng.integers(1, 500)),
                "batch_size": int(batch[i]), "batch_capacity": capacity,
            })
    events.sort(key=lambda e: e["ts"])
    return events


def advance_events(replicas: list[str], ts: float, model: str = "m") -> list[dict[str, Any]]:
    """One event per replica far enough ahead to close every step up to ``ts - lateness``."""
    return [{"request_id": f"adv-{r}-{ts}", "ts": ts, "model": model, "replica": r, "latency_ms": 1.0,
             "prompt_tokens": 1, "completion_tokens": 1, "batch_size": 1, "batch_capacity": 32}
            for r in replicas]


def as_messages(events: list[dict[str, Any]], batch: int) -> list[tuple[bytes | None, bytes]]:
    """Kafka messages keyed by replica, in event-time order as a real producer sends them: with
    ``batch > 1``, each run of consecutive events is grouped per replica into ``{"events": [...]}``."""
    events = sorted(events, key=lambda e: e["ts"])
    if batch == 1:
        return [(e["replica"].encode(), orjson.dumps(e)) for e in events]
    n_replicas = len({e["replica"] for e in events})
    out: list[tuple[bytes | None, bytes]] = []
    run = batch * n_replicas
    for i in range(0, len(events), run):
        by_replica: dict[str, list[dict[str, Any]]] = {}
        for e in events[i:i + run]:
            by_replica.setdefault(e["replica"], []).append(e)
        out.extend((r.encode(), orjson.dumps({"events": evs})) for r, evs in by_replica.items())
    return out


def features_by_key(records: list[Any]) -> dict[tuple[str, float], dict[str, Any]]:
    out = {}
    for r in records:
        fv = orjson.loads(r.value)
        out[(r.key.decode(), fv["window_end"])] = fv
    return out


def wait_for_windows(settings: Settings, keys: list[tuple[str, float]], timeout: float = 90) -> dict[Any, Any]:
    def done(records: list[Any]) -> bool:
        have = {(r.key.decode(), orjson.loads(r.value)["window_end"]) for r in records}
        return all(k in have for k in keys)
    records = asyncio.run(consume_until(settings.kafka.bootstrap or "", [settings.topics.features], done, timeout))
    return features_by_key(records)


@pytest.fixture
def worker(kafka_settings: Settings, tmp_path: Path):
    proc = WorkerProcess(kafka_settings, tmp_path / "worker.log").start()
    yield proc
    proc.stop()


def test_features_match_what_was_produced(kafka_settings: Settings, worker: WorkerProcess) -> None:
    replicas = ["r0", "r1", "r2"]
    events = make_events(1, replicas, T0, 60.0, rate=8.0)
    asyncio.run(produce(kafka_settings.kafka.bootstrap or "", kafka_settings.topics.requests,
                        as_messages(events, batch=25) + as_messages(advance_events(replicas, T0 + 80), 1)))
    end = T0 + 60
    got = wait_for_windows(kafka_settings, [(f"m/{r}", end) for r in replicas] + [("m", end)])
    for replica in [*replicas, None]:
        mine = [e for e in events if replica is None or e["replica"] == replica]
        fv = got[("m" if replica is None else f"m/{replica}", end)]
        latency = np.array([e["latency_ms"] for e in mine])
        assert fv["count"] == len(mine)
        for q in (0.5, 0.95, 0.99):
            exact = float(np.quantile(latency, q, method="lower"))
            assert fv[f"latency_p{int(q * 100)}"] == pytest.approx(exact, rel=0.01)
        assert fv["batch_fill_mean"] == pytest.approx(np.mean([e["batch_size"] / 32 for e in mine]), rel=1e-9)
        assert fv["prompt_tokens_var"] == pytest.approx(np.var([e["prompt_tokens"] for e in mine]), rel=1e-6)
        assert fv["rps"] == pytest.approx(len(mine) / 60.0)
    metrics = worker.get("/metrics").decode()
    assert "skewwatch_events_in_total" in metrics


def test_bad_messages_go_to_dead_letter_and_good_ones_count(kafka_settings: Settings,
                                                            worker: WorkerProcess) -> None:
    good = make_events(2, ["r0"], T0, 20.0, rate=5.0)
    bad_event = dict(good[0], request_id="bad", latency_ms=-3)
    over = dict(good[0], request_id="over", batch_size=40)
    mixed = orjson.dumps({"events": [*good[:5], bad_event, over]})
    messages: list[tuple[bytes | None, bytes]] = [
        (b"r0", mixed), (b"r0", b"{not json"), (b"r0", orjson.dumps({"v": 99, "events": good[5:6]})),
        (b"r0", b"x" * (1024 * 1024 + 10)),
    ] + as_messages(good[6:], 1) + as_messages(advance_events(["r0"], T0 + 40), 1)
    asyncio.run(produce(kafka_settings.kafka.bootstrap or "", kafka_settings.topics.requests, messages))
    dead = asyncio.run(consume_until(kafka_settings.kafka.bootstrap or "", [kafka_settings.topics.dead_letter],
                                     lambda rs: len(rs) >= 4, 60))
    records = [orjson.loads(r.value) for r in dead]
    reasons = sorted(x["reason_code"] for rec in records for x in rec["rejects"])
    assert reasons == sorted(["out_of_range", "batch_over_capacity", "malformed_json", "unsupported_version",
                              "too_large"])
    assert base64.b64decode(records[0]["value_b64"]) == mixed  # the original bytes, untouched
    assert any("latency_ms" in x["reason"] and "-3" in x["reason"] for rec in records for x in rec["rejects"])
    got = wait_for_windows(kafka_settings, [("m/r0", T0 + 20)])
    # 5 good events of the mixed message + the single ones; the version-99 message is rejected whole
    assert got[("m/r0", T0 + 20)]["count"] == 5 + len(good[6:])
    metrics = worker.get("/metrics").decode()
    assert 'skewwatch_rejected_total{reason="malformed_json"} 1.0' in metrics
    # the log says so at once, with the counts by reason, and then at most once per 30 s
    lines = [line for line in worker.log_path.read_text().splitlines() if "inputs rejected" in line]
    assert len(lines) == 1, lines
    assert " WARNING skewwatch.worker.rejects: stage1: 2 inputs rejected (batch_over_capacity 1, out_of_range 1)" \
        in lines[0] and f"on {kafka_settings.topics.dead_letter}" in lines[0] and "tail dead-letter" in lines[0]


def test_a_hand_off_record_of_another_format_goes_to_dead_letter(kafka_settings: Settings,
                                                                worker: WorkerProcess) -> None:
    """A record on the internal topic that an older worker wrote (another hand-off format, e.g. during
    an upgrade) is refused when stage 2 reads it: on the dead-letter topic with its bytes, counted, and
    the model's steps go on."""
    from aiokafka import AIOKafkaProducer

    from skewwatch.pipeline.replica_step_record import step_header

    bootstrap = kafka_settings.kafka.bootstrap or ""
    older = b"\x00\x00\x00\x0b" + orjson.dumps({"v": 2, "model": "m"})[:11] + b"\x01\x02"

    async def send_older() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(kafka_settings.topics.replica_steps, key=b"m", value=older,
                                         headers=step_header(T0 + 5, 0, 1))
        finally:
            await producer.stop()

    asyncio.run(send_older())
    replicas = ["r0", "r1"]
    events = make_events(4, replicas, T0, 30.0, rate=5.0)
    asyncio.run(produce(bootstrap, kafka_settings.topics.requests,
                        as_messages(events, 1) + as_messages(advance_events(replicas, T0 + 50), 1)))
    dead = asyncio.run(consume_until(bootstrap, [kafka_settings.topics.dead_letter], lambda rs: len(rs) >= 1, 60))
    [record] = [orjson.loads(r.value) for r in dead]
    assert record["source_topic"] == kafka_settings.topics.replica_steps
    assert [x["reason_code"] for x in record["rejects"]] == ["unsupported_version"]
    assert "hand-off format 3" in record["rejects"][0]["reason"]
    assert base64.b64decode(record["value_b64"]) == older
    got = wait_for_windows(kafka_settings, [("m", T0 + 30)])  # stage 2 goes on
    assert got[("m", T0 + 30)]["count"] == len(events) and got[("m", T0 + 30)]["replicas"] == 2
    assert 'skewwatch_rejected_total{reason="unsupported_version"} 1.0' in worker.get("/metrics").decode()


def test_replay_speed_does_not_change_features(kafka_settings: Settings, tmp_path: Path) -> None:
    """Event time: the same trace produced at 1x and at 10x pace gives identical features."""
    replicas = ["a", "b"]
    events = make_events(3, replicas, T0, 15.0, rate=6.0) + advance_events(replicas, T0 + 30)
    results = []
    for speed, suffix in ((1.0, "x1"), (10.0, "x10")):
        settings = msgspec.structs.replace(
            kafka_settings,
            topics=msgspec.structs.replace(kafka_settings.topics, **{
                f.name: f"{getattr(kafka_settings.topics, f.name)}.{suffix}"
                for f in msgspec.structs.fields(kafka_settings.topics)}),
            kafka=msgspec.structs.replace(kafka_settings.kafka, group_id=f"{kafka_settings.kafka.group_id}.{suffix}"),
        )
        asyncio.run(ensure_topics(settings.kafka.bootstrap or "", settings))
        proc = WorkerProcess(settings, tmp_path / f"worker-{suffix}.log").start()
        try:
            asyncio.run(_paced_produce(settings, events, speed))
            keys = [(f"m/{r}", T0 + e) for r in replicas for e in (5.0, 10.0, 15.0, 20.0)]
            got = wait_for_windows(settings, keys)
            results.append({k: v for k, v in got.items() if k in keys})
        finally:
            proc.stop()
    # identical up to float rounding: batch boundaries change the order of the moment merges
    assert results[0].keys() == results[1].keys()
    for key, fv in results[0].items():
        other = results[1][key]
        for name, value in fv.items():
            if isinstance(value, float):
                assert other[name] == pytest.approx(value, rel=1e-9), (key, name)
            else:
                assert other[name] == value, (key, name)
    assert sum(v["count"] for k, v in results[0].items() if k[1] == T0 + 15) == len(events) - len(replicas)


async def _paced_produce(settings: Settings, events: list[dict[str, Any]], speed: float) -> None:
    from aiokafka import AIOKafkaProducer
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap, acks="all")
    await producer.start()
    try:
        wall0, ev0 = time.monotonic(), events[0]["ts"]
        for e in sorted(events, key=lambda e: e["ts"]):
            delay = (e["ts"] - ev0) / speed - (time.monotonic() - wall0)
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send(settings.topics.requests, key=e["replica"].encode(), value=orjson.dumps(e))
        await producer.flush()
    finally:
        await producer.stop()


def test_killed_worker_loses_no_window_state(kafka_settings: Settings, tmp_path: Path) -> None:
    replicas = ["k0", "k1", "k2", "k3"]
    events = make_events(4, replicas, T0, 60.0, rate=10.0)
    first, second = events[: len(events) // 2], events[len(events) // 2:]
    bootstrap = kafka_settings.kafka.bootstrap or ""
    proc = WorkerProcess(kafka_settings, tmp_path / "w1.log").start()
    asyncio.run(produce(bootstrap, kafka_settings.topics.requests, as_messages(first, 1)))
    # wait until the worker has closed at least one step (a checkpoint exists), then kill -9
    wait_for_windows(kafka_settings, [(f"m/{replicas[0]}", T0 + 10)])
    time.sleep(1.0)
    proc.kill()
    asyncio.run(produce(bootstrap, kafka_settings.topics.requests,
                        as_messages(second, 1) + as_messages(advance_events(replicas, T0 + 80), 1)))
    proc2 = WorkerProcess(kafka_settings, tmp_path / "w2.log").start()
    try:
        got = wait_for_windows(kafka_settings, [(f"m/{r}", T0 + 60) for r in replicas] + [("m", T0 + 60)])
        for r in replicas:
            assert got[(f"m/{r}", T0 + 60)]["count"] == sum(1 for e in events if e["replica"] == r)
        assert got[("m", T0 + 60)]["count"] == len(events)
    finally:
        proc2.stop()


def test_web_port_0_picks_a_free_port_and_says_which(kafka_settings: Settings, tmp_path: Path) -> None:
    """``--web-port 0``: no traceback; the worker prints where its HTTP API listens, and answers there."""
    import re
    import subprocess
    import sys
    import urllib.request

    from tests.integration.worker_proc import settings_env

    log_path = tmp_path / "worker.log"
    env = {**WorkerProcess(kafka_settings, log_path).env, **settings_env(kafka_settings)}
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "skewwatch", "worker", "--web-port", "0"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline, port = time.monotonic() + 90, None
        while time.monotonic() < deadline and proc.poll() is None:
            text = log_path.read_text(errors="replace")
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)  # the start line
            if found:
                port = int(found.group(1))
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
            time.sleep(0.3)
        else:
            raise AssertionError(f"worker exited or never became healthy:\n{log_path.read_text()}")
        assert port is not None and port != 0
        assert "Traceback" not in log_path.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
