"""skewwatch.logs: repeated errors once per interval with a count, JSON lines, the coordinator election at
INFO and a new partition's leader election at WARNING, no terminal control codes; and --loglevel /
--log-format on every long-running command."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import aiokafka.errors as kafka_errors
import orjson
import pytest
from aiokafka.consumer import fetcher
from click.testing import CliRunner

from skewwatch import logs
from skewwatch.cli import COMMANDS, main

LONG_RUNNING = ["worker", "otlp-receiver", "collect-gpu", "scrape", "generate", "simulate", "broker", "demo"]


@pytest.fixture
def clock() -> Iterator[list[float]]:
    yield [0.0]


def test_a_repeated_error_is_one_line_per_interval_with_a_count(clock: list[float]) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.RateLimitFilter(30.0, clock=lambda: clock[0]))
    logger = logging.getLogger("test.repeats")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        for second in range(100):  # an outage: the same error 10 times a second for 10 s, then 60 s later once
            clock[0] = second / 10
            logger.error("Unable connect to node with id %d: [Errno 111] refused", 1)
        logger.warning("a different warning")
        clock[0] = 45.0
        logger.error("Unable connect to node with id %d: [Errno 111] refused", 2)  # numbers aside, the same
        logger.info("info lines are never held back")
        logger.info("info lines are never held back")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "Unable connect to node with id 1: [Errno 111] refused",
        "a different warning",
        "Unable connect to node with id 2: [Errno 111] refused (99 more like this in the last 30 s)",
        "info lines are never held back",
        "info lines are never held back",
    ]


def test_the_coordinator_election_is_info_not_error() -> None:
    stream = io.StringIO()
    handler = logs.setup_logging("info", "text", stream=stream)
    try:
        election = logging.getLogger("aiokafka.consumer.group_coordinator")
        election.error("Group Coordinator Request failed: %s", "[Error 15] GroupCoordinatorNotAvailableError")
        election.error("Group Coordinator Request failed: %s", "KafkaConnectionError: connection refused")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    # the election is a normal step (INFO, below the libraries' WARNING: not shown); a real failure stays ERROR
    assert len(lines) == 1 and " ERROR " in lines[0] and "KafkaConnectionError" in lines[0]


def test_a_new_partitions_leader_election_is_a_warning_not_an_error() -> None:
    # the record aiokafka's fetcher logs on a first start, with the exception object as its argument
    record = logging.LogRecord(
        "aiokafka.consumer.fetcher", logging.ERROR, fetcher.__file__, 987, "Failed fetch offsets from %s: %s",
        (1, kafka_errors.NotLeaderForPartitionError(0)), None)
    assert logs.LeaderElectionFilter().filter(record)
    assert (record.levelno, record.levelname) == (logging.WARNING, "WARNING")
    refused = logging.LogRecord(
        "aiokafka.consumer.fetcher", logging.ERROR, fetcher.__file__, 749, "Failed fetch messages from %s: %s",
        (1, kafka_errors.KafkaConnectionError("Connection at 127.0.0.1:1 closed")), None)
    assert logs.LeaderElectionFilter().filter(refused) and refused.levelno == logging.ERROR


def test_setup_logging_installs_the_leader_election_filter_on_the_fetcher() -> None:
    stream = io.StringIO()
    handler = logs.setup_logging("info", "text", stream=stream)
    try:
        logging.getLogger("aiokafka.consumer.fetcher").error(
            "Failed fetch offsets from %s: %s", 1, kafka_errors.NotLeaderForPartitionError(0))
    finally:
        logging.getLogger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert " WARNING aiokafka.consumer.fetcher: " in line and "NotLeaderForPartitionError" in line


def test_json_lines_and_no_control_codes() -> None:
    stream = io.StringIO()
    handler = logs.setup_logging("info", "json", stream=stream)
    try:
        logging.getLogger("skewwatch.example").info("listening on %s", "http://127.0.0.1:6066")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("skewwatch.example").exception("failed")
    finally:
        logging.getLogger().removeHandler(handler)
    first, second = (orjson.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "listening on http://127.0.0.1:6066" and first["level"] == "INFO"
    assert first["logger"] == "skewwatch.example" and first["ts"].endswith("Z")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]
    assert "\x1b" not in stream.getvalue()


@pytest.mark.parametrize("command", LONG_RUNNING)
def test_every_long_running_command_has_loglevel_and_log_format(command: str) -> None:
    assert command in COMMANDS
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--loglevel" in result.output and "--log-format" in result.output
