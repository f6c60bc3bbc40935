"""The detector contract: what every detector is, whatever its rules.

A detector is pure and stateful: the decider calls ``update`` once per key (``model/replica`` or
``model``) per 5 s step with that step's feature vector and the replica's fresh telemetry, and
gets alert transitions and the actions in force back. Its state is kept as live objects between
steps and turned into plain JSON-able data only when a checkpoint asks (``state_dict`` /
``load_state``, format :data:`STATE_VERSION`). Every threshold is a field of the detector's
``Config`` (a msgspec Struct beside the detector, default = the seed's value), checked when the
settings load (``[detectors.<name>]``, ``SKEWWATCH_DETECTORS__<NAME>__<KEY>``).

The contract test (tests/unit/test_detector_contract.py) holds every registered detector to it.
Most detectors are rules with hysteresis: :class:`~skewwatch.pipeline.detectors.threshold.ThresholdDetector`.

>>> from skewwatch.pipeline.detectors.registry import DETECTORS
>>> all(issubclass(cls, Detector) and cls.Config.section == f"detectors.{name}" for name, cls in DETECTORS.items())
True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from skewwatch.config_section import FrozenConfigSection
from skewwatch.pipeline.detectors.alerts import Action, Alert, DetectorOutput, Severity
from skewwatch.pipeline.detectors.step_columns import StepColumns
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.telemetry_sample import TelemetrySample

STATE_VERSION = 1  # the format of state_dict(); load_state() refuses any other


class Detector(ABC):
    """A pure, stateful detector: ``update`` once per key per step, state as plain data on request.

    Live state is kept as objects between steps; ``state_dict`` serialises it only when a
    checkpoint is taken, and ``load_state`` rebuilds the objects.
    """

    name: ClassVar[str]  # the detector's name: its [detectors.<name>] table and the alerts' "detector"
    Config: ClassVar[type[FrozenConfigSection]]  # its configuration type (beside it)
    # True: the rule reads finished requests, so a replica whose window holds none is not judged and
    # its open alerts resolve (no evidence). False: it also judges a replica without traffic (faults
    # reported by telemetry, hardware errors).
    needs_traffic: ClassVar[bool] = True

    def __init__(self, config: FrozenConfigSection | None = None) -> None:
        self.config = config if config is not None else self.Config()
        if not isinstance(self.config, self.Config):
            raise TypeError(f"{self.name}: config must be {self.Config.__name__}, got {type(config).__name__}")

    @abstractmethod
    def update(self, fv: FeatureVector, telemetry: TelemetrySample | None, now: float) -> DetectorOutput:
        """Fold one step of one key (``fv.key``) in; return alert transitions and actions in force.

        ``telemetry`` is the replica's latest *fresh* sample (None when absent or stale);
        ``now`` is the step's event time (``fv.window_end``), never the wall clock.
        """

    def update_into(
        self,
        fv: FeatureVector,
        telemetry: TelemetrySample | None,
        now: float,
        alerts: list[Alert],
        actions: list[Action],
    ) -> None:
        """``update``, appending to the caller's lists (the decider's hot path: no output object
        per key and step). Detectors on that path override it and implement ``update`` with it."""
        out = self.update(fv, telemetry, now)
        alerts.extend(out.alerts)
        actions.extend(out.actions)

    def step_fields(self) -> tuple[str, ...]:
        """The :class:`~skewwatch.schemas.feature_vector.FeatureVector` fields this detector reads as
        columns of a step (``StepColumns.column``), as configured: the decider reads every
        detector's in one pass over the step's vectors. Default none; a field left out is still
        read, alone, when asked for."""
        return ()

    def step_telemetry_fields(self) -> tuple[str, ...]:
        """Likewise, the :class:`~skewwatch.schemas.telemetry_sample.TelemetrySample` fields it
        reads as columns (``StepColumns.telemetry_column``)."""
        return ()

    def update_step(self, step: StepColumns, now: float, alerts: list[Alert], actions: list[Action]) -> None:
        """``update`` every replica of one model's step (the decider's entry point), in ``step``
        order. Detectors that can judge the step as columns override it."""
        update_into = self.update_into
        for fv, telemetry in zip(step.vectors, step.telemetry, strict=True):
            update_into(fv, telemetry, now, alerts, actions)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """All per-key state as JSON-able data."""

    @abstractmethod
    def load_state(self, state: Mapping[str, Any]) -> None:
        """Replace all state with one produced by ``state_dict`` (of this detector's version)."""

    @abstractmethod
    def forget(self, key: str) -> None:
        """Drop a key's state (a replica released by the windows)."""

    @abstractmethod
    def open_alerts(self) -> dict[str, Severity]:
        """Keys with an open alert and its severity (for the open-alerts metric)."""


__all__ = ["STATE_VERSION", "Detector"]
