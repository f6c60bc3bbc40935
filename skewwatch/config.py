"""Configuration: one TOML file plus environment overrides, typed and explicit.

Every setting has a default (the seed's value where the seed gives one). A TOML file
(``--config PATH`` or ``SKEWWATCH_CONFIG``) overrides defaults section by section, and
environment variables override the file: ``SKEWWATCH_<SECTION>__<FIELD>``, e.g.
``SKEWWATCH_WINDOW__ALLOWED_LATENESS_S=10``. ``KAFKA_BOOTSTRAP`` is accepted as the
conventional short form of ``SKEWWATCH_KAFKA__BOOTSTRAP``.

>>> s = load_settings(env={"SKEWWATCH_WINDOW__ALLOWED_LATENESS_S": "10"})
>>> s.window.allowed_lateness_s, s.window.step_s, s.topics.requests
(10.0, 5.0, 'llm.requests')
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the setting."""


@dataclass(slots=True)
class KafkaSettings:
    bootstrap: str | None = None  # None: use the embedded broker the project starts itself
    client_id: str = "skewwatch"
    group_id: str = "skewwatch"
    partitions: int = 8  # partitions of the topics skewwatch creates
    replication_factor: int = 1


@dataclass(slots=True)
class TopicSettings:
    requests: str = "llm.requests"
    gpu_telemetry: str = "llm.gpu-telemetry"
    features: str = "llm.features"
    alerts: str = "llm.alerts"
    routing_corrections: str = "llm.routing-corrections"
    dead_letter: str = "llm.dead-letter"
    # internal: stage 1 -> stage 2 replica step summaries (keyed by model) and state checkpoints
    replica_steps: str = "skewwatch.replica-steps"
    checkpoints: str = "skewwatch.checkpoints"
    # OTLP spans as the OTel Collector's Kafka exporter writes them (issue 7); "" = not consumed.
    # When set, the worker decodes them and re-publishes the request events on `requests`.
    otlp_spans: str = ""


@dataclass(slots=True)
class WindowSettings:
    length_s: float = 60.0  # seed §2.5: 60 s sliding window
    step_s: float = 5.0  # seed §2.5: a feature vector every 5 s
    allowed_lateness_s: float = 5.0  # events older than watermark are late: counted, not folded in
    idle_release_s: float = 90.0  # a replica silent this long (past window + grace) is released
    partition_idle_s: float = 10.0  # wall seconds without input before an idle partition follows the others
    sketch_relative_accuracy: float = 0.01  # quantile sketch: <= 1 % relative error
    # a telemetry partition read this far (event time) ahead of the requests' watermark is paused until
    # the requests catch up: a backlog of telemetry would otherwise push the samples old steps need out
    # of the join's history (telemetry_join.history_for: 23 samples, 110 s at the 5 s interval)
    telemetry_ahead_s: float = 60.0


@dataclass(slots=True)
class LimitSettings:
    max_message_bytes: int = 1 << 20  # a request message larger than 1 MiB is rejected
    max_tokens: int = 10_000_000  # prompt/completion tokens above this are rejected as absurd
    max_events_per_message: int = 10_000
    # every this many seconds the worker hands its heap's free memory back to the OS (glibc
    # malloc_trim, skewwatch.agents.memory): after a catch-up burst RSS falls back to what it holds; 0: never
    memory_trim_s: float = 10.0
    # closes per input partition whose outputs may await the broker's acknowledgement (then their
    # checkpoint) while the stage reads on (skewwatch.agents.acks); the next one waits for the oldest
    max_unacked_closes: int = 4
    # a partition's checkpoint is written at most this often (wall clock; 0: at every step close) and
    # whenever the partition is revoked or the worker stops: a catch-up burst closes many steps a
    # second, and a restart replays at most this much more input (Kafka Streams' commit.interval.ms)
    checkpoint_interval_s: float = 5.0


@dataclass(slots=True)
class OtlpSettings:
    """How the worker reads ``topics.otlp_spans`` (skewwatch.agents.otlp_stage)."""

    encoding: str = "auto"  # the Collector's kafka exporter encoding: otlp_proto | otlp_json | auto (detect)
    default_model: str | None = None  # for spans naming no model (vLLM V1 spans do not)
    replica_keys: list[str] | None = None  # resource attributes naming the replica, in order; None = default
    max_events_per_message: int = 1000  # events per {"events": [...]} message re-published on `requests`


@dataclass(slots=True)
class DerivedBatchSettings:
    """Contract v1.1: batch sizes for request events that carry none (skewwatch.pipeline.derived_batch)."""

    enabled: bool = True
    max_telemetry_age_s: float = 30.0  # a telemetry sample older than this (vs the event's ts) is not used
    default_capacity: int = 0  # capacity when telemetry gives none, every model; 0 = unknown
    capacity_by_model: dict[str, int] = field(default_factory=dict)  # per model; env: "llama=256,qwen=128"

    def capacity_for_model(self, model: str) -> int | None:
        return self.capacity_by_model.get(model) or self.default_capacity or None


@dataclass(slots=True)
class WebSettings:
    host: str = "127.0.0.1"
    port: int = 6066


@dataclass(slots=True)
class Settings:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    window: WindowSettings = field(default_factory=WindowSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    web: WebSettings = field(default_factory=WebSettings)
    otlp: OtlpSettings = field(default_factory=OtlpSettings)
    derived_batch: DerivedBatchSettings = field(default_factory=DerivedBatchSettings)
    detectors: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-detector overrides


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Convert a TOML/env value to the field's declared type, or raise ConfigError naming it."""
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            return None
        hint = args[0]
    if typing.get_origin(hint) is dict:  # a TOML table, or "key=value,key=value" from the environment
        return _coerce_table(value, typing.get_args(hint)[1], where)
    try:
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if hint in (int, float, str):
            return hint(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}") from exc
    return value


def _coerce_table(value: Any, value_type: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        pairs = [item.partition("=") for item in value.split(",") if item.strip()]
        if any(not sep or not key.strip() for key, sep, _ in pairs):
            raise ConfigError(f"{where}: expected key=value,key=value, got {value!r}")
        value = {key.strip(): item.strip() for key, _, item in pairs}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a table, got {value!r}")
    return {str(key): _coerce(item, value_type, f"{where}.{key}") for key, item in value.items()}


def _apply(section: Any, values: Mapping[str, Any], where: str) -> None:
    hints = typing.get_type_hints(type(section))
    known = {f.name for f in dataclasses.fields(section)}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown setting (known: {', '.join(sorted(known))})")
        setattr(section, key, _coerce(value, hints[key], f"{where}.{key}"))


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Defaults, then the TOML file, then the environment."""
    env = os.environ if env is None else env
    settings = Settings()
    path = path or env.get("SKEWWATCH_CONFIG")
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        for name, values in data.items():
            if name == "detectors":
                settings.detectors = {k: dict(v) for k, v in values.items()}
                continue
            if not hasattr(settings, name) or not isinstance(values, dict):
                raise ConfigError(f"{path}: unknown section [{name}]")
            _apply(getattr(settings, name), values, name)
    for key, value in env.items():
        if not key.startswith("SKEWWATCH_") or "__" not in key:
            continue
        section_name, _, field_name = key[len("SKEWWATCH_"):].lower().partition("__")
        if section_name == "detectors":
            detector, _, param = field_name.partition("__")
            settings.detectors.setdefault(detector, {})[param] = value
            continue
        if not hasattr(settings, section_name):
            raise ConfigError(f"{key}: unknown section {section_name!r}")
        _apply(getattr(settings, section_name), {field_name: value}, section_name)
    if env.get("KAFKA_BOOTSTRAP"):
        settings.kafka.bootstrap = env["KAFKA_BOOTSTRAP"]
    if settings.limits.max_unacked_closes < 1:
        raise ConfigError(f"limits.max_unacked_closes: must be ≥ 1, got {settings.limits.max_unacked_closes}")
    if not settings.limits.checkpoint_interval_s >= 0:
        raise ConfigError(f"limits.checkpoint_interval_s: must be ≥ 0, got {settings.limits.checkpoint_interval_s}")
    return settings
