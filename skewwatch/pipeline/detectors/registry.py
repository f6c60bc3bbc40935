"""The registry of the seed's detectors: name -> class, and building them from settings.

Kept apart from ``__init__`` so that ``health.py`` can import ``detectors.base`` without
importing every detector (``gpu_health`` imports ``health``).

>>> sorted(DETECTORS)
['batch_collapse', 'context_burst', 'gpu_health', 'kv_pressure', 'long_tail']
>>> build_detectors({"long_tail": {"ratio": "4"}})["long_tail"].config.ratio
4.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skewwatch.pipeline.detectors.base import (
    Action,
    Alert,
    Detector,
    DetectorConfig,
    DetectorOutput,
    Finding,
    Hysteresis,
    OverridableConfig,
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


def build_detectors(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Detector]:
    """One instance of every detector, configured from ``Settings.detectors``-style overrides.

    Sections that are not detector names are ignored here (``weights``, ``corrections`` are
    read by their own modules); a typo in a key inside a detector's section is an error.
    """
    overrides = overrides or {}
    return {name: cls(cls.Config.from_overrides(overrides.get(name))) for name, cls in DETECTORS.items()}


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
    "OverridableConfig",
    "Severity",
    "ThresholdDetector",
    "build_detectors",
]
