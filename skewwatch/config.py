"""Settings: defaults, then one TOML file, then the environment, validated as they load.

Every setting has a default (the seed's value where the seed gives one). A TOML file
(``--config PATH`` or ``SKEWWATCH_CONFIG``) overrides defaults key by key, and environment
variables override the file: ``SKEWWATCH_<SECTION>__<KEY>``, e.g.
``SKEWWATCH_WINDOW__ALLOWED_LATENESS_S=10``, and for the detectors' tables
``SKEWWATCH_DETECTORS__<NAME>__<KEY>``, e.g. ``SKEWWATCH_DETECTORS__LONG_TAIL__RATIO=4``.
``KAFKA_BOOTSTRAP`` is the conventional short form of ``SKEWWATCH_KAFKA__BOOTSTRAP`` (and wins).

Each section is a msgspec Struct (:class:`~skewwatch.config_section.ConfigSection`); the
``[detectors.*]`` tables are the detectors' own config types, composed by
:class:`~skewwatch.pipeline.detector_settings.DetectorSettings`. :func:`load_settings` checks
everything at once, before a command starts anything: types (a float where an integer is
expected is an error), ranges, rules over several keys and unknown keys. A problem is one
:class:`ConfigError` line naming the key and where its value came from; the CLI prints it and
exits with code 2.

>>> s = load_settings(env={"SKEWWATCH_WINDOW__ALLOWED_LATENESS_S": "10"})
>>> s.window.allowed_lateness_s, s.window.step_s, s.topics.requests, s.detectors.long_tail.ratio
(10.0, 5.0, 'llm.requests', 3.0)
>>> load_settings(env={"SKEWWATCH_KAFKA__PARTITIONS": "2.7"})
Traceback (most recent call last):
...
skewwatch.config_section.ConfigError: kafka.partitions = '2.7' (from SKEWWATCH_KAFKA__PARTITIONS): expected an integer
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta, field

from skewwatch.config_section import (
    ConfigError,
    ConfigSection,
    Count,
    Name,
    NonNegative,
    NonNegativeInt,
    Positive,
    convert,
    field_type,
    parse_text,
)
from skewwatch.pipeline.detector_settings import DetectorSettings
from skewwatch.pipeline.detectors.profiles import with_profile
from skewwatch.pipeline.window_settings import WindowSettings  # the windowing code's own section

# Kafka's rule for topic names: letters, digits, '.', '_', '-'; at most 249 characters
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class KafkaSettings(ConfigSection):
    """``[kafka]``: the cluster, the consumer groups' and clients' names, and the topics' layout."""

    section = "kafka"

    bootstrap: str | None = None  # host:port[,host:port]; None: KAFKA_BOOTSTRAP or --bootstrap must give it
    client_id: Name = "skewwatch"
    group_id: Name = "skewwatch"
    partitions: Count = 8  # partitions of the topics skewwatch creates
    replication_factor: Count = 1
    # how every client (worker, receiver, bridges, collector, generator, simulator, producer helper,
    # topics) connects; checked and turned into aiokafka's options by skewwatch.kafka_security
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    # the password is never a setting itself: a file holding it, or the name of a variable holding it
    sasl_password_file: str | None = None
    sasl_password_env: Name = "SKEWWATCH_KAFKA_PASSWORD"
    ssl_cafile: str | None = None  # CA bundle (PEM) that signed the brokers' certificates; None: the system's
    ssl_certfile: str | None = None  # client certificate (PEM), for brokers that require mTLS
    ssl_keyfile: str | None = None  # its private key (PEM)
    ssl_key_password_file: str | None = None  # when the key is encrypted
    ssl_check_hostname: bool = True  # the broker's certificate must name the host the client dialled
    # the consumer groups' failure detection (every stage's consumer, and Faust's): a member that sends no
    # heartbeat for session_timeout_ms is dropped and its partitions move. At most 30 s, under aiokafka's
    # 40 s request timeout (a rejoin waits up to a session); the broker refuses a session below its
    # group.min.session.timeout.ms (6 s by default). Defaults: aiokafka's own.
    session_timeout_ms: Annotated[int, Meta(ge=1_000, le=30_000)] = 10_000
    heartbeat_interval_ms: Annotated[int, Meta(ge=100)] = 3_000
    # where the Faust apps (the worker, alertmanager-bridge) keep their local data (nothing that needs
    # keeping: their tables are in memory, changelogged to Kafka, as are the checkpoints); None: Faust's default,
    # "<app name>-data" in the working directory (skewwatch-data, skewwatch-alertmanager-data)
    faust_datadir: str | None = None

    def __post_init__(self) -> None:
        # Kafka's rule of thumb (and aiokafka's): at most a third of the session, so two heartbeats can
        # be lost before the member is dropped
        self._require(self.heartbeat_interval_ms * 3 < self.session_timeout_ms, "heartbeat_interval_ms",
                      f"must be less than a third of session_timeout_ms ({self.session_timeout_ms})")


class TopicSettings(ConfigSection):
    """``[topics]``: the names of every topic skewwatch reads or writes."""

    section = "topics"

    requests: str = "llm.requests"
    gpu_telemetry: str = "llm.gpu-telemetry"
    features: str = "llm.features"
    alerts: str = "llm.alerts"
    routing_corrections: str = "llm.routing-corrections"
    dead_letter: str = "llm.dead-letter"
    # internal: stage 1 -> stage 2 replica step summaries (keyed by model) and state checkpoints
    replica_steps: str = "skewwatch.replica-steps"
    checkpoints: str = "skewwatch.checkpoints"
    # OTLP spans as the OTel Collector's Kafka exporter writes them; "" = not consumed. When set,
    # the worker decodes them and re-publishes the request events on `requests`.
    otlp_spans: str = ""

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name == "otlp_spans" and value == "":
                continue
            self._require(_TOPIC_NAME.fullmatch(value) is not None, name,
                          "must be a Kafka topic name (1-249 letters, digits, '.', '_' or '-')")


class LimitSettings(ConfigSection):
    """``[limits]``: what input is accepted, and how much work may be in flight."""

    section = "limits"

    max_message_bytes: Count = 1 << 20  # a request message larger than 1 MiB is rejected
    max_tokens: Count = 10_000_000  # prompt/completion tokens above this are rejected as absurd
    max_events_per_message: Count = 10_000
    # every this many seconds the worker hands its heap's free memory back to the OS (glibc
    # malloc_trim, skewwatch.agents.memory): after a catch-up burst RSS falls back to what it holds; 0: never
    memory_trim_s: NonNegative = 10.0
    # closes per input partition whose outputs may await the broker's acknowledgement (then their
    # checkpoint) while the stage reads on (skewwatch.agents.acks); the next one waits for the oldest
    max_unacked_closes: Count = 4
    # a partition's checkpoint is written at most this often (wall clock; 0: at every step close) and
    # whenever the partition is revoked or the worker stops: a catch-up burst closes many steps a
    # second, and a restart replays at most this much more input (Kafka Streams' commit.interval.ms)
    checkpoint_interval_s: NonNegative = 5.0


class OtlpSettings(ConfigSection):
    """``[otlp]``: how the worker reads ``topics.otlp_spans`` (skewwatch.agents.otlp_stage)."""

    section = "otlp"

    # the Collector's kafka exporter encoding (skewwatch.otlp.decode.ENCODINGS); auto: detect per record
    encoding: Literal["otlp_proto", "otlp_json", "auto"] = "auto"
    default_model: str | None = None  # for spans naming no model (vLLM V1 spans do not)
    # resource attributes naming the replica, in order; None = the attribute map's default
    replica_keys: Annotated[list[Name], Meta(min_length=1)] | None = None
    max_events_per_message: Count = 1000  # events per {"events": [...]} message re-published on `requests`


class DerivedBatchSettings(ConfigSection):
    """``[derived_batch]``: batch sizes for request events that carry none (contract v1.1,
    skewwatch.pipeline.derived_batch)."""

    section = "derived_batch"

    enabled: bool = True
    max_telemetry_age_s: Positive = 30.0  # a telemetry sample older than this (vs the event's ts) is not used
    default_capacity: NonNegativeInt = 0  # capacity when telemetry gives none, every model; 0 = unknown
    # per model; env: "llama=256,qwen=128"
    capacity_by_model: dict[Name, NonNegativeInt] = field(default_factory=dict)

    def capacity_for_model(self, model: str) -> int | None:
        """The batch capacity configured for ``model``: its own, else the default; None if neither."""
        return self.capacity_by_model.get(model) or self.default_capacity or None


class WebSettings(ConfigSection):
    """``[web]``: where the worker's HTTP API and /metrics listen, and who may call it
    (skewwatch.agents.http_api; the rules in skewwatch.web_auth)."""

    section = "web"

    host: Name = "127.0.0.1"  # loopback by default; anything else needs a token (or insecure_no_auth)
    port: Annotated[int, Meta(ge=0, le=65535)] = 6066  # 0: any free port (the worker logs which)
    token_file: str | None = None  # a file holding the bearer token (read at start, never logged)
    token_env: Name = "SKEWWATCH_WEB_TOKEN"  # else the variable of this name holds it
    insecure_no_auth: bool = False  # allow a bind beyond loopback without a token (not recommended)
    # POST /api/v1/update_weights publishes a model's correction at most once per this many seconds: the
    # corrections topic is compacted, a flood of POSTs must not become a flood of records
    update_interval_s: NonNegative = 1.0


class HealthSettings(ConfigSection):
    """``[health]``: what ``/readyz`` requires (a reachable broker, partitions, bounded lag)."""

    section = "health"

    max_lag_records: NonNegativeInt = 100_000  # records the worker may be behind its input and still be ready
    probe_interval_s: Positive = 2.0  # a metadata request to the broker this often
    probe_timeout_s: Positive = 3.0  # and no answer within this long means unreachable
    # a POST that needs the broker's acknowledgement answers 503 when none came within this long
    ack_timeout_s: Positive = 1.5


class OtlpReceiverSettings(ConfigSection):
    """``[otlp_receiver]``: ``skewwatch otlp-receiver``: where it listens, who may send, how much it accepts."""

    section = "otlp_receiver"

    host: Name = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 4318  # OTLP/HTTP's standard port
    token_file: str | None = None
    token_env: Name = "SKEWWATCH_OTLP_TOKEN"
    insecure_no_auth: bool = False
    tls_certfile: str | None = None  # serve HTTPS with this certificate chain (PEM) ...
    tls_keyfile: str | None = None  # ... and key; both or neither
    max_body_bytes: Count = 4 * 1024 * 1024  # a request body as received (compressed or not); larger: 413
    max_decompressed_bytes: Count = 16 * 1024 * 1024  # what a gzip body may expand to; larger: 413
    # original bytes a dead letter may hold; never more than the request as received either
    dead_letter_max_bytes: Count = 256 * 1024
    log_interval_s: NonNegative = 30.0  # one log line per kind of rejection per interval, with a count


class Settings(ConfigSection):
    """Every section; ``load_settings`` builds it from the defaults, a TOML file and the environment."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    window: WindowSettings = field(default_factory=WindowSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    web: WebSettings = field(default_factory=WebSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    otlp_receiver: OtlpReceiverSettings = field(default_factory=OtlpReceiverSettings)
    otlp: OtlpSettings = field(default_factory=OtlpSettings)
    derived_batch: DerivedBatchSettings = field(default_factory=DerivedBatchSettings)
    detectors: DetectorSettings = field(default_factory=DetectorSettings)


def _merge(into: dict[str, Any], values: Mapping[str, Any], sources: dict[tuple[str, ...], str],
           source: str, path: tuple[str, ...] = ()) -> None:
    """Deep-merge ``values`` into ``into``; every leaf records ``source``."""
    for key, value in values.items():
        here = (*path, key)
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value, sources, source, here)
            continue
        into[key] = {} if isinstance(value, Mapping) else value
        if isinstance(value, Mapping):
            _merge(into[key], value, sources, source, here)
        sources[here] = source


def _environment(env: Mapping[str, str]) -> list[tuple[str, tuple[str, ...], str]]:
    """``(variable, key path, text)`` of every ``SKEWWATCH_<SECTION>__<KEY>`` variable (and
    ``SKEWWATCH_DETECTORS__<NAME>__<KEY>``), then ``KAFKA_BOOTSTRAP``."""
    found = []
    for name, value in sorted(env.items()):
        if not name.startswith("SKEWWATCH_") or "__" not in name:
            continue
        section, _, rest = name[len("SKEWWATCH_"):].lower().partition("__")
        parts = rest.split("__", 1) if section == "detectors" else [rest]
        found.append((name, (section, *parts), value))
    if env.get("KAFKA_BOOTSTRAP"):
        found.append(("KAFKA_BOOTSTRAP", ("kafka", "bootstrap"), env["KAFKA_BOOTSTRAP"]))
    return found


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Defaults, then the TOML file (``path``, else ``$SKEWWATCH_CONFIG``), then the environment.

    Raises ConfigError (one line: the key, its value, the file or variable it came from, the problem).
    """
    return load_settings_and_sources(path, env)[0]


def load_settings_and_sources(path: str | Path | None = None, env: Mapping[str, str] | None = None
                              ) -> tuple[Settings, dict[tuple[str, ...], str]]:
    """:func:`load_settings`, and where each value that is not a default came from: key path -> the file,
    the variable or ``profile <name>`` (``skewwatch config show``)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    file_source = "--config" if path else "SKEWWATCH_CONFIG"
    path = path or env.get("SKEWWATCH_CONFIG")
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} (from {file_source}) does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} (from {file_source}) cannot be read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
        _merge(raw, data, sources, str(path))
    for name, key, text in _environment(env):
        # text is read by the type of its key (TOML values are typed already and taken as they are)
        tp = field_type(Settings, key)
        nested: dict[str, Any] = {key[-1]: text if tp is None else parse_text(text, tp)}
        for part in reversed(key[:-1]):
            nested = {part: nested}
        _merge(raw, nested, sources, name)
    if isinstance(raw.get("detectors"), Mapping):  # the profile's values beneath the user's own
        raw["detectors"] = with_profile(raw["detectors"], sources, ("detectors",))
    return convert(raw, Settings, sources), sources


__all__ = [
    "ConfigError",
    "DerivedBatchSettings",
    "DetectorSettings",
    "HealthSettings",
    "KafkaSettings",
    "LimitSettings",
    "OtlpReceiverSettings",
    "OtlpSettings",
    "Settings",
    "TopicSettings",
    "WebSettings",
    "WindowSettings",
    "load_settings",
    "load_settings_and_sources",
]
