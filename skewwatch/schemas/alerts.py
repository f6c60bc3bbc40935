"""The ``llm.alerts`` record and the actions a routing correction carries: their one encoder and decoder.

An :class:`Alert` is one record on ``llm.alerts`` (a detection opening or resolving); an
:class:`Action` is what a routing correction carries for one replica, in force until
``expires_at``. The worker builds them (:mod:`skewwatch.pipeline.detectors`), and every reader —
the worker's own restore, the client library, the bridges, the tail command, the benchmarks —
reads them through :func:`decode_alert` (or :func:`skewwatch.schemas.corrections.decode_correction`
for the actions), so a field's type and default are stated here and nowhere else.

>>> alert = Alert(60.0, "m", "r1", "long_tail", Severity.WARNING, "open", "p99 > 3 x p50", {"p99": 900.0})
>>> encode_alert(alert)[:82]
b'{"ts":60.0,"model":"m","replica":"r1","detector":"long_tail","severity":"WARNING",'
>>> alert.key, decode_alert(encode_alert(alert)) == alert, Alert.from_dict(alert.to_dict()) == alert
('m/r1/long_tail', True, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import msgspec
import orjson

Evidence = dict[str, float | int | str | None]


class Severity(StrEnum):
    """How urgent an alert (and its action) is."""

    INFO = "INFO"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


AlertState = Literal["open", "resolved"]


@dataclass(frozen=True, slots=True)
class Alert:
    """One record on ``llm.alerts``: a detection opening or resolving for a model/replica."""

    ts: float  # event time of the step (window_end) that opened / resolved it
    model: str
    replica: str | None  # None for a model-level alert
    detector: str
    severity: Severity
    state: AlertState
    message: str
    # the numbers that triggered it; read as any JSON value, as every reader took it before the one
    # decoder (a detector's flag is a bool, which Evidence's int admits when it is built)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identity of the alert: one open alert per (model, replica, detector[, rule]).

        Detectors with several rules (kv_pressure) name the rule in ``evidence["rule"]``.
        """
        rule = self.evidence.get("rule")
        base = f"{self.model}/{self.replica or '*'}/{self.detector}"
        return base if rule is None else f"{base}#{rule}"

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data (what :func:`encode_alert` writes, before the JSON)."""
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        """An alert from plain data, by the same rules as :func:`decode_alert`; ValueError when it is not one."""
        return msgspec.convert(data, cls)


@dataclass(frozen=True, slots=True)
class Action:
    """What the router should do for one replica; in force until ``expires_at`` (epoch s)."""

    replica: str
    action: str  # enable_tracing | adjust_batch_policy | prewarm_tokenizer_cache | throttle | isolate | drain
    severity: Severity
    reason: str  # stable text (numbers live in the alert's evidence), so re-sending is a no-op
    params: dict[str, Any] = field(default_factory=dict)
    expires_at: float | None = None  # None: until withdrawn

    @property
    def identity(self) -> tuple[str, str, str, str, tuple[tuple[str, Any], ...]]:
        """Everything but ``expires_at``: two steps that keep the same action in force agree here."""
        return (
            self.replica,
            self.action,
            str(self.severity),
            self.reason,
            tuple(sorted(self.params.items())),
        )

    def to_dict(self) -> dict[str, Any]:
        """The action as plain data, as a correction carries it."""
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        """An action from plain data; ValueError when it is not one."""
        return msgspec.convert(data, cls)


def _as_dict(record: Alert | Action) -> dict[str, Any]:
    # msgspec writes the fields in declaration order and a Severity as its text: the same dict
    # the JSON carries
    data: dict[str, Any] = msgspec.to_builtins(record, enc_hook=_scalar)
    return data


def _scalar(value: Any) -> Any:
    """A numpy scalar in an alert's evidence (a float subclass msgspec does not take) as its Python number."""
    item = getattr(value, "item", None)
    if item is None:
        raise NotImplementedError(f"not plain data: {type(value).__name__}")
    return item()


_ALERT = msgspec.json.Decoder(Alert)


def encode_alert(alert: Alert) -> bytes:
    """The ``llm.alerts`` value of one alert (UTF-8 JSON, fields in declaration order)."""
    # orjson serialises the dataclass itself (no intermediate dict); it writes a float of 1e16 or
    # more as 1e+16 where msgspec writes 1e16, and the records on the topic keep orjson's spelling
    return orjson.dumps(alert)


def decode_alert(value: bytes) -> Alert:
    """An alert from its ``llm.alerts`` value; unknown fields are ignored. Raises ValueError
    (msgspec.ValidationError or DecodeError) naming the problem."""
    return _ALERT.decode(value)


__all__ = ["Action", "Alert", "AlertState", "Evidence", "Severity", "decode_alert", "encode_alert"]
