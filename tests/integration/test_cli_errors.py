"""Every command's expected failures: one line on stderr, no traceback, no "Unclosed ...", the documented
exit code (skewwatch/errors.py); and a service without its broker waits instead of exiting.

Real processes throughout: the commands run as a user runs them, the ports are really taken, the
locked data directory is the one of the session's running broker.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest

from skewwatch.broker import EmbeddedBroker
from skewwatch.config import Settings
from skewwatch.errors import (
    AddressInUse,
    ChildFailed,
    ConfigProblem,
    DataDirLocked,
    KafkaUnreachable,
    NothingSent,
    PeerUnreachable,
)
from skewwatch.ports import free_port
from tests.integration.commands import one_line_error, wait_listening
from tests.integration.test_telemetry_publish import _Exposition
from tests.integration.worker_proc import WorkerProcess

REPO = Path(__file__).resolve().parents[2]
NOWHERE = f"127.0.0.1:{free_port()}"  # nothing listens here


def env_without_kafka(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP" and not k.startswith("SKEWWATCH_")}
    return {**env, **extra}


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skewwatch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env if env is not None else env_without_kafka(), cwd=REPO)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.fixture
def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text('[window]\nstep_s = "five"\n')
    return path


# ------------------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize("command", [["worker"], ["otlp-receiver"], ["topics", "create"], ["generate"],
                                     ["collect-gpu", "--simulate"], ["scrape", "--kind", "dcgm", "--target", "x"]])
def test_a_bad_setting_is_one_line_and_exit_2(command: list[str], bad_config: Path) -> None:
    done = run(*command, "--config", str(bad_config), "--bootstrap", NOWHERE)
    one_line_error(done, ConfigProblem.exit_code, "window.step_s")


def test_a_bad_kafka_security_setting_is_one_line_and_exit_2() -> None:
    env = env_without_kafka(SKEWWATCH_KAFKA__SECURITY_PROTOCOL="TLS")
    one_line_error(run("worker", "--bootstrap", NOWHERE, env=env), 2, "kafka.security_protocol", "SASL_SSL")


# ------------------------------------------------------------------------------------------ ports


def test_the_worker_on_a_busy_port_is_one_line_and_exit_5(busy_port: int) -> None:
    done = run("worker", "--bootstrap", NOWHERE, "--web-port", str(busy_port))
    one_line_error(done, AddressInUse.exit_code, f"127.0.0.1:{busy_port}", "already in use")


def test_the_receiver_on_a_busy_port_is_one_line_and_exit_5(busy_port: int) -> None:
    done = run("otlp-receiver", "--bootstrap", NOWHERE, "--port", str(busy_port))
    one_line_error(done, AddressInUse.exit_code, f"127.0.0.1:{busy_port}", "already in use")


# ------------------------------------------------------------------------------------------ the broker


@pytest.mark.parametrize("command", [
    ["topics", "create"],
    ["generate", "--duration", "5"],
    ["simulate", "--duration", "5"],
])
def test_one_shot_commands_without_kafka_are_one_line_and_exit_3(command: list[str]) -> None:
    started = time.monotonic()
    one_line_error(run(*command, "--bootstrap", NOWHERE), KafkaUnreachable.exit_code, NOWHERE, "no Kafka answers")
    assert time.monotonic() - started < 30


@pytest.fixture
def backend_map(tmp_path: Path) -> Path:
    path = tmp_path / "backends.toml"
    path.write_text('[models."m"]\nbackend = "b"\n')
    return path


READERS = [["tail", "alerts"], ["apply", "haproxy", "--admin", "127.0.0.1:1", "--backend-map", "{map}"],
           ["alertmanager-bridge", "--url", "http://127.0.0.1:1"]]
READER_IDS = ["tail", "apply-haproxy", "alertmanager-bridge"]


def reader_args(command: list[str], backend_map: Path) -> list[str]:
    return [arg.format(map=backend_map) for arg in command]


@pytest.mark.parametrize("command", READERS, ids=READER_IDS)
def test_readers_without_kafka_are_one_line_and_exit_3(command: list[str], backend_map: Path) -> None:
    done = run(*reader_args(command, backend_map), "--bootstrap", NOWHERE)
    one_line_error(done, KafkaUnreachable.exit_code, NOWHERE, "no Kafka answers")


@pytest.mark.parametrize("command", READERS, ids=READER_IDS)
def test_readers_without_a_bootstrap_are_one_line_and_exit_2(command: list[str], backend_map: Path) -> None:
    one_line_error(run(*reader_args(command, backend_map)), ConfigProblem.exit_code, "no Kafka", "--bootstrap")


@pytest.mark.parametrize("command", [*READERS, ["topics", "create"]], ids=[*READER_IDS, "topics-create"])
def test_a_malformed_bootstrap_is_refused_alike_by_every_command(command: list[str], backend_map: Path) -> None:
    done = run(*reader_args(command, backend_map), "--bootstrap", "localhost")
    one_line_error(done, ConfigProblem.exit_code, "kafka.bootstrap", "host:port", "'localhost'")


def test_apply_haproxy_without_haproxy_is_exit_3(backend_map: Path, kafka_bootstrap: str) -> None:
    done = run("apply", "haproxy", "--admin", "127.0.0.1:1", "--backend-map", str(backend_map),
               "--bootstrap", kafka_bootstrap)
    one_line_error(done, PeerUnreachable.exit_code, "HAProxy runtime API at 127.0.0.1:1", "does not answer")


def test_apply_haproxy_with_a_missing_backend_map_is_exit_2(tmp_path: Path) -> None:
    done = run("apply", "haproxy", "--admin", "127.0.0.1:1", "--backend-map", str(tmp_path / "none.toml"),
               "--bootstrap", NOWHERE)
    one_line_error(done, ConfigProblem.exit_code, "none.toml", "does not exist")


def test_tail_of_a_missing_topic_is_exit_2(kafka_bootstrap: str) -> None:
    done = run("tail", "alerts", "--bootstrap", kafka_bootstrap,
               env=env_without_kafka(SKEWWATCH_TOPICS__ALERTS="llm.alerts.none"))
    one_line_error(done, ConfigProblem.exit_code, "topic llm.alerts.none does not exist")


def test_a_second_broker_on_a_locked_data_directory_names_the_lock(embedded_broker: EmbeddedBroker | None) -> None:
    if embedded_broker is None:
        pytest.skip("KAFKA_BOOTSTRAP points at another cluster: no local data directory")
    done = run("broker", "--data-dir", str(embedded_broker.data_dir), "--port", str(free_port()), "--no-topics")
    one_line_error(done, DataDirLocked.exit_code, str(embedded_broker.kafka_data_dir / ".lock"), "another broker")


def test_the_broker_on_a_busy_port_is_exit_5(tmp_path: Path, busy_port: int) -> None:
    one_line_error(run("broker", "--data-dir", str(tmp_path / "kafka"), "--port", str(busy_port)), 5, str(busy_port))


def test_a_bad_inject_is_refused_before_anything_starts(tmp_path: Path) -> None:
    started = time.monotonic()
    done = run("demo", "--inject", "nonsense", "--data-dir", str(tmp_path / "demo-kafka"))
    one_line_error(done, ConfigProblem.exit_code, "nonsense", "unknown fault kind")
    assert time.monotonic() - started < 30
    assert not (tmp_path / "demo-kafka").exists()  # no broker was started
    one_line_error(run("demo", "--inject", "long_tail --replica r1 --at soon"), 2, "--at")


def test_a_demo_whose_worker_exits_is_exit_9_naming_its_log(kafka_bootstrap: str, busy_port: int,
                                                            tmp_path: Path) -> None:
    # the worker cannot listen on its HTTP port, exits 5; the demo must not show a live view of nothing
    env = env_without_kafka(KAFKA_BOOTSTRAP=kafka_bootstrap, SKEWWATCH_WEB__PORT=str(busy_port))
    done = run("demo", "--duration", "60", "--data-dir", str(tmp_path / "demo-kafka"), env=env)
    # the demo's own progress lines come first; the failure is the last line, without a traceback
    assert done.returncode == ChildFailed.exit_code, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (f"Error: the worker exited with code 5; its log is "
                                            f"{tmp_path / 'worker.log'}")
    assert "already in use" in (tmp_path / "worker.log").read_text()


@pytest.mark.parametrize(("inject", "words"), [
    (["--inject", "nonsense"], ["unknown fault kind 'nonsense'"]),
    (["--inject", "long_tail"], ["--replica once per --inject"]),
    (["--inject", "long_tail --replica r1 --at soon"], ["'--at'", "'soon'"]),
    (["--inject", "long_tail", "--replica", "r1", "--at", "soon"], ["'--at'", "'soon'"]),
    (["--inject", "long_tail --replica 'r1"], ["No closing quotation"]),
])
def test_a_bad_generate_inject_says_which_forms_it_takes(inject: list[str], words: list[str]) -> None:
    # refused before Kafka is looked for: NOWHERE would be exit 3
    done = run("generate", "--bootstrap", NOWHERE, "--duration", "1", *inject)
    one_line_error(done, ConfigProblem.exit_code, *words, "expected --inject 'KIND --replica R",
                   "--inject 'long_tail --replica r1 --at 30 --for 60'", "separate options")


def test_scrape_that_sends_nothing_exits_7() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        done = run("scrape", "--kind", "dcgm", "--target", f"http://127.0.0.1:{httpd.server_address[1]}/metrics",
                   "--rounds", "2", "--interval", "0.2", "--bootstrap", NOWHERE, timeout=120)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == NothingSent.exit_code, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: none of 4 samples reached Kafka") and NOWHERE in last
    assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr


# ------------------------------------------------------------------------------------------ services wait


def test_a_worker_without_its_broker_waits_and_says_why(tmp_path: Path) -> None:
    port = free_port()
    worker = subprocess.Popen([sys.executable, "-m", "skewwatch", "worker", "--bootstrap", NOWHERE, "--web-port",
                               str(port), "--log-format", "json"], env=env_without_kafka(), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_listening(worker, port)
        time.sleep(4)  # a few probes and back-offs
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as alive:
            assert alive.status == 200
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert not_ready.value.code == 503
        checks = orjson.loads(not_ready.value.read())["checks"]
        assert checks["broker"]["ok"] is False and "connection refused" in checks["broker"]["error"]
        assert worker.poll() is None  # still running: it waits for its broker
    finally:
        worker.terminate()
        stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert b"\x1b" not in stdout + stderr  # no terminal control codes: not a TTY
    records = [orjson.loads(line) for line in stderr.splitlines() if line.strip()]  # --log-format json
    start = records[0]
    assert start["level"] == "INFO" and start["logger"] == "skewwatch.worker"
    for part in ("skewwatch worker 0.", f"bootstrap {NOWHERE} (PLAINTEXT)", "group skewwatch",
                 f"listening on http://127.0.0.1:{port}"):
        assert part in start["message"], start["message"]
    assert len(records) < 15  # one start line, one "waiting for Kafka", the client's own errors once per 30 s
    assert "Traceback" not in stderr.decode()


def test_a_receiver_without_its_broker_waits_and_answers_503() -> None:
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-m", "skewwatch", "otlp-receiver", "--bootstrap", NOWHERE,
                                 "--port", str(port)], env=env_without_kafka(), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_listening(receiver, port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as alive:
            assert alive.status == 200
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert not_ready.value.code == 503
        export = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=b"", method="POST",
                                        headers={"Content-Type": "application/x-protobuf"})
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(export, timeout=5)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"]  # the exporter retries
        assert time.monotonic() - started < 2
        assert receiver.poll() is None  # still running: it waits for its broker
    finally:
        receiver.terminate()
        _, stderr = receiver.communicate(timeout=30)
    assert receiver.returncode == 0, stderr
    assert b"Traceback" not in stderr and b"Unclosed" not in stderr and b"\x1b" not in stderr


def test_a_fresh_worker_logs_no_error_while_its_group_coordinator_is_elected(kafka_settings: Settings,
                                                                             tmp_path: Path) -> None:
    with WorkerProcess(kafka_settings, tmp_path / "worker.log"):
        time.sleep(1)
    log = (tmp_path / "worker.log").read_text()
    assert "Group Coordinator Request failed" not in log.replace("INFO aiokafka", "")
    assert " ERROR " not in log and "Traceback" not in log and "\x1b" not in log
    assert len([line for line in log.splitlines() if " INFO skewwatch.worker: skewwatch worker" in line]) == 1
