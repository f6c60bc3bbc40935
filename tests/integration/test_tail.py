"""`skewwatch tail` on the real broker: JSON lines into a pipe, a table on a terminal, filters, --since."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import time

import orjson
import pytest

from skewwatch.config import Settings
from tests.integration.worker_proc import produce, settings_env

pytestmark = pytest.mark.kafka


def alert(model: str, replica: str | None, state: str, severity: str = "WARNING") -> dict[str, object]:
    return {"ts": time.time(), "model": model, "replica": replica, "detector": "long_tail", "severity": severity,
            "state": state, "message": f"P99/P50 high on {replica}", "evidence": {"ratio": 4.2}}


def run_tail(settings: Settings, *args: str, tty: bool = False, timeout: float = 60) -> tuple[int, str]:
    env = {**os.environ, **settings_env(settings), "COLUMNS": "200"}
    env.pop("KAFKA_BOOTSTRAP", None)
    cmd = [sys.executable, "-m", "skewwatch", "tail", *args]
    if not tty:
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, text=True)
        return done.returncode, done.stdout + done.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, env=env, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=timeout), b"".join(chunks).decode(errors="replace")



def test_tail_alerts_json_lines_table_and_filters(kafka_settings: Settings) -> None:
    bootstrap = kafka_settings.kafka.bootstrap or ""
    records = [alert("m", "r1", "open", "CRITICAL"), alert("m", "r2", "open"), alert("other", "x1", "open"),
               alert("m", "r1", "resolved", "CRITICAL")]
    asyncio.run(produce(bootstrap, kafka_settings.topics.alerts,
                        [(f"{r['model']}/{r['replica']}".encode(), orjson.dumps(r)) for r in records]))

    code, out = run_tail(kafka_settings, "alerts", "--model", "m", "--replica", "r1")
    assert code == 0, out
    lines = [orjson.loads(line) for line in out.splitlines()]  # a pipe: JSON lines, exactly the records
    assert [(a["replica"], a["state"]) for a in lines] == [("r1", "open"), ("r1", "resolved")]

    code, out = run_tail(kafka_settings, "alerts", "--model", "m", tty=True)
    assert code == 0, out
    assert "severity" in out and "detector" in out  # the table's header
    assert "CRITICAL" in out and "resolved" in out and "P99/P50 high on r2" in out
    assert "other" not in out and "{" not in out  # a table, not JSON

    code, out = run_tail(kafka_settings, "alerts", "--since", "10 minutes")
    assert code != 0 and "not a duration" in out


def test_tail_follow_prints_new_records(kafka_settings: Settings) -> None:
    bootstrap = kafka_settings.kafka.bootstrap or ""
    correction = {"model": "m", "ts": 60.0, "seq": 60000, "weights": {"r1": 0.6, "r2": 0.4}, "actions": []}
    asyncio.run(produce(bootstrap, kafka_settings.topics.routing_corrections, [(b"m", orjson.dumps(correction))]))
    env = {**os.environ, **settings_env(kafka_settings)}
    env.pop("KAFKA_BOOTSTRAP", None)
    proc = subprocess.Popen([sys.executable, "-m", "skewwatch", "tail", "corrections", "--follow"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = orjson.loads(proc.stdout.readline())
        assert first["seq"] == 60000
        newer = {**correction, "seq": 65000, "weights": {"r1": 0.1, "r2": 0.9}}
        asyncio.run(produce(bootstrap, kafka_settings.topics.routing_corrections, [(b"m", orjson.dumps(newer))]))
        assert orjson.loads(proc.stdout.readline())["seq"] == 65000
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_tail_since_skips_older_records(kafka_settings: Settings) -> None:
    bootstrap = kafka_settings.kafka.bootstrap or ""
    asyncio.run(produce(bootstrap, kafka_settings.topics.alerts, [(b"m/r1", orjson.dumps(alert("m", "r1", "open")))]))
    time.sleep(2.5)
    asyncio.run(produce(bootstrap, kafka_settings.topics.alerts, [(b"m/r9", orjson.dumps(alert("m", "r9", "open")))]))
    code, out = run_tail(kafka_settings, "alerts", "--since", "2s")
    assert code == 0, out
    assert [orjson.loads(line)["replica"] for line in out.splitlines()] == ["r9"]


def test_tail_without_kafka_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "skewwatch", "tail", "alerts", "--bootstrap", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3  # KafkaUnreachable, as for `topics create`
    assert done.stderr.startswith("Error: no Kafka answers at 127.0.0.1:1")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_tail_dead_letter_shows_the_rejected_input_and_why(kafka_settings: Settings) -> None:
    from skewwatch.schemas.dead_letter import dead_letter_record
    from skewwatch.schemas.rejection import Rejection

    bootstrap = kafka_settings.kafka.bootstrap or ""
    bad = b'{"events": [{"latency_ms": -3}]}'
    records = [dead_letter_record(source_topic=kafka_settings.topics.requests, partition=1, offset=41, key=key,
                                  value=bad, rejects=[Rejection("out_of_range", "latency_ms: must be >= 0, got -3",
                                                                event_index=0)], ts=time.time())
               for key in (b"r1", b"r2")]
    asyncio.run(produce(bootstrap, kafka_settings.topics.dead_letter, [(b"r1", records[0]), (b"r2", records[1])]))

    code, out = run_tail(kafka_settings, "dead-letter", "--replica", "r1")
    assert code == 0, out
    lines = [orjson.loads(line) for line in out.splitlines()]  # a pipe: the records as they are
    assert len(lines) == 1 and lines[0]["rejects"][0]["reason_code"] == "out_of_range"

    code, out = run_tail(kafka_settings, "dead-letter", tty=True)
    assert code == 0, out
    assert "first reason" in out and f"{kafka_settings.topics.requests}/1@41" in out
    assert "out_of_range 1" in out and "latency_ms: must be >= 0, got -3" in out and "r2" in out
