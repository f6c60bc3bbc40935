"""Routing weights as relative service capacity: how fast each replica serves the pool's typical
request, relative to its peers (``[detectors.weights] formula = "capacity"``; the default is the
seed's formula, :mod:`skewwatch.pipeline.weights`).

A router that sends each request to ``argmin (in_flight + 1) / weight`` (weighted least request,
Envoy's and nginx's) approximates "shortest expected completion" when the weight is the replica's
service rate: its in-flight count says how much work is queued there, the weight how fast it goes.
gRPC's weighted round robin (proposal A58) estimates the same from what each backend reports
(queries per second over utilisation). Here the estimate is the replica's **time per output token**
relative to its pool's, per step:

``ratio = TPOT_p50 / median over the pool's replicas (it included) of TPOT_p50``  (seconds / seconds)

from the window's finished requests (``tpot``); where some replica of the pool lacks one, from the
engines' live time per output token since their previous sample (``live``: vLLM's
``time_per_output_token_seconds`` histogram, where every replica that served has a fresh one), else
the median latency (``latency``: each replica sees the pool's request mix). Decode time is what a
slower GPU or a throttled one changes, and it does not count the wait for a batch slot: the queue is
the router's in-flight count already, and a cost that counted it would count it twice.

**Batch.** A decode step takes longer the more sequences it runs, and an iteration that admits
prompts prefills them first, so a replica running a smaller batch than its peers has quicker tokens
for that alone: a stuck scheduler's batch of 1-2, a replica whose KV cache holds only a few long
prompts. Each replica is compared at its pool's batch: ``log ratio -= slope x min(log batch -
median log batch, 0)``, the pool's median time per token still the reference, where ``slope`` is
the pool's own slope of log time per token on log ``batch_size_mean`` over the last window of
steps, every replica of every step a point
(:class:`~skewwatch.pipeline.relative_speed.BatchSlope`: robust, within [0, 1]). One-sided: a
replica with a larger batch keeps its ratio, because a slower replica's requests last longer and
fill a larger batch (Little's law), and crediting that would hide the slower GPU. Without batch
sizes, with fewer than 3 replicas that have one, or on the latency measure: the plain ratio.

The ratio's log goes into each replica's long-horizon mean (:mod:`skewwatch.pipeline.relative_speed`:
``capacity_horizon_s`` = 300 s, restarted at a change that persists, shrunk toward 0 by what its
noise cannot tell apart: ``capacity_z`` = 2 standard errors, at least ``log(capacity_dead_band)``,
1.05), so ``cost = exp(shrunk mean)`` and

``raw score = 1 / cost``, kept within ``[min_denominator, 1 / min_denominator]`` (a replica at
most 20 x another's share), times its health, normalised over the pool. A replica without an
estimate yet has cost 1, the pool's typical; the decider then shrinks every replica's score toward
the pool's by credibility ``n / (n + k)`` (:mod:`skewwatch.pipeline.pool_evidence`), so a replica
with few requests moves little.

Units: seconds over seconds. The anchor: a replica whose tokens come 1.67 x slower (a GPU at 0.6 x
its peers' speed) costs about 1.6 once its mean has a few minutes of evidence, and gets about 0.6 of
a healthy replica's weight; a sudden 3 x slowdown is a change once the windows have shown it for 30 s.

>>> import numpy as np
>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> from skewwatch.pipeline.detectors.step_columns import StepColumns
>>> def fv(replica, tpot, end):
...     return FeatureVector(model="m", replica=replica, window_start=end - 60.0, window_end=end, count=100,
...                          tpot_p50=tpot, latency_p50=2000.0)
>>> speed = RelativeSpeed()
>>> for end in range(60, 660, 5):  # c's tokens come 3 x slower than a's and b's, for ten minutes (2.86 x their median)
...     step = StepColumns([fv("a", 20.0, end), fv("b", 21.0, end), fv("c", 60.0, end)], [None] * 3)
...     w = capacity_weights(step, ["a", "b", "c"], [(1.0, None)] * 3, WeightConfig(), speed, float(end), 60.0)
>>> [round(w[r].weight, 3) for r in "abc"], round(w["c"].components["cost"], 2)
([0.422, 0.422, 0.155], 2.72)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.relative_speed import RelativeSpeed
from skewwatch.pipeline.weights import ReplicaWeight, WeightConfig

CAPACITY_FIELDS = ("count", "tpot_p50", "latency_p50", "batch_size_mean")  # what capacity_weights reads as columns
CAPACITY_TELEMETRY_FIELDS = ("tpot_p50_s", "tpot_mean_s", "tpot_count")  # ... of telemetry


def service_costs(step: StepColumns) -> tuple[np.ndarray, str]:
    """Each replica's time per output token (seconds; NaN without one) and which measure the pool
    is compared on: ``live`` (the engines' mean time per output token since their previous sample,
    where every replica that served has a fresh one), ``tpot`` (the window's median time per output
    token of its finished requests, where every one has it) or ``latency`` (their median latency)."""
    served = step.column("count") > 0
    tpot = step.column("tpot_p50")
    has_tpot = served & ~np.isnan(tpot)
    if served.any() and has_tpot[served].all():
        return np.where(has_tpot, tpot / 1000.0, np.nan), "tpot"
    live = step.telemetry_column("tpot_p50_s")
    with np.errstate(invalid="ignore"):
        has_live = ~np.isnan(live) & (step.telemetry_column("tpot_count") > 0)
    if served.any() and has_live[served].all():
        return np.where(has_live, live, np.nan), "live"
    return np.where(served, step.column("latency_p50") / 1000.0, np.nan), "latency"


def _live_log_ratios(step: StepColumns) -> npt.NDArray[np.float64] | None:
    """Each replica's live time per output token over its pool's median, in logs (NaN: none): the
    engines' median since their previous sample (vLLM's, SGLang's histograms), else their mean
    (llama.cpp's counters), one field for the whole pool; None where fewer than two replicas have it."""
    counted = step.telemetry_column("tpot_count") > 0
    for name in ("tpot_p50_s", "tpot_mean_s"):
        live = step.telemetry_column(name)
        with np.errstate(invalid="ignore", divide="ignore"):
            has = ~np.isnan(live) & counted & (live > 0)
            if int(has.sum()) >= 2:
                return np.where(has, np.log(live / float(np.median(live[has]))), np.nan)
    return None


class RelativeCosts(NamedTuple):
    """One step's relative service costs, in ``replicas`` order (NaN: none)."""

    service: npt.NDArray[np.float64]  # each replica's time per output token (s), or median latency
    measure: str  # live | tpot | latency (:func:`service_costs`)
    reference: float  # the pool's median of ``service``
    ratio: npt.NDArray[np.float64]  # service / reference
    batch_term: npt.NDArray[np.float64]  # what comparing at the pool's batch took off the log ratio
    cost: npt.NDArray[np.float64]  # exp(the long-horizon mean, shrunk): what the weights read
    guarded: npt.NDArray[np.float64]  # cost within [min_denominator, 1 / min_denominator], 1.0 for none


def relative_costs(step: StepColumns, replicas: Sequence[str], config: WeightConfig, speed: RelativeSpeed,
                   now: float, window_s: float, sample_noise: bool = True) -> RelativeCosts:
    """Each replica's cost relative to its pool (module docstring), ``speed`` updated with this step
    (``sample_noise``: whether its ratios join the pool's noise and batch slope, see
    :meth:`~skewwatch.pipeline.relative_speed.RelativeSpeed.update`)."""
    service, measure = service_costs(step)
    usable = ~np.isnan(service) & (service > 0)
    reference = float(np.median(service[usable])) if usable.any() else float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(usable, service / reference, np.nan) if reference > 0 else np.full(len(replicas), np.nan)
        log_ratio = np.log(ratio)
        log_batch = np.log(step.column("batch_size_mean"))
        log_service = np.log(np.where(usable, service, np.nan))
    log_ratio, batch_term = _at_pool_batch(log_ratio, log_service, log_batch, measure, speed, config, now,
                                           window_s, sample_noise)
    live = _live_log_ratios(step) if measure != "live" else None
    shrunk = speed.update(now, replicas, log_ratio, config, None if measure == "live" else window_s, live,
                          sample_noise)
    cost = np.exp(shrunk)
    bound = config.min_denominator
    guarded = np.where(np.isnan(cost), 1.0, np.clip(cost, bound, 1.0 / bound))
    return RelativeCosts(service, measure, reference, ratio, batch_term, cost, guarded)


def scale_by_speed(weights: dict[str, ReplicaWeight], step: StepColumns, replicas: Sequence[str],
                   config: WeightConfig, speed: RelativeSpeed, now: float, window_s: float,
                   phase: float = 0.0) -> dict[str, ReplicaWeight]:
    """Another formula's weights (``replicas`` order) times each replica's relative speed, ``1 / cost``,
    normalised again (``relative_speed = true``): the seed formula says where load stands now, the
    long-horizon cost how fast the replica serves (a GPU at 0.6 x its peers' speed keeps about 0.6
    of their share at equal load). A replica without an estimate keeps its weight (cost 1).

    The costs are estimated every half window (``window_s / 2``: new requests, not the same ones
    seen again; the estimate weighs each ratio by the seconds since the last, so it is the same
    mean) and kept in between: a five-minute estimate gains nothing from every 5 s step. While a
    change is under way (:meth:`~skewwatch.pipeline.relative_speed.RelativeSpeed.watching`) they are
    estimated every step, so it is followed as the windows show it. A cost
    applies only while the replica's windows do not contradict it
    (:meth:`~skewwatch.pipeline.relative_speed.RelativeSpeed.returning`: a ratio beyond its noise on
    the pool's side of its mean): doubt resolves toward the pool's share, so a replica whose
    slowdown ended regains its share as soon as its window shows it, where the estimate restarts
    half a window later; a noisy window within the noise changes nothing. ``phase``
    (in [0, 1)) shifts the pool's refreshes within the half window (the decider's: from its model's
    name), so a fleet's pools do not all refresh on one step.

    >>> from skewwatch.schemas.feature_vector import FeatureVector
    >>> from skewwatch.pipeline.detectors.step_columns import StepColumns
    >>> def fv(replica, tpot, end):
    ...     return FeatureVector(model="m", replica=replica, window_start=end - 60.0, window_end=end, count=100,
    ...                          tpot_p50=tpot, latency_p50=2000.0)
    >>> speed, even = RelativeSpeed(), {r: ReplicaWeight(r, 1 / 3, 1.0, 1.0, "ok") for r in "abc"}
    >>> for end in range(60, 660, 5):  # c's tokens come 3 x slower than a's and b's
    ...     step = StepColumns([fv("a", 20.0, end), fv("b", 21.0, end), fv("c", 60.0, end)], [None] * 3)
    ...     w = scale_by_speed(dict(even), step, ["a", "b", "c"], WeightConfig(), speed, float(end), 60.0)
    >>> [round(w[r].weight, 3) for r in "abc"], w["c"].reason
    ([0.422, 0.422, 0.155], 'ok; relative speed 0.367')
    """
    on_grid = speed.refresh_due(now, window_s / 2.0, phase)
    if on_grid or speed.watching(now):
        estimate = relative_costs(step, replicas, config, speed, now, window_s, sample_noise=on_grid)
        # a cost applies only while the replica's windows do not contradict it: a ratio beyond its
        # noise on the pool's side of its mean (the start of the run that restarts the estimate
        # half a window later) puts it back at its share now; a ratio within the noise does not
        back = np.asarray(speed.returning(replicas), dtype=bool)
        speed.keep(now, replicas, np.where(back, 1.0, estimate.guarded))
    costs = speed.kept_costs(replicas)
    if all(c == 1.0 for c in costs):
        return weights
    total = sum(weights[r].weight / cost for r, cost in zip(replicas, costs, strict=True))
    if total <= 0:
        return weights
    out: dict[str, ReplicaWeight] = {}
    for replica, cost in zip(replicas, costs, strict=True):
        w = weights[replica]
        if cost == 1.0:
            out[replica] = msgspec.structs.replace(w, weight=w.weight / total)
            continue
        out[replica] = msgspec.structs.replace(
            w, weight=w.weight / cost / total, raw_score=w.raw_score / cost,
            reason=f"{w.reason}; relative speed {1.0 / cost:.3g}", components={**w.components, "speed_cost": cost})
    return out


def capacity_weights(step: StepColumns, replicas: Sequence[str], health: Sequence[tuple[float, str | None]],
                     config: WeightConfig, speed: RelativeSpeed, now: float,
                     window_s: float) -> dict[str, ReplicaWeight]:
    """The pool's weights as relative service capacity (module docstring), in ``replicas`` order;
    ``health``: each replica's (score, note); ``speed`` keeps each replica's long-horizon cost."""
    service, measure, reference, ratio, batch_term, cost, guarded = relative_costs(
        step, replicas, config, speed, now, window_s)
    bound = config.min_denominator
    raws = (1.0 / guarded).tolist()
    scores = [min(max(score, 0.0), 1.0) for score, _ in health]
    total = sum(raw * score for raw, score in zip(raws, scores, strict=True))
    result: dict[str, ReplicaWeight] = {}
    for row, replica in enumerate(replicas):
        notes = []
        if np.isnan(cost[row]):
            notes.append("no estimate yet: the pool's typical")
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
            "ratio": None if np.isnan(ratio[row]) else float(ratio[row]),
            "measure": _MEASURES[measure],
            "batch_term": None if np.isnan(batch_term[row]) else float(batch_term[row]),
            "batch_slope": speed.batch.slope,
        }
        result[replica] = ReplicaWeight(replica, raws[row] * scores[row] / total if total > 0 else 0.0, raws[row],
                                        scores[row], "; ".join(notes) if notes else "ok", components)
    return result


def _at_pool_batch(log_ratio: npt.NDArray[np.float64], log_service: npt.NDArray[np.float64],
                   log_batch: npt.NDArray[np.float64], measure: str,
                   speed: RelativeSpeed, config: WeightConfig, now: float, window_s: float,
                   sample: bool = True) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Each replica's log ratio at its pool's batch (module docstring, "Batch"), and the term taken
    off it (log seconds / seconds; NaN where none was); the plain ratio where fewer than
    ``_MIN_BATCH_REPLICAS`` replicas have both a time per token and a batch size, or the measure is
    the latency (it holds the queue, not a batch's step). ``sample``: whether this step's points join
    the slope's fit (as the pool's noise, one step per refresh of the grid)."""
    term = np.full(len(log_ratio), np.nan)
    if measure == "latency":
        return log_ratio, term
    # the slope from how the pool's times per token move with its batches, across replicas and
    # steps (a burst of load fills every batch and slows every step: the pool's own relation)
    if sample:
        speed.batch.update(now, log_batch, log_service, window_s, config.capacity_z)
    both = np.isfinite(log_ratio) & np.isfinite(log_batch)
    if int(both.sum()) < _MIN_BATCH_REPLICAS:
        return log_ratio, term
    # one-sided: a replica whose batch is smaller than its pool's median is compared at the pool's
    # batch (it is not credited with the speed a small batch gives); one whose batch is larger keeps
    # its ratio, since a slower replica's requests last longer and so fill a larger batch (Little)
    below = np.minimum(log_batch - float(np.median(log_batch[both])), 0.0)
    term = np.where(both, speed.batch.slope * below, np.nan)
    adjusted = np.where(both, log_ratio - np.where(both, term, 0.0), log_ratio)
    # re-centred on the adjusted ratios' median: the pool's typical replica stays the reference (kept
    # on the plain median instead, the lifted small batches pushed healthy peers' ratios below 1)
    finite = np.isfinite(adjusted)
    return (adjusted - float(np.median(adjusted[finite])) if finite.any() else adjusted), term


_MIN_BATCH_REPLICAS = 3  # fewer replicas with a batch size: no pool to compare a batch against
_MEASURES = {"live": 0.0, "tpot": 1.0, "latency": 2.0}  # components are numbers

__all__ = ["CAPACITY_FIELDS", "CAPACITY_TELEMETRY_FIELDS", "RelativeCosts", "capacity_weights", "relative_costs",
           "scale_by_speed", "service_costs"]
