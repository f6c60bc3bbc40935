"""`skewwatch config show` and `config check`: the effective settings and where each came from, checked
without starting anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from skewwatch.errors import ConfigProblem, KafkaUnreachable
from skewwatch.ports import free_port
from tests.integration.commands import one_line_error


def skewwatch(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP" and not k.startswith("SKEWWATCH_")}
    return subprocess.run([sys.executable, "-m", "skewwatch", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **env})


def test_config_show_names_each_value_and_its_source(tmp_path: Path) -> None:
    config = tmp_path / "skewwatch.toml"
    config.write_text('[window]\nstep_s = 10.0\n[detectors.long_tail]\nratio = 4.0\n')
    done = skewwatch("config", "show", "--config", str(config), "--json", KAFKA_BOOTSTRAP="kafka:9092",
                     SKEWWATCH_KAFKA__PARTITIONS="3")
    assert done.returncode == 0, done.stderr
    rows = {row["key"]: (row["value"], row["source"]) for row in map(orjson.loads, done.stdout.splitlines())}
    assert rows["window.step_s"] == (10.0, str(config))
    assert rows["detectors.long_tail.ratio"] == (4.0, str(config))
    assert rows["kafka.partitions"] == (3, "SKEWWATCH_KAFKA__PARTITIONS")
    assert rows["kafka.bootstrap"] == ("kafka:9092", "KAFKA_BOOTSTRAP")
    assert rows["window.length_s"] == (60.0, "default")
    text = skewwatch("config", "show", "--profile", "seed").stdout
    assert 'detectors.profile = "seed"  # --profile' in text and "  # profile seed" in text


def test_config_check_says_ok_or_names_the_problem(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[window]\nstep_s = 10.0\n")
    done = skewwatch("config", "check", "--config", str(good))
    assert done.returncode == 0 and done.stdout.startswith(f"ok: {good}; 1 settings not at"), done
    bad = tmp_path / "bad.toml"
    bad.write_text('[window]\nstep_s = "five"\n')
    one_line_error(skewwatch("config", "check", "--config", str(bad)), ConfigProblem.exit_code, "window.step_s",
                   str(bad))
    one_line_error(skewwatch("config", "check", "--kafka", "--bootstrap", f"127.0.0.1:{free_port()}"),
                   KafkaUnreachable.exit_code, "no Kafka answers")
