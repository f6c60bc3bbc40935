"""The seed's detectors (seed §2.4, §2.5, §4.3), one module each.

* ``base``: Alert, Action, Severity, DetectorConfig, Hysteresis, Detector, ThresholdDetector
* ``long_tail``, ``batch_collapse``, ``context_burst``, ``kv_pressure``, ``gpu_health``
* ``registry``: ``DETECTORS`` (name -> class)

This package's ``__init__`` imports nothing, so ``skewwatch.pipeline.health`` can use
``detectors.base`` without a circular import.
"""
