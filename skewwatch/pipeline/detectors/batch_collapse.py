"""Batch collapse: batch sizes scatter while batches run mostly empty (seed §2.5, §4.2).

Seed rule: "批处理坍塌: batch_size标准差 > 2 且平均填充率 < 30% → CRITICAL; 动态调整batch
scheduler策略" (std(batch_size) > 2 and mean fill < 30 % → CRITICAL; change the batch
scheduler's policy). The seed gives no persistence, so the alert opens on the first step the rule
holds (``persistence = 1``) and resolves after ``clear_steps`` steps without it.

The action ``adjust_batch_policy`` sends ``params.max_batch_size`` from the seed's §4.2
controller (:mod:`skewwatch.pipeline.batch_controller`): queue length from the window's mean
``queue_length`` (else the engine's telemetry, else the window's mean batch size, so the
recommendation keeps today's batches rather than inventing one), GPU utilisation from telemetry,
P95 from the window.

>>> from skewwatch.pipeline.features import FeatureVector
>>> fv = FeatureVector(model="m", replica="r1", window_start=0.0, window_end=60.0, count=50,
...                    batch_size_mean=4.0, batch_size_std=3.0, batch_fill_mean=0.2,
...                    queue_length_mean=10.0, latency_p95=150.0)
>>> out = BatchCollapseDetector().update(fv, None, now=60.0)
>>> str(out.alerts[0].severity), out.actions[0].action, out.actions[0].params
('CRITICAL', 'adjust_batch_policy', {'max_batch_size': 10})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from skewwatch.pipeline.batch_controller import BatchControllerConfig, recommend_batch_size
from skewwatch.pipeline.detectors.base import DetectorConfig, Finding, Severity, ThresholdDetector, fmt
from skewwatch.pipeline.features import FeatureVector
from skewwatch.pipeline.telemetry import TelemetrySample


@dataclass(frozen=True, slots=True)
class BatchCollapseConfig(DetectorConfig):
    std_threshold: float = 2.0  # seed: std(batch_size) > 2
    fill_threshold: float = 0.30  # seed: mean fill < 30 %
    persistence: int = 1  # seed: none given
    # seed §4.2 controller
    queue_cap: float = 32.0
    max_batch_size: float = 64.0
    low_util: float = 0.4
    high_p95_ms: float = 120.0
    shrink: float = 0.7
    high_util: float = 0.85
    low_p95_ms: float = 80.0
    grow: float = 1.3

    section: ClassVar[str] = "batch_collapse"

    def validate(self) -> None:
        DetectorConfig.validate(self)
        self._require(0.0 < self.fill_threshold <= 1.0, "fill_threshold", "must be in (0, 1]")
        self._require(self.std_threshold >= 0, "std_threshold", "must be >= 0")
        self._require(self.queue_cap >= 1, "queue_cap", "must be >= 1")
        self._require(self.max_batch_size >= 1, "max_batch_size", "must be >= 1")

    @property
    def controller(self) -> BatchControllerConfig:
        return BatchControllerConfig(
            queue_cap=self.queue_cap,
            max_batch_size=self.max_batch_size,
            low_util=self.low_util,
            high_p95_ms=self.high_p95_ms,
            shrink=self.shrink,
            high_util=self.high_util,
            low_p95_ms=self.low_p95_ms,
            grow=self.grow,
        )


class BatchCollapseDetector(ThresholdDetector):
    name = "batch_collapse"
    Config = BatchCollapseConfig
    config: BatchCollapseConfig

    def rule_meta(self, rule: str) -> tuple[Severity, str | None, str]:
        cfg = self.config
        return (
            Severity.CRITICAL,
            "adjust_batch_policy",
            f"batch collapse: std(batch_size) > {cfg.std_threshold:g} and fill < {cfg.fill_threshold:.0%}",
        )

    def evaluate(
        self, fv: FeatureVector, telemetry: TelemetrySample | None, memory: dict[str, Any]
    ) -> dict[str, Finding]:
        cfg = self.config
        std, fill = fv.batch_size_std, fv.batch_fill_mean
        evidence: dict[str, float | int | str | None] = {
            "batch_size_std": std,
            "batch_fill_mean": fill,
            "batch_size_mean": fv.batch_size_mean,
            "std_threshold": cfg.std_threshold,
            "fill_threshold": cfg.fill_threshold,
        }
        if fv.count == 0 or std is None or fill is None:
            return {"main": Finding(holds=None, evidence=evidence)}
        holds = std > cfg.std_threshold and fill < cfg.fill_threshold
        params: dict[str, Any] = {}
        if holds:
            queue, queue_source = _queue_length(fv, telemetry)
            util = telemetry.utilization_gpu if telemetry is not None else None
            size = recommend_batch_size(queue, util, fv.latency_p95, cfg.controller)
            params = {"max_batch_size": size}
            evidence.update(
                {
                    "queue_length": queue,
                    "queue_source": queue_source,
                    "gpu_utilization": util,
                    "latency_p95_ms": fv.latency_p95,
                    "max_batch_size": size,
                }
            )
        message = (
            f"batch collapse: std(batch_size) {fmt(std, 2)} > {cfg.std_threshold:g} and mean fill "
            f"{fmt(None if fill is None else 100 * fill)} % < {100 * cfg.fill_threshold:g} %"
        )
        if params:
            message += f"; recommend max_batch_size {params['max_batch_size']}"
        return {"main": Finding(holds=holds, message=message, evidence=evidence, params=params)}


def _queue_length(fv: FeatureVector, telemetry: TelemetrySample | None) -> tuple[float, str]:
    """The controller's queue length and where it came from."""
    if fv.queue_length_mean is not None:
        return fv.queue_length_mean, "events"
    if telemetry is not None and telemetry.queue_length is not None:
        return float(telemetry.queue_length), "telemetry"
    if fv.batch_size_mean is not None:
        return fv.batch_size_mean, "batch_size_mean"
    return 1.0, "none"
