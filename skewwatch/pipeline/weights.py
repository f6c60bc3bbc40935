"""Dynamic routing weights per replica, normalised within each model's pool (seed §1).

Seed (Go, an Envoy WASM filter)::

    normMem := math.Min(memUsed/16e9, 1.0)         // "assume A100 16 GB"
    normQueue := math.Min(queueLen/32, 1.0)        // max safe queue depth
    normLatency := math.Min(latencyMs/2000, 1.0)   // 2 s reference latency
    return 1.0 / (0.4*normMem + 0.3*normQueue + 0.3*normLatency)

Here, per replica and step:

* ``mem = min(memory_used / memory_total, 1)`` from the replica's telemetry, using the GPU's
  real total instead of the seed's hard-coded 16e9, only when the sample is fresh (at most
  ``telemetry_max_age_s`` = 3 telemetry intervals of 5 s old);
* ``queue = min(queue_length / 32, 1)`` from the window's mean ``queue_length`` on request
  events, else the engine's telemetry;
* ``latency = min(latency_mean / 2000 ms, 1)`` from the 60 s window (the seed's
  ``avg_latency_1m``).

**Missing signals.** When a signal is missing the formula runs on the ones present, with their
coefficients rescaled to the same total (0.4·mem + 0.3·queue + 0.3·latency without ``mem``
becomes 1.0·(0.3·queue + 0.3·latency)/0.6), so a replica without telemetry is compared on
the same scale rather than looking idle; the reason says which signal was missing and why.
With no signal at all the replica counts as fully loaded (denominator 1, the seed's worst).

**Guard.** An idle replica has a denominator of 0 and the seed's weight is infinite. The
denominator is floored at ``min_denominator`` = 0.05: a replica at most 20× the weight of a
fully loaded one, and all idle replicas are equal.

**Health and normalisation.** ``weight ∝ raw_score × health`` (health from
:mod:`skewwatch.pipeline.health`: 1.0, 0.9 throttle, 0.4 isolate, 0.0 drain), normalised to sum
to 1 over the model's pool. If no replica has a positive score every weight here is 0 and the
reason says so; the decider never publishes that (:mod:`skewwatch.pipeline.failstatic`).

This module is the formula alone. What the decider adds on top, for every profile: a silent
replica's staleness from its own arrival rate (:mod:`skewwatch.pipeline.staleness`), its last
score held while its silence is plausible, credibility weighting toward the pool's score when the
window holds few requests (:mod:`skewwatch.pipeline.credibility`), and the pool's guards
(ejection cap, panic threshold, never all-zero: :mod:`skewwatch.pipeline.failstatic`). Their
settings are fields of :class:`WeightConfig` too.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> fv = FeatureVector(model="m", replica="a", window_start=0.0, window_end=60.0, count=10,
...                    step_count=2, latency_mean=1000.0, queue_length_mean=16.0)
>>> tel = TelemetrySample(ts=59.0, replica="a", source="nvml", memory_used_bytes=40e9,
...                       memory_total_bytes=80e9)
>>> w = compute_weights([WeightInput("a", fv, tel, telemetry_age_s=1.0)])["a"]
>>> round(w.raw_score, 3), w.weight, w.reason
(2.0, 1.0, 'ok')
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec import Meta

from skewwatch.config_section import FrozenConfigSection, NonNegative, Positive, Unit
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

ENGINE_SOURCES = ("vllm", "sglang", "tgi", "llamacpp", "simulated")


class WeightConfig(FrozenConfigSection, frozen=True):
    """``[detectors.weights]``: the seed's coefficients and references, plus our guards."""

    section = "detectors.weights"

    # "seed" (this module's formula) or "capacity" (pipeline/capacity.py: relative service capacity; it
    # finds slow replicas the seed's formula misses, and moves healthy ones more: bench/README.md)
    formula: Literal["capacity", "seed"] = "seed"
    # the seed formula's score times the replica's relative decode speed (pipeline/capacity.py
    # ``scale_by_speed``: the capacity formula's long-horizon estimate; a slower GPU carries less of
    # the pool while its queue, memory and latency say where load stands now); the seed profile: off
    relative_speed: bool = True
    capacity_horizon_s: Positive = 300.0  # capacity: time constant of each replica's mean cost (restarted at a change)
    capacity_dead_band: Annotated[float, Meta(ge=1)] = 1.05  # ... costs within this factor of the pool's are equal
    capacity_z: NonNegative = 2.0  # ... or within this many standard errors of the replica's mean cost
    mem_coef: NonNegative = 0.4  # seed
    queue_coef: NonNegative = 0.3  # seed
    latency_coef: NonNegative = 0.3  # seed
    queue_cap: Positive = 32.0  # seed: max safe queue depth
    latency_ref_ms: Positive = 2000.0  # seed: 2 s reference latency
    min_denominator: Positive = 0.05  # ours: idle guard, weight <= 20x a fully loaded replica
    telemetry_max_age_s: Positive = 15.0  # ours: 3 intervals of 5 s
    # staleness (pipeline/staleness.py): stale when P(silence | own rate) < stale_probability
    liveness_from_telemetry: bool = True  # a fresh engine telemetry sample: alive, never stale
    stale_probability: Annotated[float, Meta(gt=0, lt=1)] = 1e-4  # false stales per gap of a healthy Poisson replica
    stale_min_requests: Annotated[float, Meta(ge=1)] = 10.0  # fewer (decayed) requests: no silence judged
    stale_min_s: Positive = 15.0  # no silence shorter than 3 steps is judged (resolution, a missed hand-off)
    stale_gap_factor: NonNegative = 2.0  # nor one shorter than this x the longest recent gap (bursty traffic)
    rate_horizon_s: Positive = 600.0  # time constant of the arrival-rate estimate
    # credibility (pipeline/credibility.py): z = n / (n + k); 0 = no shrinking
    credibility_k: NonNegative = 16.0
    # the pool's guards (pipeline/failstatic.py), after Envoy's outlier detection defaults
    panic_threshold: Unit = 0.5  # fewer healthy replicas than this share: route to all (mode panic)
    max_ejection_share: Unit = 0.5  # at most max(1, floor(share x pool)) ejected at once
    base_ejection_s: Positive = 30.0  # an ejection lasts at least this ...
    ejection_multiplier: Annotated[float, Meta(ge=1)] = 2.0  # ... times this per repeat ...
    max_ejection_s: Positive = 300.0  # ... and at most this
    # detections and weights agree (pipeline/demotion.py): a replica with an open WARNING or CRITICAL
    # alert weighs at most demote_factor x the lowest healthy replica, at least demote_floor x an equal share
    demote_on_alert: bool = True
    demote_factor: Annotated[float, Meta(gt=0, lt=1)] = 0.5
    demote_floor: Annotated[float, Meta(ge=0, lt=1)] = 0.1
    # repeat demotions lengthen like ejections: the k-th demotion begun within demote_memory_s stays
    # base_ejection_s x ejection_multiplier^(k - 2) (at most max_ejection_s) after its alert resolves;
    # the first is lifted on resolution
    demote_memory_s: Positive = 600.0
    # a demotion begun within this of the replica's last resolution continues that episode and is no
    # repeat: one fault whose alert flaps as its evidence moves in and out of a 60 s window
    demote_episode_gap_s: NonNegative = 60.0

    def __post_init__(self) -> None:
        self._require(self.mem_coef + self.queue_coef + self.latency_coef > 0, "mem_coef",
                      "with queue_coef and latency_coef sums to 0 (every weight would be the same)")
        self._require(self.max_ejection_s >= self.base_ejection_s, "max_ejection_s", "must be >= base_ejection_s")


@dataclass(frozen=True, slots=True)
class WeightInput:
    """Everything the weight of one replica depends on at one step."""

    replica: str
    features: FeatureVector | None  # None: no summary from this replica this step
    telemetry: TelemetrySample | None = None
    telemetry_age_s: float | None = None  # event-time age of the sample; None when unknown
    health: float = 1.0
    health_note: str | None = None  # e.g. "isolate: cudaErrorMemoryAllocation"


class ReplicaWeight(msgspec.Struct, gc=False):
    """One replica's weight, with how it was computed (read only by convention). One is built per
    replica and step: a msgspec Struct is built in C, cheaper than a slotted dataclass, and
    (holding no reference cycle: its components are numbers) is not tracked by the cyclic GC."""

    replica: str
    weight: float  # normalised within the model's pool (sums to 1, or all 0)
    raw_score: float  # 1 / guarded denominator, before health and normalisation
    health: float
    reason: str  # "ok", or what is notable: missing signals, health, floor; the decider adds its guards
    components: dict[str, float | None] = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "weight": self.weight,
            "raw_score": self.raw_score,
            "health": self.health,
            "reason": self.reason,
            "components": dict(self.components),
        }


def telemetry_is_fresh(age_s: float | None, config: WeightConfig) -> bool:
    return age_s is not None and age_s <= config.telemetry_max_age_s


def _mem(inp: WeightInput, config: WeightConfig) -> tuple[float | None, str | None]:
    if inp.telemetry is None:
        return None, "mem missing (no telemetry)"
    if not telemetry_is_fresh(inp.telemetry_age_s, config):
        age = "unknown" if inp.telemetry_age_s is None else f"{inp.telemetry_age_s:.0f} s"
        return None, f"mem missing (telemetry stale, age {age})"
    ratio = inp.telemetry.memory_ratio
    if ratio is None:
        return None, "mem missing (telemetry without memory used/total)"
    return min(ratio, 1.0), None


def _queue(inp: WeightInput, config: WeightConfig) -> tuple[float | None, str | None]:
    fv = inp.features
    if fv is not None and fv.queue_length_mean is not None:
        queue = fv.queue_length_mean
    elif (
        inp.telemetry is not None
        and inp.telemetry.queue_length is not None
        and telemetry_is_fresh(inp.telemetry_age_s, config)
    ):
        queue = float(inp.telemetry.queue_length)
    else:
        return None, "queue missing (not reported)"
    return min(max(queue, 0.0) / config.queue_cap, 1.0) + 0.0, None  # + 0.0: a queue of -0.0 is 0.0


def _latency(inp: WeightInput, config: WeightConfig) -> tuple[float | None, str | None]:
    fv = inp.features
    if fv is None or fv.latency_mean is None or math.isnan(fv.latency_mean):
        return None, "latency missing (empty window)"
    return min(max(fv.latency_mean, 0.0) / config.latency_ref_ms, 1.0), None


def load_denominator(inp: WeightInput, config: WeightConfig) -> tuple[float, dict[str, float | None], list[str]]:
    """The seed's denominator over the signals present (coefficients rescaled), unguarded.

    >>> d, comps, notes = load_denominator(WeightInput("a", None), WeightConfig())
    >>> d, notes[-1]
    (1.0, 'no load signal: treated as fully loaded')
    """
    # the three signals in the seed's order (mem, queue, latency), summed in that order
    mem, mem_note = _mem(inp, config)
    queue, queue_note = _queue(inp, config)
    latency, latency_note = _latency(inp, config)
    components: dict[str, float | None] = {"mem": mem, "queue": queue, "latency": latency}
    notes: list[str] = []
    present_coef = weighted = 0.0
    for coef, value, note in (
        (config.mem_coef, mem, mem_note),
        (config.queue_coef, queue, queue_note),
        (config.latency_coef, latency, latency_note),
    ):
        if value is None:
            if note is not None:
                notes.append(note)
        else:
            present_coef += coef
            weighted += coef * value
    if present_coef <= 0:
        notes.append("no load signal: treated as fully loaded")
        return 1.0, components, notes
    total_coef = config.mem_coef + config.queue_coef + config.latency_coef
    return total_coef * weighted / present_coef, components, notes


Row = tuple[float, float, dict[str, float | None], list[str]]  # raw score, raw x health, components, notes


def _row(inp: WeightInput, cfg: WeightConfig) -> Row:
    """One replica's score before normalisation, with its components and notes."""
    denominator, components, notes = load_denominator(inp, cfg)
    if denominator < cfg.min_denominator:
        notes.append(f"denominator {denominator:.3f} floored at {cfg.min_denominator:g} (idle)")
    guarded = max(denominator, cfg.min_denominator)
    components["denominator"] = denominator
    raw = 1.0 / guarded
    health = min(max(inp.health, 0.0), 1.0)
    if health < 1.0:
        notes.append(f"health {health:g}" + (f" ({inp.health_note})" if inp.health_note else ""))
    return raw, raw * health, components, notes


def _normalise(replicas: Sequence[str], health: Sequence[float], rows: Sequence[Row]) -> dict[str, ReplicaWeight]:
    total = sum(effective for _, effective, _, _ in rows)
    result: dict[str, ReplicaWeight] = {}
    for replica, replica_health, (raw, effective, components, notes) in zip(replicas, health, rows, strict=True):
        if total <= 0:
            notes.append("pool has no replica with a positive weight")
        result[replica] = ReplicaWeight(
            replica=replica,
            weight=effective / total if total > 0 else 0.0,
            raw_score=raw,
            health=replica_health,
            reason="; ".join(notes) if notes else "ok",
            components=components,
        )
    return result


def compute_weights(inputs: Iterable[WeightInput], config: WeightConfig | None = None) -> dict[str, ReplicaWeight]:
    """Weights of one model's pool: seed §1 × health, normalised to sum 1 (or all 0).

    The plain reference, one replica at a time; the decider uses :func:`pool_weights`.
    """
    cfg = config or WeightConfig()
    inputs = list(inputs)
    rows = [_row(inp, cfg) for inp in inputs]
    return _normalise([inp.replica for inp in inputs], [inp.health for inp in inputs], rows)


# The notes of a row computed as columns, by which signals it lacks (its code: bit 1 mem, 2 queue,
# 4 latency): the reference's notes for those signals, its reason (the notes joined) and the sum of
# the present signals' coefficients, added in the reference's order. A row as columns lacks mem
# only for want of any telemetry sample (a stale or partial sample has its own note, left to the
# reference).
_MISSING_NOTES = ("mem missing (no telemetry)", "queue missing (not reported)", "latency missing (empty window)")
_COLUMN_NOTES = tuple([note for bit, note in enumerate(_MISSING_NOTES) if code >> bit & 1] for code in range(8))
_COLUMN_REASONS = np.array(["; ".join(notes) or "ok" for notes in _COLUMN_NOTES], dtype=object)


@functools.lru_cache(maxsize=16)
def _present_coefficients(config: WeightConfig) -> npt.NDArray[np.float64]:
    """By code: the sum of the present signals' coefficients, as :func:`load_denominator` adds them."""
    sums = []
    for code in range(8):
        present = 0.0
        for bit, coef in enumerate((config.mem_coef, config.queue_coef, config.latency_coef)):
            if not code >> bit & 1:
                present += coef
        sums.append(present)
    return np.array(sums)


def _floats_or_none(column: npt.NDArray[np.float64], missing: npt.NDArray[np.bool_]) -> list[float | None]:
    """``column`` as Python floats, None where ``missing`` (the reference's missing component)."""
    if not missing.any():
        return column.tolist()
    if missing.all():
        return [None] * len(column)
    values = column.astype(object)
    values[missing] = None
    return values.tolist()


POOL_WEIGHT_FIELDS = ("queue_length_mean", "latency_mean")  # what pool_weights reads as columns
POOL_WEIGHT_TELEMETRY_FIELDS = ("memory_used_bytes", "memory_total_bytes", "queue_length")  # ... of telemetry


def pool_weights(
    step: StepColumns,
    replicas: Sequence[str],
    telemetry: Mapping[str, tuple[TelemetrySample, float]],
    health: Sequence[tuple[float, str | None]],
    config: WeightConfig,
) -> dict[str, ReplicaWeight]:
    """:func:`compute_weights` over a model's step as columns; the same results, bit for bit.

    ``step`` holds each replica's vector (an empty one for a replica without a summary, which
    weighs the same as none) and its fresh telemetry, in ``replicas`` order, as do ``health``
    (score, note); ``telemetry`` maps a replica to its latest (sample, age).
    The usual replica (healthy, above the idle floor, with at least one signal, and
    without telemetry at all or with a fresh sample giving memory) is computed as columns, its
    missing signals included; any other row goes through the reference's per-replica code, for
    its notes. This runs per model and step, so it keeps to few numpy calls (each costs about
    as much as a few replicas' arithmetic): a pool without fresh telemetry skips its columns.
    """
    cfg = config
    n = len(replicas)
    fresh = step.telemetry
    # invalid/divide/over: NaN and inf rows are never computed as columns (the screen below)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        events_queue = step.column("queue_length_mean")
        if not any(map(operator.is_not, fresh, repeat(None))):  # no fresh sample (identity, no __eq__):
            # mem missing everywhere, queue from the events
            mem, no_mem, queue = None, np.ones(n, dtype=np.bool_), events_queue
        else:
            # TelemetrySample.memory_ratio as columns: used / total clamped to [0, 1], unknown without both
            used, total = step.telemetry_column("memory_used_bytes"), step.telemetry_column("memory_total_bytes")
            mem = np.minimum(np.maximum(used / total, 0.0), 1.0)
            mem[total == 0] = np.nan  # NaN / x and x / NaN are NaN already
            no_mem = np.isnan(mem)
            queue = np.where(np.isnan(events_queue), step.telemetry_column("queue_length"), events_queue)
        queue = np.minimum(np.maximum(queue, 0.0) / cfg.queue_cap, 1.0) + 0.0  # (-0.0 is 0.0, as the reference)
        latency = np.minimum(np.maximum(step.column("latency_mean"), 0.0) / cfg.latency_ref_ms, 1.0)
        no_queue, no_latency = np.isnan(queue), np.isnan(latency)
        codes = no_mem + (no_queue << 1) + (no_latency << 2)  # bool + int: the int64 code of each row
        # the reference sums the present signals from 0.0 in the order mem, queue, latency; fmax
        # turns a missing (NaN) term into 0.0, which leaves the sum unchanged (every term is >= 0;
        # the sign of a zero sum does not matter: such a row is below the floor, a reference row)
        weighted = np.fmax(cfg.queue_coef * queue, 0.0)
        if mem is not None:
            weighted = np.fmax(cfg.mem_coef * mem, 0.0) + weighted  # (mem + queue) + latency, the order
        weighted += np.fmax(cfg.latency_coef * latency, 0.0)
        total_coef = cfg.mem_coef + cfg.queue_coef + cfg.latency_coef
        denominator = total_coef * weighted / _present_coefficients(cfg)[codes]
        raws = (1.0 / denominator).tolist()
        # not floored and at least one signal (no signal: 0 / 0, NaN, which compares False)
        columnar = denominator >= cfg.min_denominator
    scores = [score for score, _ in health]
    if scores.count(1.0) != n:
        columnar &= np.array(scores, dtype=np.float64) == 1.0
    if telemetry:
        # mem missing despite a sample (stale, or without memory used/total): the reference says which
        no_telemetry: tuple[None, None] = (None, None)
        for row in np.flatnonzero(no_mem & columnar).tolist():
            if telemetry.get(replicas[row], no_telemetry)[0] is not None:
                columnar[row] = False
    vectors = step.vectors
    for row in np.flatnonzero(np.isnan(events_queue) & columnar).tolist():
        if vectors[row].queue_length_mean is not None:  # NaN, which the reference takes as a queue (NaN)
            columnar[row] = False
    first_code = int(codes[0]) if n else 0
    reasons = (_COLUMN_REASONS[codes].tolist() if (codes != first_code).any()
               else [_COLUMN_REASONS[first_code]] * n)
    columns = ([None] * n if mem is None else _floats_or_none(mem, no_mem), _floats_or_none(queue, no_queue),
               _floats_or_none(latency, no_latency), denominator.tolist())
    if columnar.all():
        # the common case: every replica as columns, health 1.0, raw > 0 so the total is too
        pool_total = sum(raws)
        return {
            replica: ReplicaWeight(replica, raw / pool_total, raw, 1.0, reason,
                                   {"mem": m, "queue": q, "latency": lat, "denominator": d})
            for replica, raw, reason, m, q, lat, d in zip(replicas, raws, reasons, *columns, strict=True)
        }
    by_reference: dict[int, Row] = {}
    no_sample: tuple[None, None] = (None, None)
    effective = list(raws)
    for row in np.flatnonzero(~columnar).tolist():
        sample, age = telemetry.get(replicas[row], no_sample)
        weight_input = WeightInput(replicas[row], step.vectors[row], sample, age, health[row][0], health[row][1])
        reference_row = by_reference[row] = _row(weight_input, cfg)
        effective[row] = reference_row[1]
    pool_total = sum(effective)
    if not pool_total > 0:
        # (only with no row as columns, each adding raw > 0, or a NaN from the reference's rows)
        rows = [by_reference.get(row) or (raws[row], raws[row], {"mem": columns[0][row], "queue": columns[1][row],
                                                                 "latency": columns[2][row],
                                                                 "denominator": columns[3][row]},
                                          list(_COLUMN_NOTES[codes[row]]))
                for row in range(n)]
        return _normalise(replicas, scores, rows)
    result: dict[str, ReplicaWeight] = {}
    for row, (replica, raw, reason, m, q, lat, d) in enumerate(zip(replicas, raws, reasons, *columns, strict=True)):
        found = by_reference.get(row)
        if found is None:
            result[replica] = ReplicaWeight(replica, raw / pool_total, raw, 1.0, reason,
                                            {"mem": m, "queue": q, "latency": lat, "denominator": d})
        else:
            reference_raw, effective_raw, components, notes = found
            result[replica] = ReplicaWeight(replica, effective_raw / pool_total, reference_raw, scores[row],
                                            "; ".join(notes) if notes else "ok", components)
    return result
