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
from collections.abc import Sequence
from dataclasses import dataclass, field

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


__all__ = ["Demotion", "demote"]
