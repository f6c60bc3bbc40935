"""Hysteresis: when a rule that holds or not, step after step, opens and resolves an alert.

A condition on the threshold's edge must not flap. Per key and rule:

* an alert **opens** once the rule has held for ``persistence`` consecutive steps (a finding that
  sums the evidence of ``steps`` consecutive steps counts as that many);
* it **stays open** while the rule holds, and a step where it does not hold (or cannot be
  evaluated because a signal is missing) only starts the clear count;
* it **resolves** after the rule has not held for ``clear_steps`` consecutive steps (default 2,
  i.e. 10 s at the 5 s step).

>>> h = Hysteresis()
>>> [h.observe(x, persistence=2, clear_steps=2) for x in (True, True, False, True, False, False)]
['none', 'open', 'hold', 'hold', 'hold', 'resolve']
>>> Hysteresis.from_dict(h.to_dict()) == h
True
>>> Hysteresis().observe(True, persistence=2, clear_steps=2, steps=3)  # three steps' evidence in one
'open'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Transition = Literal["none", "open", "hold", "resolve"]


@dataclass(slots=True)
class Hysteresis:
    """Open after ``persistence`` steps that hold, resolve after ``clear_steps`` that do not.

    ``observe`` takes ``True`` (holds), ``False`` (does not) or ``None`` (cannot be evaluated,
    e.g. a missing signal): ``None`` counts as not holding, so an alert whose evidence vanished
    resolves rather than staying open forever, and a persistence count never spans a gap.
    """

    hits: int = 0  # consecutive steps the condition held
    misses: int = 0  # consecutive steps it did not, while open
    is_open: bool = False
    opened_at: float | None = None

    def observe(self, holds: bool | None, *, persistence: int, clear_steps: int, now: float = 0.0,
                steps: int = 1) -> Transition:
        """Fold one step in (``now``: its event time; ``steps``: the consecutive steps, this one the
        last, that a holding finding has proven together); what happened to the alert."""
        if holds:
            self.hits = max(self.hits + 1, steps)
            self.misses = 0
            if self.is_open:
                return "hold"
            if self.hits >= persistence:
                self.is_open = True
                self.opened_at = now
                return "open"
            return "none"
        self.hits = 0
        if not self.is_open:
            return "none"
        self.misses += 1
        if self.misses >= clear_steps:
            self.is_open = False
            self.misses = 0
            self.opened_at = None
            return "resolve"
        return "hold"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {"hits": self.hits, "misses": self.misses, "open": self.is_open, "opened_at": self.opened_at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hysteresis:
        """The inverse of :meth:`to_dict`."""
        return cls(
            hits=int(data.get("hits", 0)),
            misses=int(data.get("misses", 0)),
            is_open=bool(data.get("open", False)),
            opened_at=data.get("opened_at"),
        )


__all__ = ["Hysteresis", "Transition"]
