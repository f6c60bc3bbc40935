"""Long tail: P99 latency above 3 × P50 for 3 consecutive steps (seed §2.5).

Seed rule: "长尾请求: P99延迟 > 3×P50 且持续≥3个周期 → WARNING; 启用请求采样链路追踪注入"
(P99 > 3 × P50 lasting at least 3 periods → WARNING; turn on request sampling / tracing).

The rule is evaluated on the replica's 60 s window every 5 s step. A window with fewer than
``min_count`` requests cannot be judged: its P99 is simply its maximum (guard added by us; the
seed gives no minimum, set ``min_count = 1`` to evaluate every non-empty window). The action
``enable_tracing`` carries ``params.sample_rate`` (share of the replica's requests to trace).

**Option ``length_normalized``** (ours, off by default; on in ``bench/profiles/tuned.toml``):
an LLM request's latency follows its output length, so on real traffic P99/P50 is mostly the
spread of output lengths (3.7-7.5 on healthy replicas of the fleet simulator) and the seed's
rule holds everywhere. With the option the rule compares P99 with what the window's output
lengths explain instead: ``expected P99 = (latency_mean / completion_tokens_mean) x P99 of the
output length``, that P99 from a log-normal fit of the window's ``completion_tokens_mean`` and
``completion_tokens_var`` (lengths are heavy-tailed; a normal fit under-reads them). The rule
holds when ``latency_p99 > length_ratio x expected P99`` (healthy windows of the fleet
simulator: about 0.7, at most 1.1 on the conv trace and 1.26 on the code trace, whose P99/P50
reaches 43). It needs no history and no per-trace ratio, but it still sees
a slowed request only when it *finishes*: a tail of slow long requests shows a minute or more
after it starts (see docs/detectors.md).

>>> from skewwatch.pipeline.features import FeatureVector
>>> det = LongTailDetector()
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=100,
...                    latency_p50=100.0, latency_p99=450.0)
>>> [len(det.update(fv, None, now=60.0 + 5 * i).alerts) for i in range(4)]
[0, 0, 1, 0]
>>> det.update(fv, None, now=80.0).actions[0].action
'enable_tracing'
>>> norm = LongTailDetector(LongTailConfig(length_normalized=True, persistence=1))
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=100,
...                    latency_p50=3000.0, latency_p99=40000.0, latency_mean=6000.0,
...                    completion_tokens_mean=200.0, completion_tokens_var=200.0 ** 2)
>>> round(norm.update(fv, None, now=60.0).alerts[0].evidence["p99_over_expected"], 2)
1.36
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.detectors.base import (
    DetectorConfig,
    Finding,
    Severity,
    StepColumns,
    ThresholdDetector,
    fmt,
)
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.telemetry import TelemetrySample

Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True, slots=True)
class LongTailConfig(DetectorConfig):
    ratio: float = 3.0  # seed: P99 > 3 × P50
    persistence: int = 3  # seed: for >= 3 consecutive steps
    min_count: int = 20  # ours: fewer requests than this in the window -> not evaluated
    sample_rate: float = 1.0  # enable_tracing: share of the replica's requests to trace
    # ours, off by default: judge P99 against what the window's output lengths explain, not P50
    length_normalized: bool = False
    length_ratio: float = 1.3  # P99 > this x (latency per output token x P99 output length)

    section: ClassVar[str] = "long_tail"

    def validate(self) -> None:
        DetectorConfig.validate(self)
        self._require(self.ratio > 1.0, "ratio", "must be > 1")
        self._require(0.0 < self.sample_rate <= 1.0, "sample_rate", "must be in (0, 1]")
        self._require(self.min_count >= 0, "min_count", "must be >= 0")
        self._require(self.length_ratio > 0, "length_ratio", "must be > 0")


class LongTailDetector(ThresholdDetector):
    name = "long_tail"
    Config = LongTailConfig
    config: LongTailConfig

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        cfg = self.config
        if cfg.length_normalized:
            return (Severity.WARNING, "enable_tracing",
                    f"long tail: p99 > {cfg.length_ratio:g} x the p99 its output lengths explain")
        return Severity.WARNING, "enable_tracing", f"long tail: p99 > {cfg.ratio:g} x p50"

    def quiet(self, step: StepColumns) -> npt.NDArray[np.bool_] | None:
        """The seed rule over the step's replicas as columns (None, i.e. evaluate each, for
        ``length_normalized``)."""
        cfg = self.config
        if cfg.length_normalized:
            return None
        p50, p99 = step.column("latency_p50"), step.column("latency_p99")
        return ~((step.column("count") >= max(cfg.min_count, 1)) & (p50 > 0) & (p99 > cfg.ratio * p50))

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        p50, p99 = fv.latency_p50, fv.latency_p99
        evidence: dict[str, float | int | str | None] = {
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "ratio_threshold": cfg.ratio,
            "count": fv.count,
        }
        if cfg.length_normalized:
            return {"main": self._length_normalized(fv, evidence)}
        if p50 is None or p99 is None or p50 <= 0 or fv.count < max(cfg.min_count, 1):
            return {"main": Finding(holds=None, evidence=evidence)}
        ratio = p99 / p50
        evidence["p99_over_p50"] = ratio
        message = (
            f"long tail: p99 {fmt(p99)} ms is {ratio:.2f} x p50 {fmt(p50)} ms "
            f"(> {cfg.ratio:g} x for >= {cfg.persistence} steps)"
        )
        return {
            "main": Finding(
                holds=p99 > cfg.ratio * p50,
                message=message,
                evidence=evidence,
                params={"sample_rate": cfg.sample_rate},
            )
        }

    def _length_normalized(self, fv: FeatureVector, evidence: dict[str, Any]) -> Finding:
        """The ``length_normalized`` rule: P99 against the P99 the window's output lengths explain."""
        cfg = self.config
        p99, mean, tokens, var = fv.latency_p99, fv.latency_mean, fv.completion_tokens_mean, fv.completion_tokens_var
        evidence["length_ratio_threshold"] = cfg.length_ratio
        if p99 is None or mean is None or tokens is None or var is None or tokens <= 0 or mean <= 0 \
                or fv.count < max(cfg.min_count, 1):
            return Finding(holds=None, evidence=evidence)
        per_token = mean / tokens
        expected = per_token * lognormal_p99(tokens, var)
        ratio = p99 / expected
        evidence.update({"latency_per_token_ms": per_token, "expected_p99_ms": expected, "p99_over_expected": ratio})
        message = (
            f"long tail: p99 {fmt(p99)} ms is {ratio:.2f} x the {fmt(expected)} ms its output lengths explain "
            f"({fmt(per_token, 2)} ms/token; > {cfg.length_ratio:g} x for >= {cfg.persistence} steps)"
        )
        return Finding(holds=ratio > cfg.length_ratio, message=message, evidence=evidence,
                       params={"sample_rate": cfg.sample_rate})


def lognormal_p99(mean: float, var: float) -> float:
    """P99 of a log-normal distribution with this mean and variance (``var = 0``: the mean).

    >>> round(lognormal_p99(200.0, 200.0 ** 2), 1)
    981.0
    """
    sigma2 = math.log1p(var / (mean * mean))
    sigma = math.sqrt(sigma2)
    return mean * math.exp(-sigma2 / 2 + Z99 * sigma)

