"""What detectors emit: alerts opening and resolving, and the actions they ask the router for.

The records themselves (:class:`Alert` on ``llm.alerts``, :class:`Action` in a routing correction)
are wire records and live with their encoder and decoder in :mod:`skewwatch.schemas.alerts`; they
are named here too, for the detectors. :class:`DetectorOutput` is what one detector ``update``
gives the decider.

>>> fmt(12.345), fmt(None)
('12.3', 'n/a')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skewwatch.schemas.alerts import Action, Alert, AlertState, Evidence, Severity


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
