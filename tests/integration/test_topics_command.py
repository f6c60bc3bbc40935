"""`skewwatch topics list` and `topics describe` on the real broker: what exists, with what layout and configs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from skewwatch.config import Settings
from skewwatch.errors import ConfigProblem
from tests.integration.commands import one_line_error
from tests.integration.worker_proc import settings_env

pytestmark = pytest.mark.kafka


def topics(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **settings_env(settings), **env}
    full.pop("KAFKA_BOOTSTRAP", None)
    return subprocess.run([sys.executable, "-m", "skewwatch", "topics", *args], env=full, capture_output=True,
                          text=True, timeout=90)


def test_topics_list_says_what_exists_and_what_is_missing(kafka_settings: Settings) -> None:
    done = topics(kafka_settings, "list", SKEWWATCH_TOPICS__OTLP_SPANS=f"{kafka_settings.topics.requests}.otlp")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"exists   {kafka_settings.topics.routing_corrections} partitions=2" in lines
    assert f"missing  {kafka_settings.topics.requests}.otlp (`skewwatch topics create` creates it)" in lines
    assert len(lines) == 9, lines  # the eight topics and the OTLP spans'


def test_topics_describe_shows_partitions_and_configs(kafka_settings: Settings) -> None:
    name = kafka_settings.topics.routing_corrections
    done = topics(kafka_settings, "describe", name)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"{name}: 2 partitions, 0 records written\n"), out
    assert "  cleanup.policy=compact" in out and "  partition 1: leader " in out and "end offset 0" in out
    one_line_error(topics(kafka_settings, "describe", f"{name}.none"), ConfigProblem.exit_code,
                   "no such topic", f"{name}.none")
