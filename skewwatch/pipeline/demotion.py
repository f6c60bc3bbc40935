"""Detections and weights agree: a replica with an open WARNING or CRITICAL alert weighs less than
every healthy replica of its pool.

The weights read 60 s windows of finished requests; a detector that has found a long tail, a stuck
scheduler or KV reloads on a replica knows more, and sooner. So while such an alert is open (any
detector, any rule, severity WARNING or CRITICAL; the decider tracks them from the alerts' open and
resolve records) the replica's published weight is at most ``demote_factor`` x the lowest weight of
a *healthy* replica (no such alert, health 1.0), but never below ``demote_floor`` x an equal share of
the pool: a demoted replica still serves a probing share, so its alert can resolve on evidence, and
when it does its weight is the formula's again on the next correction. The weights are then
normalised again (the same factor for every replica: the order stays).

Repeat demotions lengthen (bounded), as Envoy's outlier detection lengthens repeat ejections: a
replica demoted for the first time (within ``demote_memory_s``) is back at its formula's weight on
the first correction after its alert resolves; the ``k``-th demotion within that memory is held
``base_ejection_s x ejection_multiplier^(k - 2)`` after it (30 s, 60 s, 120 s, ... at most
``max_ejection_s``): a replica whose fault comes and goes proves itself for longer each time
(:class:`Holds`). An alert that opens again within ``demote_episode_gap_s`` (60 s, one window) of
its replica's last resolution continues that demotion and is no repeat: a fault whose evidence moves
in and out of the window (a stuck scheduler between phases) is one fault, and holding it for every
flap would keep the replica down minutes after the fault ends.

Fail static: nothing is demoted in a panic correction, when no replica is healthy, or when more
than ``max_ejection_share`` of the pool would be demoted at once (then it is the pool's traffic, not
those replicas: the correction's weights stay the formula's, and the reason says so).

>>> cfg = WeightConfig()
>>> out = demote([0.25, 0.25, 0.25, 0.25], [False, True, False, False], [True, True, True, True], cfg)
>>> [round(w, 3) for w in out.weights], out.demoted
([0.286, 0.143, 0.286, 0.286], [1])
>>> demote([0.5, 0.5], [True, True], [True, True], cfg).note
'not demoted: 2 of 2 replicas have an open alert (more than max_ejection_share 0.5)'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skewwatch.pipeline.detectors.alerts import Alert, Severity
from skewwatch.pipeline.failstatic import ejection_time
from skewwatch.pipeline.weights import WeightConfig


@dataclass(frozen=True, slots=True)
class Demotion:
    """The weights after demotion (normalised like the input), the rows demoted, and why none was."""

    weights: list[float]
    demoted: list[int] = field(default_factory=list)
    note: str | None = None


def demote(weights: Sequence[float], alerted: Sequence[bool], healthy: Sequence[bool],
           config: WeightConfig) -> Demotion:
    """Demote the ``alerted`` rows below every healthy, un-alerted one (module docstring).

    ``weights``: the pool's published weights (summing to 1, or all 0); ``healthy``: health 1.0.
    """
    n = len(weights)
    rows = [row for row in range(n) if alerted[row] and weights[row] > 0]
    if not rows or not config.demote_on_alert:
        return Demotion(list(weights))
    cap = max(1, math.floor(config.max_ejection_share * n))
    if sum(alerted) > cap:
        return Demotion(list(weights), note=f"not demoted: {sum(alerted)} of {n} replicas have an open alert "
                                             f"(more than max_ejection_share {config.max_ejection_share:g})")
    reference = [weights[row] for row in range(n) if healthy[row] and not alerted[row] and weights[row] > 0]
    if not reference:
        return Demotion(list(weights), note="not demoted: no healthy replica to route to instead")
    lowest = min(reference)
    floor = config.demote_floor / n * sum(weights)
    cap_weight = config.demote_factor * lowest
    # the floor keeps a probing share, but never at the price of staying at or above a healthy replica
    target = max(cap_weight, floor) if floor < lowest else cap_weight
    out = list(weights)
    demoted = []
    for row in rows:
        if out[row] > target:
            out[row] = target
        demoted.append(row)
    total = sum(out)
    scale = sum(weights) / total if total > 0 else 1.0
    return Demotion([w * scale for w in out], demoted)


class Holds:
    """How long each replica stays demoted after its alerts resolve (module docstring).

    >>> holds = Holds(WeightConfig())
    >>> holds.opened("r1", 0.0); holds.resolved("r1", 60.0); holds.held("r1", 61.0)
    0.0
    False
    >>> holds.opened("r1", 200.0); holds.resolved("r1", 260.0); holds.held("r1", 289.0), holds.held("r1", 291.0)
    30.0
    (True, False)
    >>> holds.opened("r1", 400.0); holds.resolved("r1", 460.0)
    60.0
    >>> holds.opened("r1", 480.0); holds.resolved("r1", 490.0)  # 20 s after the last: the same demotion
    60.0
    """

    def __init__(self, config: WeightConfig) -> None:
        self.config = config
        self._begun: dict[str, list[float]] = {}  # replica -> when its demotions within the memory began
        self._until: dict[str, float] = {}  # replica -> held demoted until (event time)
        self._resolved: dict[str, float] = {}  # replica -> when its last demotion's alerts resolved

    def opened(self, replica: str, now: float) -> None:
        """``replica`` had no open demoting alert and has one now."""
        horizon = now - self.config.demote_memory_s
        begun = [t for t in self._begun.get(replica, ()) if t > horizon]
        last = self._resolved.get(replica)
        if not begun or last is None or now - last > self.config.demote_episode_gap_s:
            begun.append(now)  # a new demotion; within the gap it continues the last one
        self._begun[replica] = begun
        self._until.pop(replica, None)

    def resolved(self, replica: str, now: float) -> float:
        """``replica``'s last demoting alert resolved: how long it stays demoted (s)."""
        cfg = self.config
        self._resolved[replica] = now
        k = sum(1 for t in self._begun.get(replica, ()) if t > now - cfg.demote_memory_s)
        hold = 0.0 if k < 2 else ejection_time(k - 1, cfg)  # the second demotion is held as a first ejection
        if hold > 0:
            self._until[replica] = now + hold
        return hold

    def held(self, replica: str, now: float) -> bool:
        until = self._until.get(replica)
        if until is None:
            return False
        if now >= until:
            del self._until[replica]
            return False
        return True

    def holding(self, now: float) -> list[str]:
        """The replicas held demoted at ``now``."""
        return [replica for replica in list(self._until) if self.held(replica, now)]

    def forget(self, replica: str) -> None:
        self._begun.pop(replica, None)
        self._until.pop(replica, None)
        self._resolved.pop(replica, None)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (a checkpoint)."""
        return {"begun": {r: list(ts) for r, ts in self._begun.items()}, "until": dict(self._until),
                "resolved": dict(self._resolved)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self._begun = {str(r): [float(t) for t in ts] for r, ts in dict(state.get("begun") or {}).items()}
        self._until = {str(r): float(t) for r, t in dict(state.get("until") or {}).items()}
        self._resolved = {str(r): float(t) for r, t in dict(state.get("resolved") or {}).items()}


DEMOTING = frozenset({Severity.WARNING, Severity.CRITICAL})  # an open alert of these demotes its replica


class AlertDemotions:
    """Which replicas an open WARNING or CRITICAL alert demotes, as ``detector[#rule]`` labels, kept
    from the alerts' open and resolve records, and their :class:`Holds`.

    >>> demotions = AlertDemotions(WeightConfig())
    >>> opened = Alert(0.0, "m", "r1", "long_tail", Severity.WARNING, "open", "", {"rule": "tail"})
    >>> demotions.track([opened], 0.0); demotions.alerted
    {'r1': {'long_tail#tail'}}
    >>> demotions.track([Alert(60.0, "m", "r1", "long_tail", Severity.WARNING, "resolved", "", {"rule": "tail"})],
    ...                 60.0); demotions.alerted, demotions.any(61.0)
    ({}, False)
    """

    def __init__(self, config: WeightConfig) -> None:
        self.alerted: dict[str, set[str]] = {}
        self.holds = Holds(config)  # when each replica's demotions began, and until when one is held

    def track(self, alerts: Sequence[Alert], now: float) -> None:
        """This step's alert transitions (replica alerts; pool alerts have none)."""
        for alert in alerts:
            if alert.replica is None:
                continue
            rule = alert.evidence.get("rule")
            label = alert.detector if rule is None else f"{alert.detector}#{rule}"
            labels = self.alerted.get(alert.replica)
            if alert.state == "open" and alert.severity in DEMOTING:
                if labels is None:
                    labels = self.alerted[alert.replica] = set()
                    self.holds.opened(alert.replica, now)
                labels.add(label)
            elif labels is not None:  # resolved, or re-opened at INFO
                labels.discard(label)
                if not labels:
                    del self.alerted[alert.replica]
                    self.holds.resolved(alert.replica, now)

    def rebuild(self, open_alerts: Mapping[str, Mapping[str, Severity]]) -> None:
        """The labels again from each detector's open alerts (``name -> {"model/replica[#rule]":
        severity}``), after a checkpoint is loaded."""
        self.alerted = {}
        for name, keys in open_alerts.items():
            for key, severity in keys.items():
                model_replica, _, rule = key.partition("#")
                replica = model_replica.rpartition("/")[2]
                if severity in DEMOTING and replica:
                    self.alerted.setdefault(replica, set()).add(f"{name}#{rule}" if rule else name)

    def any(self, now: float) -> bool:
        """Whether a replica is demoted by an alert or held now."""
        return bool(self.alerted) or bool(self.holds.holding(now))

    def demoted(self, replica: str, now: float) -> bool:
        return bool(self.alerted.get(replica)) or self.holds.held(replica, now)

    def forget(self, replica: str) -> None:
        self.alerted.pop(replica, None)
        self.holds.forget(replica)


__all__ = ["DEMOTING", "AlertDemotions", "Demotion", "Holds", "demote"]
