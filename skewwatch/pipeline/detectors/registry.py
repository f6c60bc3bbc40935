"""The registry of the seed's detectors: name -> class (each with its ``Config`` beside it).

Kept apart from ``__init__`` so that ``health.py`` can import ``detectors.base`` without
importing every detector (``gpu_health`` imports ``health``).

>>> sorted(DETECTORS)
['batch_collapse', 'context_burst', 'gpu_health', 'kv_pressure', 'long_tail']
>>> DETECTORS["long_tail"].Config.from_overrides({"ratio": "4"}).ratio
4.0
"""

from __future__ import annotations

from skewwatch.pipeline.detectors.base import (
    Action,
    Alert,
    Detector,
    DetectorConfig,
    DetectorOutput,
    Finding,
    Hysteresis,
    Severity,
    ThresholdDetector,
)
from skewwatch.pipeline.detectors.batch_collapse import BatchCollapseConfig, BatchCollapseDetector
from skewwatch.pipeline.detectors.context_burst import ContextBurstConfig, ContextBurstDetector
from skewwatch.pipeline.detectors.gpu_health import GpuHealthDetector
from skewwatch.pipeline.detectors.kv_pressure import KvPressureConfig, KvPressureDetector
from skewwatch.pipeline.detectors.long_tail import LongTailConfig, LongTailDetector

DETECTORS: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        LongTailDetector,
        BatchCollapseDetector,
        ContextBurstDetector,
        KvPressureDetector,
        GpuHealthDetector,
    )
}


__all__ = [
    "DETECTORS",
    "Action",
    "Alert",
    "BatchCollapseConfig",
    "BatchCollapseDetector",
    "ContextBurstConfig",
    "ContextBurstDetector",
    "Detector",
    "DetectorConfig",
    "DetectorOutput",
    "Finding",
    "GpuHealthDetector",
    "Hysteresis",
    "KvPressureConfig",
    "KvPressureDetector",
    "LongTailConfig",
    "LongTailDetector",
    "Severity",
    "ThresholdDetector",
]
