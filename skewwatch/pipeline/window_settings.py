"""The ``[window]`` section: the sliding windows per replica and how event time advances.

It lives in ``pipeline/`` because the windowing code is built from it, and ``pipeline/`` never
imports the settings loader (:mod:`skewwatch.config`): the loader composes the pipeline's own
settings types (this one, :class:`~skewwatch.pipeline.detector_settings.DetectorSettings`), so
the dependency runs one way, config -> pipeline. :mod:`skewwatch.config` re-exports it.

>>> WindowSettings(length_s=60.0, step_s=5.0).length_s / WindowSettings().step_s
12.0
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from skewwatch.config_section import ConfigSection, NonNegative, Positive


class WindowSettings(ConfigSection):
    """``[window]``: the sliding windows per replica and how event time advances."""

    section = "window"

    length_s: Positive = 60.0  # seed §2.5: 60 s sliding window
    step_s: Positive = 5.0  # seed §2.5: a feature vector every 5 s
    allowed_lateness_s: NonNegative = 5.0  # events older than watermark are late: counted, not folded in
    idle_release_s: Positive = 90.0  # a replica silent this long (past window + grace) is released
    partition_idle_s: Positive = 10.0  # wall seconds without input before an idle partition follows the others
    sketch_relative_accuracy: Annotated[float, Meta(gt=0, lt=1)] = 0.01  # quantile sketch: <= 1 % relative error
    # a telemetry partition read this far (event time) ahead of the requests' watermark is paused until
    # the requests catch up: a backlog of telemetry would otherwise push the samples old steps need out
    # of the join's history (telemetry_join.history_for: 23 samples, 110 s at the 5 s interval)
    telemetry_ahead_s: Positive = 60.0

    def __post_init__(self) -> None:
        steps = self.length_s / self.step_s
        self._require(steps >= 1 and abs(steps - round(steps)) <= 1e-9, "length_s",
                      f"must be a whole number of step_s ({self.step_s:g} s) steps")



__all__ = ["WindowSettings"]
