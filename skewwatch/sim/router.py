"""The simulator's router: round robin, least connections, or the pipeline's dynamic weights.

The seed's routing table (seed §1: round robin, least connections, multi-signal dynamic weights)
is reproduced with a router inside the fleet simulator. Each policy picks one
replica of a model's pool per arriving request:

- ``round_robin``: the pool in turn.
- ``least_connections``: fewest requests in flight (waiting + running); ties go to the replica
  after the last one picked, so equal replicas share evenly.
- ``dynamic``: smooth weighted round robin (nginx's algorithm: deterministic, and any window of
  picks follows the weights closely, unlike random sampling) over the weights last applied with
  :meth:`DynamicWeightRouter.apply_correction`, i.e. a ``llm.routing-corrections`` record
  (``weights`` per replica and ``actions``; ``drain`` and ``isolate`` take a replica out until the
  action expires, ``throttle`` halves its weight). Before the first correction, or when every
  weight of the pool is 0, it falls back to least connections and counts the fallback, so no
  request is dropped for want of a weight.
- ``dynamic_least_request``: the same corrections (weights and actions, the same fallback),
  applied as *weighted least request* (Envoy's and nginx's ``least_conn`` with weights): each
  request goes to the replica with the fewest requests in flight per unit of weight,
  ``argmin (in_flight + 1) / weight``, ties to the replica after the last one picked. The
  weights (refreshed every 5 s step, from 60 s windows) say how much a replica should get; the
  router's own in-flight counts say, between two corrections, whether it is keeping up. Smooth
  weighted round robin keeps sending a replica its share whatever its queue, so a replica whose
  scheduler stalls gets its share until the weights catch up (a minute or more); weighted least
  request stops sending as soon as its queue stands out.

Pure and deterministic: no clock (the caller passes event time), no randomness.

>>> r = DynamicWeightRouter()
>>> r.apply_correction({"model": "m", "weights": {"a": 0.75, "b": 0.25}, "actions": []}, now=0.0)
>>> "".join(["ab"[r.choose("m", ["a", "b"], [0, 0], now=1.0)] for _ in range(8)])
'aabaaaba'
>>> wlr = WeightedLeastRequestRouter()
>>> wlr.apply_correction({"model": "m", "weights": {"a": 0.75, "b": 0.25}, "actions": []}, now=0.0)
>>> wlr.choose("m", ["a", "b"], [2, 0], now=1.0), wlr.choose("m", ["a", "b"], [3, 0], now=1.0)
(0, 1)
>>> RoundRobinRouter().choose("m", ["a", "b"], [5, 0], now=0.0)
0
>>> LeastConnectionsRouter().choose("m", ["a", "b"], [5, 0], now=0.0)
1
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

POLICIES = ("round_robin", "least_connections", "dynamic", "dynamic_least_request")
CORRECTION_POLICIES = ("dynamic", "dynamic_least_request")  # the routing loop is closed: they read corrections
THROTTLE_FACTOR = 0.5  # a throttled replica keeps half its weight (seed §4.3: "throttle and retry")


class Router(Protocol):
    def choose(self, model: str, pool: Sequence[str], inflight: Sequence[int], now: float) -> int:
        """Index into ``pool`` of the replica that gets the next request."""
        ...


class RoundRobinRouter:
    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, model: str, pool: Sequence[str], inflight: Sequence[int], now: float) -> int:
        i = self._next.get(model, 0) % len(pool)
        self._next[model] = i + 1
        return i


class LeastConnectionsRouter:
    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def choose(self, model: str, pool: Sequence[str], inflight: Sequence[int], now: float) -> int:
        n = len(pool)
        start = (self._last.get(model, -1) + 1) % n
        best = min(range(n), key=lambda k: (inflight[(start + k) % n], k))
        picked = (start + best) % n
        self._last[model] = picked
        return picked


class DynamicWeightRouter:
    """Smooth weighted round robin over the latest routing correction per model."""

    def __init__(self) -> None:
        self._weights: dict[str, dict[str, float]] = {}  # model -> replica -> weight
        self._blocked: dict[str, float] = {}  # replica -> event time its drain/isolate ends
        self._throttled: dict[str, float] = {}  # replica -> event time its throttle ends
        self._current: dict[str, dict[str, float]] = {}  # smooth-WRR state per model
        self._fallback = LeastConnectionsRouter()
        self.fallbacks = 0  # picks made without a usable weight
        self.corrections = 0

    def apply_correction(self, record: Mapping[str, Any], now: float) -> None:
        """Take a ``llm.routing-corrections`` value: ``{model, weights, actions, ...}``."""
        model = str(record["model"])
        self._weights[model] = {str(k): max(float(v), 0.0) for k, v in dict(record.get("weights") or {}).items()}
        for action in record.get("actions") or []:
            replica = str(action.get("replica"))
            expires = action.get("expires_at")
            until = math.inf if expires is None else float(expires)
            kind = action.get("action")
            if kind in ("drain", "isolate"):
                self._blocked[replica] = max(until, self._blocked.get(replica, -math.inf))
            elif kind == "throttle":
                self._throttled[replica] = max(until, self._throttled.get(replica, -math.inf))
        self.corrections += 1

    def weights(self, model: str, pool: Sequence[str], now: float) -> list[float]:
        """The effective weight of each replica of ``pool`` at ``now`` (after actions)."""
        given = self._weights.get(model, {})
        out = []
        for replica in pool:
            w = given.get(replica, 0.0)
            if self._blocked.get(replica, -math.inf) > now:
                w = 0.0
            elif self._throttled.get(replica, -math.inf) > now:
                w *= THROTTLE_FACTOR
            out.append(w)
        return out

    def choose(self, model: str, pool: Sequence[str], inflight: Sequence[int], now: float) -> int:
        weights = self.weights(model, pool, now)
        total = sum(weights)
        if total <= 0.0:
            self.fallbacks += 1
            return self._fallback.choose(model, pool, inflight, now)
        current = self._current.setdefault(model, {})
        best, best_value = 0, -math.inf
        for i, (replica, w) in enumerate(zip(pool, weights, strict=True)):
            value = current.get(replica, 0.0) + w
            current[replica] = value
            if value > best_value:
                best, best_value = i, value
        current[pool[best]] -= total
        return best


class WeightedLeastRequestRouter(DynamicWeightRouter):
    """The latest routing correction per model, applied as weighted least request."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, int] = {}  # model -> index of the last pick, for rotating ties

    def choose(self, model: str, pool: Sequence[str], inflight: Sequence[int], now: float) -> int:
        weights = self.weights(model, pool, now)
        if sum(weights) <= 0.0:
            self.fallbacks += 1
            return self._fallback.choose(model, pool, inflight, now)
        n = len(pool)
        start = (self._last.get(model, -1) + 1) % n
        # ties rotate like least connections, so equal replicas at equal load share evenly
        best_k = min((k for k in range(n) if weights[(start + k) % n] > 0.0),
                     key=lambda k: ((inflight[(start + k) % n] + 1) / weights[(start + k) % n], k))
        picked = (start + best_k) % n
        self._last[model] = picked
        return picked


def make_router(policy: str) -> RoundRobinRouter | LeastConnectionsRouter | DynamicWeightRouter:
    if policy == "round_robin":
        return RoundRobinRouter()
    if policy == "least_connections":
        return LeastConnectionsRouter()
    if policy == "dynamic":
        return DynamicWeightRouter()
    if policy == "dynamic_least_request":
        return WeightedLeastRequestRouter()
    raise ValueError(f"unknown routing policy {policy!r} (known: {', '.join(POLICIES)})")
