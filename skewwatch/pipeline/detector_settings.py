"""The ``[detectors]`` table: one section per detector, plus weights, corrections and the decider.

Each detector's section is the detector's own ``Config`` (beside the detector, e.g.
:class:`~skewwatch.pipeline.detectors.long_tail_config.LongTailConfig`); weights, corrections and the
gpu_health scores likewise live beside the code they drive. :class:`DetectorSettings` only
composes them, so ``[detectors.<name>]`` in TOML and ``SKEWWATCH_DETECTORS__<NAME>__<KEY>`` in
the environment reach exactly the parameters the detector declares (the settings loader,
:mod:`skewwatch.config`, checks them when the settings load).

>>> s = DetectorSettings.from_overrides({"long_tail": {"ratio": "4"}, "weights": {"panic_threshold": 0.3}})
>>> s.long_tail.ratio, s.weights.panic_threshold, s.corrections.heartbeat_s
(4.0, 0.3, 30.0)
>>> sorted(s.detector_configs()) == sorted(DETECTORS)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from msgspec import field

from skewwatch.config_section import FrozenConfigSection, Positive, convert, parse_strings
from skewwatch.pipeline.corrections import CorrectionConfig
from skewwatch.pipeline.detectors.base import Detector
from skewwatch.pipeline.detectors.batch_collapse import BatchCollapseConfig
from skewwatch.pipeline.detectors.context_burst import ContextBurstConfig
from skewwatch.pipeline.detectors.kv_pressure import KvPressureConfig
from skewwatch.pipeline.detectors.learned_config import LearnedConfig
from skewwatch.pipeline.detectors.long_tail_config import LongTailConfig
from skewwatch.pipeline.detectors.profiles import ProfileName, with_profile
from skewwatch.pipeline.detectors.registry import DETECTORS
from skewwatch.pipeline.detectors.slow_replica import SlowReplicaConfig
from skewwatch.pipeline.health import HealthConfig
from skewwatch.pipeline.weights import WeightConfig


class DeciderConfig(FrozenConfigSection, frozen=True):
    """``[detectors.decider]``: which detectors run where, and when a replica is released."""

    section = "detectors.decider"

    disabled: tuple[str, ...] = ()  # detector names not to run
    model_level: tuple[str, ...] = ()  # detectors also run on the per-model vector (alerts only)
    release_after_s: Positive = 600.0  # a replica silent this long leaves the pool and its state is dropped
    window_s: Positive = 60.0  # length given to the empty vector of a replica without a summary
    # stage 2: with no input at all for this long (wall clock), steps close empty so alerts and
    # weights do not freeze (event time otherwise; a replay never waits this long)
    idle_advance_s: Positive = 60.0

    def __post_init__(self) -> None:
        for key in ("disabled", "model_level"):
            for name in getattr(self, key):
                self._require(name in DETECTORS, key,
                              f"names a detector that does not exist ({name!r}; known: {', '.join(DETECTORS)})")


class DetectorSettings(FrozenConfigSection, frozen=True):
    """Every detector's configuration plus weights, corrections and the decider (``[detectors]``).

    A field per registered detector, named as the detector; a test checks the two agree.
    ``profile`` names the defaults the detectors' sections start from
    (:mod:`~skewwatch.pipeline.detectors.profiles`: ``default``, ``seed``).
    """

    section = "detectors"

    profile: ProfileName = "default"

    long_tail: LongTailConfig = field(default_factory=LongTailConfig)
    slow_replica: SlowReplicaConfig = field(default_factory=SlowReplicaConfig)
    batch_collapse: BatchCollapseConfig = field(default_factory=BatchCollapseConfig)
    context_burst: ContextBurstConfig = field(default_factory=ContextBurstConfig)
    kv_pressure: KvPressureConfig = field(default_factory=KvPressureConfig)
    gpu_health: HealthConfig = field(default_factory=HealthConfig)
    learned: LearnedConfig = field(default_factory=LearnedConfig)
    weights: WeightConfig = field(default_factory=WeightConfig)
    corrections: CorrectionConfig = field(default_factory=CorrectionConfig)
    decider: DeciderConfig = field(default_factory=DeciderConfig)

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None = None) -> Self:
        """Defaults, the profile ``overrides`` name, then ``overrides`` (TOML values or text);
        ConfigError on an unknown key or a bad value."""
        raw = {str(key).strip().lower(): value for key, value in (overrides or {}).items()}
        return convert(with_profile(parse_strings(raw, cls)), cls)

    def detector_configs(self) -> dict[str, FrozenConfigSection]:
        """Detector name -> its configuration, in registry order."""
        return {name: getattr(self, name) for name in DETECTORS}

    def build_detectors(self) -> dict[str, Detector]:
        """Fresh detectors, in registry order, without the disabled ones."""
        return {name: cls(getattr(self, name)) for name, cls in DETECTORS.items()
                if name not in self.decider.disabled}


__all__ = ["DeciderConfig", "DetectorSettings"]
