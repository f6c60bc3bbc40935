"""KV-cache pressure: the seed's multi-signal diagnosis of throughput, KV hit rate and
memory fragmentation (seed §2.4).

Seed (Python)::

    if frag_ratio > 0.4 and hit_rate < 0.65:
        return "显存碎片引发KV重加载"          # fragmentation forces KV reloads
    elif thru < 120 and hit_rate > 0.85:
        return "计算单元未饱和检查prefill调度"  # compute not saturated, check prefill scheduling

Two rules, each with its own hysteresis (the alert's ``evidence.rule`` says which):

* ``fragmentation`` (WARNING): allocator fragmentation above ``fragmentation_threshold`` (0.4, the
  seed's: ``1 - allocated / reserved`` from telemetry, ``TelemetrySample.fragmentation``, a ratio of
  the allocator's own numbers that means the same on any fleet) and the KV hit rate *lower than its
  baseline*: the replica's peers' (the median of the other replicas' window hit rates, at least
  ``min_peers`` with ``fragmentation_min_count`` requests) or, without peers, its own past (an exponentially
  weighted mean of its window's hit rate over the steps where the rule did not hold, time
  constant ``baseline_tau_s``, known after ``baseline_steps`` steps). The hit rate that is normal
  depends on the traffic's prefix reuse (chat history, shared system prompts): the seed's 0.65 is
  one fleet's. Fragmentation is the evidence, read on
  ``persistence`` (2) scrapes in a row; the hit rate falling says the fragmentation costs reloads.
  With ``relative_hit_rate = false`` (the seed profile) the seed's ``hit rate < low_hit_rate``.
* ``prefill`` (INFO): throughput under ``throughput_threshold`` (120 tokens/s) with a KV hit rate
  above ``high_hit_rate`` (0.85): the engine generates little although prefill is mostly skipped.
  By default only *while requests wait* (fresh telemetry ``queue_length >= 1``, else the window's
  mean queue length ``>= 1``): a replica that is sent little generates little, and that is no
  diagnosis (``require_waiting = false``: the seed's rule as written).

KV hit rate is the window's mean from the request events, else the engine's telemetry. A rule
whose signals are missing is *silent*: no alert, no claim. The prefill rule needs at least
``min_count`` (6) finished requests in the window; the fragmentation rule ``fragmentation_min_count``
(1): its evidence is the allocator's, fresh on every scrape however few requests finish, and the
window's hit rate only says which way it went (a replica of a request a minute is judged too). The
own past learns only from windows of ``min_count``. The seed names no action for these diagnoses,
so the alerts carry none; severities are ours.

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> def idle(end):  # little generated, prefill mostly skipped, 3 requests waiting
...     return FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=40,
...                          tokens_per_s=90.0, kv_cache_hit_rate_mean=0.9, queue_length_mean=3.0)
>>> det = KvPressureDetector()
>>> [(a.message.split(":")[0], a.evidence["rule"]) for e in (60.0, 65.0) for a in det.update(idle(e), None, e).alerts]
[('compute not saturated, check prefill scheduling', 'prefill')]
>>> def frag(end, hit):
...     v = FeatureVector(model="m", replica="r1", window_start=end - 60, window_end=end, count=40,
...                       kv_cache_hit_rate_mean=hit)
...     return v, TelemetrySample(ts=end, replica="r1", source="vllm", memory_reserved_bytes=10e9,
...                               memory_allocated_bytes=4e9)
>>> det = KvPressureDetector()
>>> [det.update(*frag(60.0 + 5 * i, 0.75), now=60.0 + 5 * i).alerts for i in range(14)][-1]  # its past
[]
>>> [a.evidence["rule"] for e in (130.0, 135.0) for a in det.update(*frag(e, 0.6), now=e).alerts]
['fragmentation']
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.config_section import Count, NonNegative, Positive, Unit
from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.key_columns import KeyColumns
from skewwatch.pipeline.detectors.peers import others_median
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import DetectorConfig, Finding, ThresholdDetector
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

FRAGMENTATION_MESSAGE = "fragmentation forces KV reloads"
PREFILL_MESSAGE = "compute not saturated, check prefill scheduling"

#: The ``seed`` profile's section (skewwatch.pipeline.detectors.profiles): the seed's rules as written.
PROFILE_SEED: dict[str, Any] = {"relative_hit_rate": False, "require_waiting": False, "persistence": 1,
                                "min_count": 1}

BASELINE_KEY = "hit_baseline"  # [weight, mean]: the replica's own past hit rate


class KvPressureConfig(DetectorConfig, frozen=True):
    """``[detectors.kv_pressure]``: the seed §2.4 diagnoses, relative to the pool and with evidence."""

    section = "detectors.kv_pressure"

    fragmentation_threshold: Unit = 0.4  # seed: frag_ratio > 0.4
    low_hit_rate: Unit = 0.65  # seed: and hit_rate < 0.65 (with relative_hit_rate off)
    throughput_threshold: NonNegative = 120.0  # seed: thru < 120 tokens/s
    high_hit_rate: Unit = 0.85  # seed: and hit_rate > 0.85
    persistence: Count = 2  # fragmentation on two scrapes in a row
    min_count: Count = 6  # the evidence floor: fewer finished requests in the window -> no claim
    # the fragmentation rule's floor: its evidence is the allocator's own numbers on `persistence`
    # scrapes, whatever the request rate; the window's hit rate (here, and the peers') only says which way
    fragmentation_min_count: Count = 1
    relative_hit_rate: bool = True  # the hit rate below the peers' / its own past, not below low_hit_rate
    min_peers: Count = 2  # peers with min_count requests for a pool baseline
    baseline_tau_s: Positive = 300.0  # without peers: the time constant of the replica's own past hit rate
    baseline_steps: Count = 12  # ... and the steps of it needed before it judges
    require_waiting: bool = True  # prefill: only while requests wait


class KvPressureDetector(ThresholdDetector):
    name = "kv_pressure"
    Config = KvPressureConfig
    config: KvPressureConfig
    rules = ("fragmentation", "prefill")

    def __init__(self, config: KvPressureConfig | None = None) -> None:
        super().__init__(config)
        # the current step's peers' hit rate per row (NaN: no pool baseline) and its key -> row
        self._peer_hit: npt.NDArray[np.float64] = np.zeros(0)
        self._row_of: dict[str, int] = {}
        # the replicas' own past hit rate, [weight, mean] per key (the memory's BASELINE_KEY), as
        # columns: every replica of a step folds its window in at once
        self._baseline = KeyColumns(width=2)

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        if rule == "fragmentation":
            return Severity.WARNING, None, FRAGMENTATION_MESSAGE
        return Severity.INFO, None, PREFILL_MESSAGE

    remembers = True  # the own-past hit rate is kept every step

    def step_fields(self) -> tuple[str, ...]:
        return ("count", "kv_cache_hit_rate_mean", "tokens_per_s")

    def step_telemetry_fields(self) -> tuple[str, ...]:
        return ("kv_cache_hit_rate", "memory_allocated_bytes", "memory_reserved_bytes")

    def prepare(self, step: StepColumns | None) -> None:
        """Each replica's peers' KV hit rate (median of the others' windows with enough requests)."""
        self._peer_hit, self._row_of = np.zeros(0), {}
        cfg = self.config
        if step is None or not cfg.relative_hit_rate or len(step) < 2:
            return
        hit = step.column("kv_cache_hit_rate_mean")
        valid = (step.column("count") >= min(cfg.min_count, cfg.fragmentation_min_count)) & ~np.isnan(hit)
        peers = others_median(hit, valid, cfg.min_peers)
        self._peer_hit, self._row_of = peers, step.row_of

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_]:
        """Both rules over the step's replicas as columns, loosened where they need a baseline
        (NaN, i.e. a missing signal, never holds)."""
        cfg = self.config
        hit = step.column("kv_cache_hit_rate_mean")
        fragmentation: npt.NDArray[np.bool_] | None = None
        # some replica has a fresh sample (by identity: list.count(None) would call each sample's __eq__);
        # else no fragmentation and no hit rate from telemetry
        if any(map(operator.is_not, step.telemetry, repeat(None))):
            hit = np.where(np.isnan(hit), step.telemetry_column("kv_cache_hit_rate"), hit)
            # TelemetrySample.fragmentation as columns: 1 - allocated / reserved in [0, 1], unknown without both
            allocated = step.telemetry_column("memory_allocated_bytes")
            reserved = step.telemetry_column("memory_reserved_bytes")
            with np.errstate(divide="ignore", invalid="ignore"):
                frag = np.where(~np.isnan(allocated) & ~np.isnan(reserved) & (reserved != 0),
                                np.minimum(np.maximum(1.0 - allocated / reserved, 0.0), 1.0), np.nan)
            fragmentation = frag > cfg.fragmentation_threshold
            if not cfg.relative_hit_rate:
                fragmentation &= hit < cfg.low_hit_rate
        count = step.column("count")
        holds = (count >= cfg.min_count) & (step.column("tokens_per_s") < cfg.throughput_threshold) & (
            hit > cfg.high_hit_rate)
        if fragmentation is not None:
            holds |= (count >= cfg.fragmentation_min_count) & fragmentation
        return ~holds

    def remember(self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]) -> None:
        self._remember(fv, telemetry)

    def remember_step(self, step: StepColumns, rows: npt.NDArray[np.int64]) -> None:
        """:meth:`remember` of the step's ``rows`` as columns: the same arithmetic, element-wise."""
        cfg = self.config
        if not cfg.relative_hit_rate or len(rows) == 0:
            return
        hit = step.column("kv_cache_hit_rate_mean")
        if any(map(operator.is_not, step.telemetry, repeat(None))):  # as _hit_rate: the events', else telemetry's
            hit = np.where(np.isnan(hit), step.telemetry_column("kv_cache_hit_rate"), hit)
        hit, count = hit[rows], step.column("count")[rows]
        folded = (count >= cfg.min_count) & ~np.isnan(hit)
        keys = step.keys
        chosen = rows[folded] if not folded.all() else rows
        own = self._baseline.rows(keys if len(chosen) == len(keys) else [keys[row] for row in chosen.tolist()])
        before = self._baseline.read(own, 0)
        absent = np.isnan(before[:, 0])  # no past yet: [0.0, 0.0], as _remember starts it
        weight_before = np.where(absent, 0.0, before[:, 0])
        mean_before = np.where(absent, 0.0, before[:, 1])
        weight = (1.0 - self._alpha()) * weight_before + 1.0
        updated = np.empty((len(own), 2))
        updated[:, 0] = weight
        updated[:, 1] = mean_before + ((hit[folded] if len(chosen) < len(rows) else hit) - mean_before) / weight
        self._baseline.put(own, 0, updated)

    def _alpha(self) -> float:
        return min(5.0 / self.config.baseline_tau_s, 1.0)  # one step of 5 s

    def _own_past(self, key: str) -> float | None:
        """The replica's own past hit rate, once it has ``baseline_steps`` steps behind it."""
        row = self._baseline.get(self._baseline.row(key), 0)
        return None if row is None or row[0] < self.config.baseline_steps else float(row[1])

    def _remember(self, fv: FeatureVector, telemetry: TelemetrySample | None) -> None:
        """Fold this window's hit rate (with enough requests) into the replica's own past."""
        cfg = self.config
        hit, _ = _hit_rate(fv, telemetry)
        if not cfg.relative_hit_rate or hit is None or fv.count < cfg.min_count:
            return
        own = self._baseline.add(fv.key)
        row = self._baseline.get(own, 0) or [0.0, 0.0]
        weight = (1.0 - self._alpha()) * row[0] + 1.0
        mean = row[1] + (hit - row[1]) / weight
        self._baseline.put(np.array([own]), 0, np.array([[weight, mean]]))

    def column_memory(self) -> dict[str, dict[str, Any]]:
        baseline = self._baseline
        return {key: {BASELINE_KEY: row} for key in baseline.held_keys()
                if (row := baseline.get(baseline.row(key), 0)) is not None}

    def load_column_memory(self, key: str, memory: dict[str, Any]) -> None:
        row = memory.pop(BASELINE_KEY, None)
        if row is not None:
            self._baseline.put(np.array([self._baseline.add(key)]), 0, np.array([[float(row[0]), float(row[1])]]))

    def clear_column_memory(self) -> None:
        self._baseline.clear()

    def forget(self, key: str) -> None:
        super().forget(key)
        self._baseline.forget(key)

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        before = self._own_past(fv.key)
        hit, hit_source = _hit_rate(fv, telemetry)
        frag = telemetry.fragmentation if telemetry is not None else None
        thru = fv.tokens_per_s
        evidence: dict[str, float | int | str | None] = {
            "kv_cache_hit_rate": hit,
            "hit_rate_source": hit_source,
            "fragmentation": frag,
            "tokens_per_s": thru,
            "count": fv.count,
        }
        none = Finding(None, evidence=evidence)
        if hit is None or fv.count < min(cfg.min_count, cfg.fragmentation_min_count):
            self._remember(fv, telemetry)
            return {"fragmentation": none, "prefill": none}
        fragmentation = (self._fragmentation(fv, hit, frag, before, evidence)
                         if fv.count >= cfg.fragmentation_min_count else none)
        if not fragmentation.holds:  # the own past learns only from steps without the fault
            self._remember(fv, telemetry)
        prefill = self._prefill(fv, telemetry, hit, thru, evidence) if fv.count >= cfg.min_count else none
        return {"fragmentation": fragmentation, "prefill": prefill}

    def _fragmentation(self, fv: FeatureVector, hit: float, frag: float | None, before: float | None,
                       evidence: dict[str, Any]) -> Finding:
        cfg = self.config
        if frag is None:
            return Finding(None, evidence=evidence)
        evidence = {**evidence, "fragmentation_threshold": cfg.fragmentation_threshold}
        if cfg.relative_hit_rate:
            row = self._row_of.get(fv.key)
            peers = None if row is None or np.isnan(self._peer_hit[row]) else float(self._peer_hit[row])
            baseline, source = (peers, "peers") if peers is not None else (before, "own past")
            if baseline is None:
                return Finding(None, evidence=evidence)
            evidence.update({"baseline_hit_rate": baseline, "baseline": source})
            low, condition = hit < baseline, f"below the {source}' {fmt(baseline, 2)}"
        else:
            evidence["low_hit_rate"] = cfg.low_hit_rate
            low, condition = hit < cfg.low_hit_rate, f"< {cfg.low_hit_rate:g}"
        return Finding(
            holds=frag > cfg.fragmentation_threshold and low,
            message=(
                f"{FRAGMENTATION_MESSAGE}: fragmentation {fmt(frag, 2)} > {cfg.fragmentation_threshold:g} "
                f"and KV hit rate {fmt(hit, 2)} {condition}"
            ),
            evidence=evidence,
        )

    def _prefill(self, fv: FeatureVector, telemetry: TelemetrySample | None, hit: float, thru: float,
                 evidence: dict[str, Any]) -> Finding:
        cfg = self.config
        evidence = {**evidence, "throughput_threshold": cfg.throughput_threshold, "high_hit_rate": cfg.high_hit_rate}
        holds = thru < cfg.throughput_threshold and hit > cfg.high_hit_rate
        message = (
            f"{PREFILL_MESSAGE}: {fmt(thru)} tokens/s < {cfg.throughput_threshold:g} "
            f"and KV hit rate {fmt(hit, 2)} > {cfg.high_hit_rate:g}"
        )
        if cfg.require_waiting:
            waiting = telemetry.queue_length if telemetry is not None and telemetry.queue_length is not None \
                else fv.queue_length_mean
            evidence["waiting"] = waiting
            if waiting is None:
                return Finding(None, evidence=evidence)
            holds = holds and waiting >= 1
            message += f" while {fmt(waiting, 0)} requests wait"
        return Finding(holds=holds, message=message, evidence=evidence)


def _hit_rate(fv: FeatureVector, telemetry: TelemetrySample | None) -> tuple[float | None, str | None]:
    """The window's mean KV hit rate from the events, else the engine's telemetry."""
    if fv.kv_cache_hit_rate_mean is not None:
        return fv.kv_cache_hit_rate_mean, "events"
    if telemetry is not None and telemetry.kv_cache_hit_rate is not None:
        return telemetry.kv_cache_hit_rate, "telemetry"
    return None, None
