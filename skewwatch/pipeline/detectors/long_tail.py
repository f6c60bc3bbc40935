"""Long tail: P99 latency above 3 × P50 for 3 consecutive steps (seed §2.5).

Seed rule: "长尾请求: P99延迟 > 3×P50 且持续≥3个周期 → WARNING; 启用请求采样链路追踪注入"
(P99 > 3 × P50 lasting at least 3 periods → WARNING; turn on request sampling / tracing).

The rule is evaluated on the replica's 60 s window every 5 s step. A window with fewer than
``min_count`` requests cannot be judged: its P99 is simply its maximum (guard added by us; the
seed gives no minimum, set ``min_count = 1`` to evaluate every non-empty window). The action
``enable_tracing`` carries ``params.sample_rate`` (share of the replica's requests to trace).

>>> from skewwatch.pipeline.features import FeatureVector
>>> det = LongTailDetector()
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=100,
...                    latency_p50=100.0, latency_p99=450.0)
>>> [len(det.update(fv, None, now=60.0 + 5 * i).alerts) for i in range(4)]
[0, 0, 1, 0]
>>> det.update(fv, None, now=80.0).actions[0].action
'enable_tracing'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from skewwatch.pipeline.detectors.base import DetectorConfig, Finding, Severity, ThresholdDetector, fmt
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.telemetry import TelemetrySample


@dataclass(frozen=True, slots=True)
class LongTailConfig(DetectorConfig):
    ratio: float = 3.0  # seed: P99 > 3 × P50
    persistence: int = 3  # seed: for >= 3 consecutive steps
    min_count: int = 20  # ours: fewer requests than this in the window -> not evaluated
    sample_rate: float = 1.0  # enable_tracing: share of the replica's requests to trace

    section: ClassVar[str] = "long_tail"

    def validate(self) -> None:
        DetectorConfig.validate(self)
        self._require(self.ratio > 1.0, "ratio", "must be > 1")
        self._require(0.0 < self.sample_rate <= 1.0, "sample_rate", "must be in (0, 1]")
        self._require(self.min_count >= 0, "min_count", "must be >= 0")


class LongTailDetector(ThresholdDetector):
    name = "long_tail"
    Config = LongTailConfig
    config: LongTailConfig

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        return Severity.WARNING, "enable_tracing", f"long tail: p99 > {self.config.ratio:g} x p50"

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
