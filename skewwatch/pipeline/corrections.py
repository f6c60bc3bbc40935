"""Routing corrections: when to send the per-model record on ``llm.routing-corrections``.

The record itself, with its one encoder and decoder, is :mod:`skewwatch.schemas.corrections`.

The topic is compacted with key = model, so its latest record per model is the router's
current state: ``weights`` for every replica of the pool and the ``actions`` in force
(each with its ``expires_at``, so an action ends by itself if the worker stops re-sending).

**seq.** Strictly increasing per model and derived from event time, not from a counter in
memory: a step's record has ``seq = int(window_end × 1000)`` (milliseconds), so a worker that
restarts and replays a step re-sends the *same* seq (consumers drop ``seq <= last seen``) and
never goes backwards. ``POST /api/v1/update_weights`` publishes the latest step's correction
with that step's own seq (or re-sends it unchanged when it went out already): every seq the
worker shows was, or will be, published.

**mode** (contract v1.4): ``normal``, or ``panic`` when the pool's guards route to every replica
the evidence does not rule out (too few healthy replicas, or no replica with a positive weight:
:mod:`skewwatch.pipeline.failstatic`); ``mode_reason`` says why.

**When to publish** (:func:`should_publish`): on the first record, when the pool's replicas
change, when any weight moved by more than ``weight_epsilon`` (absolute), when the set of
actions changed (replica, action, severity, reason, params — ``expires_at`` alone is a renewal,
not a change), when the mode changed, when a published action would expire before the next heartbeat while it is
still in force, and at least every ``heartbeat_s`` = 30 s (event time) as a heartbeat.

>>> c = RoutingCorrection(model="m", ts=60.0, seq=step_seq(60.0, None), weights={"a": 0.5, "b": 0.5}, actions=[])
>>> c.seq
60000
>>> RoutingCorrection.from_dict(c.to_dict()) == c
True
>>> moved = RoutingCorrection("m", 65.0, step_seq(65.0, c.seq), {"a": 0.6, "b": 0.4}, [])
>>> publish_reason(c, moved, now=65.0), should_publish(c, c, now=70.0), publish_reason(c, c, now=90.0)
('weights changed', False, 'heartbeat')
"""

from __future__ import annotations

import numpy as np

from skewwatch.config_section import FrozenConfigSection, NonNegative, Positive
from skewwatch.schemas.corrections import RoutingCorrection


class CorrectionConfig(FrozenConfigSection, frozen=True):
    """``[detectors.corrections]``: publication cadence."""

    section = "detectors.corrections"

    heartbeat_s: Positive = 30.0  # published at least every 30 s
    weight_epsilon: NonNegative = 0.01  # ours: a weight change below this is not news
    # each record says how long it is valid (contract v1.9): a reader that has seen nothing newer for
    # this long routes equally; 3 heartbeats, so two lost records do not end it
    valid_for_s: Positive = 90.0

    def __post_init__(self) -> None:
        self._require(self.valid_for_s > self.heartbeat_s, "valid_for_s",
                      "must be above heartbeat_s (a record would expire before the next one is due)")


def step_seq(window_end: float, last_seq: int | None) -> int:
    """The seq of a regular step: its window_end in ms, kept above the last seq issued."""
    seq = round(window_end * 1000)
    return seq if last_seq is None else max(seq, last_seq + 1)


def publish_reason(
    prev: RoutingCorrection | None,
    new: RoutingCorrection,
    now: float,
    heartbeat_s: float = 30.0,
    epsilon: float = 0.01,
) -> str | None:
    """Why ``new`` should be published after ``prev`` (the last one published), or None."""
    if prev is None:
        return "first"
    if prev.weights.keys() != new.weights.keys():  # as sets, without building them
        return "replicas changed"
    if prev.mode != new.mode:
        return "mode changed"
    # as columns (one per replica of the pool, every step): the same test, element by element
    n = len(new.weights)
    now_weights = np.fromiter(new.weights.values(), np.float64, n)
    before = np.fromiter(map(prev.weights.__getitem__, new.weights), np.float64, n)
    if (np.abs(now_weights - before) > epsilon).any():
        return "weights changed"
    prev_actions = {a.identity: a for a in prev.actions}
    new_actions = {a.identity: a for a in new.actions}
    if set(prev_actions) != set(new_actions):
        return "actions changed"
    for identity, action in new_actions.items():
        published = prev_actions[identity].expires_at
        if (published is None) != (action.expires_at is None):
            return "actions changed"
        if (
            published is not None
            and action.expires_at is not None
            and action.expires_at > published
            and published < now + heartbeat_s
        ):
            return "action renewal due"
    if now - prev.ts >= heartbeat_s:
        return "heartbeat"
    return None


def should_publish(
    prev: RoutingCorrection | None,
    new: RoutingCorrection,
    now: float,
    heartbeat_s: float = 30.0,
    epsilon: float = 0.01,
) -> bool:
    """True when ``new`` must go out: a change, a renewal due, or the heartbeat."""
    return publish_reason(prev, new, now, heartbeat_s, epsilon) is not None
