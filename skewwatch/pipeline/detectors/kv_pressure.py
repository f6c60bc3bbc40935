"""KV-cache pressure: the seed's multi-signal diagnosis of throughput, KV hit rate and
memory fragmentation (seed §2.4).

Seed (Python)::

    if frag_ratio > 0.4 and hit_rate < 0.65:
        return "显存碎片引发KV重加载"          # fragmentation forces KV reloads
    elif thru < 120 and hit_rate > 0.85:
        return "计算单元未饱和检查prefill调度"  # compute not saturated, check prefill scheduling

Two rules, each with its own hysteresis (the alert's ``evidence.rule`` says which):

* ``fragmentation`` (WARNING): fragmentation > 0.4 and KV hit rate < 0.65 — "fragmentation
  forces KV reloads". Fragmentation is ``1 - allocated / reserved`` from telemetry
  (``TelemetrySample.fragmentation``, torch's caching allocator).
* ``prefill`` (INFO): throughput < 120 tokens/s and KV hit rate > 0.85 — "compute not
  saturated, check prefill scheduling". Throughput is the window's generated tokens per second.

KV hit rate is the window's mean from the request events, else the engine's telemetry. A rule
whose signals are missing is *silent*: no alert, no claim (e.g. no fragmentation without
allocator telemetry). An empty window is never diagnosed (its throughput is 0 because nobody
sent anything, not because compute is idle). The seed names no action for these diagnoses, so
the alerts carry none; severities are ours (the seed gives none).

>>> from skewwatch.schemas.feature_vector import FeatureVector
>>> from skewwatch.schemas.telemetry_sample import TelemetrySample
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=40,
...                    tokens_per_s=90.0, kv_cache_hit_rate_mean=0.9)
>>> out = KvPressureDetector().update(fv, None, now=60.0)
>>> out.alerts[0].message.split(":")[0], out.alerts[0].evidence["rule"]
('compute not saturated, check prefill scheduling', 'prefill')
>>> KvPressureDetector().update(FeatureVector(model="m", replica="r1", window_start=0.0,
...     window_end=60.0, count=40, kv_cache_hit_rate_mean=0.5), None, now=60.0).alerts
[]
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.config_section import Count, NonNegative, Unit
from skewwatch.pipeline.detectors.alerts import Severity, fmt
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.pipeline.detectors.threshold import DetectorConfig, Finding, ThresholdDetector
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

FRAGMENTATION_MESSAGE = "fragmentation forces KV reloads"
PREFILL_MESSAGE = "compute not saturated, check prefill scheduling"


class KvPressureConfig(DetectorConfig, frozen=True):
    """``[detectors.kv_pressure]``: the seed's two KV-cache rules."""

    section = "detectors.kv_pressure"

    fragmentation_threshold: Unit = 0.4  # seed: frag_ratio > 0.4
    low_hit_rate: Unit = 0.65  # seed: and hit_rate < 0.65
    throughput_threshold: NonNegative = 120.0  # seed: thru < 120 tokens/s
    high_hit_rate: Unit = 0.85  # seed: and hit_rate > 0.85
    persistence: Count = 1  # seed: none given


class KvPressureDetector(ThresholdDetector):
    name = "kv_pressure"
    Config = KvPressureConfig
    config: KvPressureConfig
    rules = ("fragmentation", "prefill")

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        if rule == "fragmentation":
            return Severity.WARNING, None, FRAGMENTATION_MESSAGE
        return Severity.INFO, None, PREFILL_MESSAGE

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_]:
        """Both rules over the step's replicas as columns (NaN, i.e. a missing signal, never holds)."""
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
            fragmentation = (frag > cfg.fragmentation_threshold) & (hit < cfg.low_hit_rate)
        holds = (step.column("tokens_per_s") < cfg.throughput_threshold) & (hit > cfg.high_hit_rate)
        if fragmentation is not None:
            holds |= fragmentation
        return ~((step.column("count") > 0) & holds)

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        hit, hit_source = fv.kv_cache_hit_rate_mean, "events"
        if hit is None and telemetry is not None and telemetry.kv_cache_hit_rate is not None:
            hit, hit_source = telemetry.kv_cache_hit_rate, "telemetry"
        frag = telemetry.fragmentation if telemetry is not None else None
        thru = fv.tokens_per_s
        evidence: dict[str, float | int | str | None] = {
            "kv_cache_hit_rate": hit,
            "hit_rate_source": hit_source if hit is not None else None,
            "fragmentation": frag,
            "tokens_per_s": thru,
            "count": fv.count,
        }
        if fv.count == 0 or hit is None:
            return {
                "fragmentation": Finding(None, evidence=evidence),
                "prefill": Finding(None, evidence=evidence),
            }

        if frag is None:
            fragmentation = Finding(None, evidence=evidence)
        else:
            fragmentation = Finding(
                holds=frag > cfg.fragmentation_threshold and hit < cfg.low_hit_rate,
                message=(
                    f"{FRAGMENTATION_MESSAGE}: fragmentation {fmt(frag, 2)} "
                    f"> {cfg.fragmentation_threshold:g} "
                    f"and KV hit rate {fmt(hit, 2)} < {cfg.low_hit_rate:g}"
                ),
                evidence={
                    **evidence,
                    "fragmentation_threshold": cfg.fragmentation_threshold,
                    "low_hit_rate": cfg.low_hit_rate,
                },
            )
        prefill = Finding(
            holds=thru < cfg.throughput_threshold and hit > cfg.high_hit_rate,
            message=(
                f"{PREFILL_MESSAGE}: {fmt(thru)} tokens/s < {cfg.throughput_threshold:g} "
                f"and KV hit rate {fmt(hit, 2)} > {cfg.high_hit_rate:g}"
            ),
            evidence={
                **evidence,
                "throughput_threshold": cfg.throughput_threshold,
                "high_hit_rate": cfg.high_hit_rate,
            },
        )
        return {"fragmentation": fragmentation, "prefill": prefill}
