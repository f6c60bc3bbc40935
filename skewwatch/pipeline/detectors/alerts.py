"""What detectors emit: alerts opening and resolving, and the actions they ask the router for.

An :class:`Alert` is one record on ``llm.alerts``; an :class:`Action` is what a routing correction
carries for one replica, in force until ``expires_at``. Both round-trip through plain dicts
(the wire format).

>>> alert = Alert(60.0, "m", "r1", "long_tail", Severity.WARNING, "open", "p99 > 3 x p50", {"p99": 900.0})
>>> alert.key, Alert.from_dict(alert.to_dict()) == alert
('m/r1/long_tail', True)
>>> fmt(12.345), fmt(None)
('12.3', 'n/a')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

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
    evidence: Evidence = field(default_factory=dict)  # the numbers that triggered it

    @property
    def key(self) -> str:
        """Identity of the alert: one open alert per (model, replica, detector[, rule]).

        Detectors with several rules (kv_pressure) name the rule in ``evidence["rule"]``.
        """
        rule = self.evidence.get("rule")
        base = f"{self.model}/{self.replica or '*'}/{self.detector}"
        return base if rule is None else f"{base}#{rule}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "model": self.model,
            "replica": self.replica,
            "detector": self.detector,
            "severity": str(self.severity),
            "state": self.state,
            "message": self.message,
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        state = data["state"]
        if state not in ("open", "resolved"):
            raise ValueError(f"alert state must be open or resolved, got {state!r}")
        return cls(
            ts=float(data["ts"]),
            model=data["model"],
            replica=data.get("replica"),
            detector=data["detector"],
            severity=Severity(data["severity"]),
            state=state,
            message=data["message"],
            evidence=dict(data.get("evidence") or {}),
        )


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
        return {
            "replica": self.replica,
            "action": self.action,
            "severity": str(self.severity),
            "reason": self.reason,
            "params": dict(self.params),
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Action:
        expires = data.get("expires_at")
        return cls(
            replica=data["replica"],
            action=data["action"],
            severity=Severity(data["severity"]),
            reason=data.get("reason", ""),
            params=dict(data.get("params") or {}),
            expires_at=None if expires is None else float(expires),
        )


@dataclass(slots=True)
class DetectorOutput:
    """What one ``update`` produced: alert transitions and the actions in force."""

    alerts: list[Alert] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)

    def extend(self, other: DetectorOutput) -> None:
        self.alerts.extend(other.alerts)
        self.actions.extend(other.actions)


def fmt(value: float | None, digits: int = 1) -> str:
    """A number for a message: fixed digits, 'n/a' when unknown."""
    return "n/a" if value is None else f"{value:.{digits}f}"


__all__ = ["Action", "Alert", "AlertState", "DetectorOutput", "Evidence", "Severity", "fmt"]
