"""Routing weights as relative service capacity: how fast each replica serves the pool's typical
request, relative to its peers (``[detectors.weights] formula = "capacity"``; the default is the
seed's formula, :mod:`skewwatch.pipeline.weights`).

A router that sends each request to ``argmin (in_flight + 1) / weight`` (weighted least request,
Envoy's and nginx's) approximates "shortest expected completion" when the weight is the replica's
service rate: its in-flight count says how much work is queued there, the weight how fast it goes.
gRPC's weighted round robin (proposal A58) estimates the same from what each backend reports
(queries per second over utilisation). Here the estimate is the replica's **service time of the
pool's typical request** from its own finished requests, per 60 s window:

``service_s = TPOT_p50 x (C - 1) + TTFT_p50``  (seconds)

with ``C`` the pool's mean output length in tokens (the requests' count-weighted mean over the
replicas' windows; TPOT counts the tokens after the first) and each replica's median time per
output token and median time to first token (prefill, and any wait for a batch slot). Where some
replica of the pool lacks a TPOT or TTFT, the pool's replicas are compared on their median
end-to-end latency instead (the same request mix, since each replica sees the pool's traffic).
Then

``cost = service_s / median over the pool's replicas (it included) of service_s``

shrunk toward 1 by what the pool's own spread explains: ``log cost`` moves toward 0 by the larger of
``log(capacity_dead_band)`` (1.2: the ordinary difference between two windows' medians) and
``capacity_mad_z`` (3) robust standard deviations of the pool's log costs (1.4826 x their median
absolute deviation, which one slow replica among healthy ones barely moves), so a healthy replica
is at an equal share and a replica 3 x slower than its peers still costs about 2.5;

and ``raw score = 1 / cost``, kept within ``[min_denominator, 1 / min_denominator]`` (a replica at
most 20 x another's share), times its health, normalised over the pool. A replica without a
service time this step (an empty window) has cost 1, the pool's typical; the decider then holds its
last score, and shrinks every replica's score toward the pool's by credibility ``n / (n + k)``
(:mod:`skewwatch.pipeline.pool_evidence`), so a window of a few requests moves little.

Units: seconds over seconds. The anchor: a replica whose tokens come 3 x slower (a throttled GPU)
costs about 3 and gets a third of a healthy replica's weight; a replica whose first tokens wait in a
queue costs more by that wait.

>>> import numpy as np
>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> from skewwatch.pipeline.detectors.step_columns import StepColumns
>>> def fv(replica, tpot):
...     return FeatureVector(model="m", replica=replica, window_start=0.0, window_end=60.0, count=100,
...                          tpot_p50=tpot, ttft_p50=200.0, completion_tokens_mean=101.0)
>>> step = StepColumns([fv("a", 20.0), fv("b", 20.0), fv("c", 60.0)], [None] * 3)
>>> w = capacity_weights(step, ["a", "b", "c"], [(1.0, None)] * 3, WeightConfig())
>>> [round(w[r].weight, 3) for r in "abc"], round(w["c"].components["cost"], 2)
([0.412, 0.412, 0.176], 2.35)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.weights import ReplicaWeight, WeightConfig

CAPACITY_FIELDS = ("count", "tpot_p50", "ttft_p50", "latency_p50", "completion_tokens_mean")


def service_times(step: StepColumns) -> tuple[np.ndarray, str]:
    """Each replica's service time of the pool's typical request (seconds; NaN without one) and
    which measure the pool is compared on (``tpot+ttft`` or ``latency``)."""
    count = step.column("count")
    tpot, ttft = step.column("tpot_p50"), step.column("ttft_p50")
    served = count > 0
    completion = step.column("completion_tokens_mean")
    known = served & ~np.isnan(completion)
    tokens = float(np.sum(count[known] * completion[known]) / np.sum(count[known])) if known.any() else 1.0
    with np.errstate(invalid="ignore"):
        both = served & ~np.isnan(tpot) & ~np.isnan(ttft)
    if served.any() and both[served].all():
        return np.where(both, (tpot * max(tokens - 1.0, 0.0) + ttft) / 1000.0, np.nan), "tpot+ttft"
    latency = step.column("latency_p50")
    return np.where(served, latency / 1000.0, np.nan), "latency"


def capacity_weights(step: StepColumns, replicas: Sequence[str], health: Sequence[tuple[float, str | None]],
                     config: WeightConfig) -> dict[str, ReplicaWeight]:
    """The pool's weights as relative service capacity (module docstring), in ``replicas`` order;
    ``health``: each replica's (score, note)."""
    service, measure = service_times(step)
    usable = ~np.isnan(service) & (service > 0)
    reference = float(np.median(service[usable])) if usable.any() else float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        cost = np.where(usable, service / reference, np.nan) if reference > 0 else np.full(len(replicas), np.nan)
        log_cost = np.log(cost)
    # what the pool's own spread explains is no difference: log costs shrink toward 0 by the larger of
    # the dead band and capacity_mad_z robust standard deviations of the pool's log costs
    spread = log_cost[usable]
    sigma = 1.4826 * float(np.median(np.abs(spread - np.median(spread)))) if len(spread) >= 3 else 0.0
    band = max(np.log(config.capacity_dead_band), config.capacity_mad_z * sigma)
    shrunk = np.sign(log_cost) * np.maximum(np.abs(log_cost) - band, 0.0)
    cost = np.where(np.isnan(cost), np.nan, np.exp(shrunk))
    bound = config.min_denominator
    guarded = np.where(np.isnan(cost), 1.0, np.clip(cost, bound, 1.0 / bound))
    raws = (1.0 / guarded).tolist()
    scores = [min(max(score, 0.0), 1.0) for score, _ in health]
    total = sum(raw * score for raw, score in zip(raws, scores, strict=True))
    result: dict[str, ReplicaWeight] = {}
    for row, replica in enumerate(replicas):
        notes = []
        if np.isnan(cost[row]):
            notes.append("no service time this step: the pool's typical")
        elif cost[row] != guarded[row]:
            notes.append(f"cost {cost[row]:.3g} kept within [{bound:g}, {1.0 / bound:g}]")
        score, note = health[row]
        if scores[row] < 1.0:
            notes.append(f"health {scores[row]:g}" + (f" ({note})" if note else ""))
        if total <= 0:
            notes.append("pool has no replica with a positive weight")
        components: dict[str, float | None] = {
            "service_s": None if np.isnan(service[row]) else float(service[row]),
            "cost": None if np.isnan(cost[row]) else float(cost[row]),
            "reference_s": None if np.isnan(reference) else reference,
            "band": float(band),
            "latency_measure": 1.0 if measure == "latency" else 0.0,
        }
        result[replica] = ReplicaWeight(replica, raws[row] * scores[row] / total if total > 0 else 0.0, raws[row],
                                        scores[row], "; ".join(notes) if notes else "ok", components)
    return result


__all__ = ["CAPACITY_FIELDS", "capacity_weights", "service_times"]
