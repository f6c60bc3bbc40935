"""Settings: one msgspec-validated configuration, checked when it loads, with one-line errors.

The command-line cases run the real ``skewwatch`` CLI in a child process and assert on its
stderr: one line naming the key and where its value came from, no traceback, exit code 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest

from skewwatch.cli import EXIT_CONFIG
from skewwatch.config import ConfigError, OtlpSettings, Settings, load_settings
from skewwatch.otlp.decode import ENCODINGS
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.long_tail_config import LongTailConfig
from skewwatch.pipeline.detectors.registry import DETECTORS

# ---------------------------------------------------------------- the real CLI

# (TOML text, what the one line must say); the first four are what a new user tried
BAD_FILES = {
    "typo": ("[detectors.long_tail]\nratoi = 4\n", ["detectors.long_tail.ratoi", "unknown setting", "ratio"]),
    "zero_step": ("[window]\nstep_s = 0\n", ["window.step_s = 0", "> 0"]),
    "not_a_table": ("[detectors]\nlong_tail = 3\n", ["detectors.long_tail = 3", "expected a table"]),
    "float_for_int": ("[kafka]\npartitions = 2.7\n", ["kafka.partitions = 2.7", "expected an integer"]),
    "unknown_section": ("[kafak]\nbootstrap = 'x:1'\n", ["kafak", "unknown section", "kafka"]),
    "rule_over_keys": ("[detectors.batch_collapse]\nseed_rule = false\nstuck_rule = false\npeer_rule = false\n",
                       ["detectors.batch_collapse.seed_rule", "stuck_rule or peer_rule"]),
    "not_toml": ("[window\n", ["not valid TOML"]),
}


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("SKEWWATCH_") and k != "KAFKA_BOOTSTRAP"}
    return subprocess.run([sys.executable, "-m", "skewwatch", *args], capture_output=True, text=True,
                          timeout=120, env={**clean, **(env or {})}, cwd=cwd)


def assert_config_error(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit code 2, and stderr is exactly one line, ``Error: ...``, saying each of ``expected``."""
    assert done.returncode == EXIT_CONFIG, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: ")
    for text in expected:
        assert text in lines[0], (text, lines[0])


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_worker_refuses_bad_settings_in_one_line(case: str, tmp_path: Path) -> None:
    text, expected = BAD_FILES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    # a bootstrap that answers nothing: a worker that got past its settings would hang, not exit 2
    done = run_cli("worker", "--config", str(path), "--bootstrap", "127.0.0.1:9")
    assert_config_error(done, *expected, *([str(path)] if case != "not_toml" else []))


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("SKEWWATCH_KAFKA__PARTITIONS", "2.7", ["kafka.partitions = '2.7'", "expected an integer"]),
    ("SKEWWATCH_DETECTORS__LONG_TAIL__RATOI", "4", ["detectors.long_tail.ratoi", "unknown setting"]),
    ("SKEWWATCH_WINDOW__STEP_S", "0", ["window.step_s = 0", "> 0"]),
    ("SKEWWATCH_CONFIG", "/nonexistent/skewwatch.toml", ["/nonexistent/skewwatch.toml", "does not exist"]),
])
def test_an_environment_variable_is_named_as_the_source(variable: str, value: str, expected: list[str]) -> None:
    done = run_cli("worker", "--bootstrap", "127.0.0.1:9", env={variable: value})
    assert_config_error(done, variable, *expected)


# every command, worker and one-shot alike, with the arguments it needs besides --config
COMMANDS: dict[str, list[str]] = {
    "topics create": ["topics", "create", "--bootstrap", "127.0.0.1:9"],
    "generate": ["generate", "--bootstrap", "127.0.0.1:9", "--duration", "1"],
    "simulate": ["simulate", "--duration", "1"],
    "collect-gpu": ["collect-gpu", "--simulate", "--once"],
    "scrape": ["scrape", "--target", "http://127.0.0.1:9/metrics", "--kind", "dcgm", "--once"],
    "otlp-receiver": ["otlp-receiver", "--bootstrap", "127.0.0.1:9", "--port", "0"],
    # these two take no --config: the file comes from SKEWWATCH_CONFIG
    "demo": ["demo", "--duration", "1"],
    "broker": ["broker", "--port", "0"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_stops_before_starting_anything(command: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD_FILES["float_for_int"][0])
    args = COMMANDS[command]
    if command in ("demo", "broker"):
        done = run_cli(*args, env={"SKEWWATCH_CONFIG": str(path)}, cwd=tmp_path)
    else:
        done = run_cli(*args, "--config", str(path), cwd=tmp_path)
    assert_config_error(done, "kafka.partitions = 2.7", str(path), "expected an integer")
    assert list(tmp_path.iterdir()) == [path]  # no broker data, no logs, no output files: nothing started


def test_web_port_out_of_range_is_a_usage_error_without_traceback() -> None:
    done = run_cli("worker", "--bootstrap", "127.0.0.1:9", "--web-port", "70000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--web-port" in done.stderr and "70000" in done.stderr


# ---------------------------------------------------------------- load_settings


def test_defaults_then_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[window]\nstep_s = 10\nlength_s = 60\n[kafka]\npartitions = 4\n'
                    '[detectors.long_tail]\nratio = 3.5\n[otlp]\nreplica_keys = ["k8s.pod.name"]\n')
    env = {"SKEWWATCH_KAFKA__PARTITIONS": "6", "SKEWWATCH_DETECTORS__LONG_TAIL__PERSISTENCE": "2",
           "SKEWWATCH_DERIVED_BATCH__CAPACITY_BY_MODEL": "llama=256, qwen=128",
           "SKEWWATCH_DERIVED_BATCH__ENABLED": "off", "SKEWWATCH_OTLP__DEFAULT_MODEL": "none",
           "SKEWWATCH_CACHE": "/elsewhere", "KAFKA_BOOTSTRAP": "k:9092", "SKEWWATCH_KAFKA__BOOTSTRAP": "x:1"}
    s = load_settings(path, env=env)
    assert (s.window.step_s, s.window.length_s, s.kafka.partitions) == (10.0, 60.0, 6)
    assert isinstance(s.window.step_s, float) and isinstance(s.kafka.partitions, int)
    assert (s.detectors.long_tail.ratio, s.detectors.long_tail.persistence) == (3.5, 2)
    assert s.detectors.long_tail.min_count == LongTailConfig().min_count  # untouched keys keep their defaults
    assert s.derived_batch.capacity_by_model == {"llama": 256, "qwen": 128} and not s.derived_batch.enabled
    assert s.otlp.replica_keys == ["k8s.pod.name"] and s.otlp.default_model is None
    assert s.kafka.bootstrap == "k:9092"  # KAFKA_BOOTSTRAP, the conventional short form, wins


def test_defaults_need_no_file_and_no_environment() -> None:
    assert load_settings(env={}) == Settings()


@pytest.mark.parametrize(("env", "expected"), [
    ({"SKEWWATCH_KAFKA__REPLICATION_FACTOR": "1.0"}, "kafka.replication_factor = '1.0' "),  # no silent truncation
    ({"SKEWWATCH_DERIVED_BATCH__ENABLED": "maybe"}, "expected true or false"),
    ({"SKEWWATCH_OTLP__ENCODING": "protobuf"}, "expected one of otlp_proto, otlp_json, auto"),
    ({"SKEWWATCH_WINDOW__LENGTH_S": "62"}, "window.length_s (from SKEWWATCH_WINDOW__LENGTH_S): must be a whole"),
    ({"SKEWWATCH_TOPICS__REQUESTS": "my requests"},
     "topics.requests (from SKEWWATCH_TOPICS__REQUESTS): must be a Kafka"),
    ({"SKEWWATCH_WEB__PORT": "65536"}, "web.port = 65536 (from SKEWWATCH_WEB__PORT): expected an integer <= 65535"),
    ({"SKEWWATCH_LIMITS__MAX_MESSAGE_BYTES": "0"}, "limits.max_message_bytes = 0"),
    ({"SKEWWATCH_WINDOW__STEP_S": "nan"}, "window.step_s = nan"),
    ({"SKEWWATCH_OTLP__REPLICA_KEYS": ","}, "otlp.replica_keys = []"),
    ({"SKEWWATCH_DETECTORS__DECIDER__DISABLED": "long_tail,nope"}, "('nope'; known: long_tail"),
    ({"SKEWWATCH_DETECTORS__GPU_HEALTH__RECLASSIFY": "cudaErrorFoo=hardware"}, "detectors.gpu_health.reclassify"),
])
def test_bad_values_name_the_key_the_value_and_the_variable(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env=env)
    message = str(caught.value)
    assert expected in message and "\n" not in message
    assert next(iter(env)) in message


def test_a_toml_string_is_not_read_as_a_number(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[kafka]\npartitions = "8"\n[window]\nstep_s = true\n')
    with pytest.raises(ConfigError, match=r"kafka.partitions = '8' \(from .*s.toml\): expected an integer"):
        load_settings(path, env={})


def test_an_unknown_environment_section_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^windwo \(from SKEWWATCH_WINDWO__STEP_S\): unknown section"):
        load_settings(env={"SKEWWATCH_WINDWO__STEP_S": "5"})


# ---------------------------------------------------------------- the sections agree with the code


def test_every_registered_detector_has_its_own_config_in_the_detectors_table() -> None:
    fields = {f.name: f.type for f in msgspec.structs.fields(DetectorSettings)}
    for name, detector in DETECTORS.items():
        assert fields[name] is detector.Config
        assert detector.Config.section == f"detectors.{name}"
    assert set(fields) - set(DETECTORS) == {"profile", "weights", "corrections", "decider"}
    assert set(DetectorSettings().detector_configs()) == set(DETECTORS)


def test_otlp_encodings_are_the_decoders() -> None:
    encoding = next(f.type for f in msgspec.structs.fields(OtlpSettings) if f.name == "encoding")
    assert set(typing.get_args(encoding)) == set(ENCODINGS)


def test_every_section_names_its_place() -> None:
    for field in msgspec.structs.fields(Settings):
        assert field.type.section == field.name


def _keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for field in msgspec.structs.fields(cls):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            keys += _keys(field.type, f"{prefix}{field.name}.")
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


def test_the_docs_list_every_key() -> None:
    docs = Path(__file__).parents[2] / "docs"
    configuration = (docs / "configuration.md").read_text()
    detectors = (docs / "detectors.md").read_text()
    for key in _keys(Settings):
        if key.startswith("detectors."):
            assert f"`{key.rsplit('.', 1)[1]}`" in detectors, key
        else:
            assert f"`{key}`" in configuration, key



def test_the_group_timeouts_are_checked_together() -> None:
    settings = load_settings(env={"SKEWWATCH_KAFKA__SESSION_TIMEOUT_MS": "20000",
                                  "SKEWWATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "6000"})
    assert (settings.kafka.session_timeout_ms, settings.kafka.heartbeat_interval_ms) == (20_000, 6_000)
    assert (Settings().kafka.session_timeout_ms, Settings().kafka.heartbeat_interval_ms) == (10_000, 3_000)
    with pytest.raises(ConfigError, match=r"kafka.heartbeat_interval_ms \(from SKEWWATCH_KAFKA__HEARTBEAT_INTERVAL_MS\)"
                                          r": must be less than a third of session_timeout_ms \(10000\), got 4000"):
        load_settings(env={"SKEWWATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "4000"})
    with pytest.raises(ConfigError, match=r"kafka.session_timeout_ms .*<= 30000"):
        load_settings(env={"SKEWWATCH_KAFKA__SESSION_TIMEOUT_MS": "60000"})
