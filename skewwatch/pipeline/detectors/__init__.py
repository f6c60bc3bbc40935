"""The seed's detectors (seed §2.4, §2.5, §4.3), one module each, and what they share.

* ``alerts``: Alert, Action, Severity, DetectorOutput (what detectors emit)
* ``hysteresis``: Hysteresis (when a rule that holds opens and resolves an alert)
* ``step_columns``: StepColumns (one model's step as columns, shared by its detectors)
* ``base``: Detector (the contract every detector meets)
* ``threshold``: ThresholdDetector, DetectorConfig, Finding (rules with hysteresis)
* ``long_tail``, ``batch_collapse``, ``context_burst``, ``kv_pressure``, ``gpu_health``,
  ``slow_replica``: the detectors, each with its ``Config``
* ``registry``: ``DETECTORS`` (name -> class)

This package's ``__init__`` imports nothing, so ``skewwatch.pipeline.health`` can use the shared
modules without a circular import.
"""
