"""The registry of the seed's detectors: name -> class (each with its ``Config`` beside it).

Kept apart from the package's ``__init__`` so that a module the detectors use (``health.py``,
which ``gpu_health`` imports) can import ``detectors.alerts`` or ``detectors.step_columns``
without importing every detector.

>>> sorted(DETECTORS)
['batch_collapse', 'context_burst', 'gpu_health', 'kv_pressure', 'learned', 'long_tail', 'slow_replica']
>>> DETECTORS["long_tail"].Config.from_overrides({"ratio": "4"}).ratio
4.0
"""

from __future__ import annotations

from skewwatch.pipeline.detectors.base import Detector
from skewwatch.pipeline.detectors.batch_collapse import BatchCollapseConfig, BatchCollapseDetector
from skewwatch.pipeline.detectors.context_burst import ContextBurstConfig, ContextBurstDetector
from skewwatch.pipeline.detectors.gpu_health import GpuHealthDetector
from skewwatch.pipeline.detectors.kv_pressure import KvPressureConfig, KvPressureDetector
from skewwatch.pipeline.detectors.learned import LearnedDetector
from skewwatch.pipeline.detectors.learned_config import LearnedConfig
from skewwatch.pipeline.detectors.long_tail import LongTailDetector
from skewwatch.pipeline.detectors.long_tail_config import LongTailConfig
from skewwatch.pipeline.detectors.slow_replica import SlowReplicaConfig, SlowReplicaDetector

DETECTORS: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        LongTailDetector,
        BatchCollapseDetector,
        ContextBurstDetector,
        KvPressureDetector,
        GpuHealthDetector,
        LearnedDetector,
        SlowReplicaDetector,
    )
}


__all__ = [
    "DETECTORS",
    "BatchCollapseConfig",
    "BatchCollapseDetector",
    "ContextBurstConfig",
    "ContextBurstDetector",
    "GpuHealthDetector",
    "KvPressureConfig",
    "KvPressureDetector",
    "LearnedConfig",
    "LearnedDetector",
    "LongTailConfig",
    "LongTailDetector",
    "SlowReplicaConfig",
    "SlowReplicaDetector",
]
