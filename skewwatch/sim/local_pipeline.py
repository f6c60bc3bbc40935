"""The worker's two stages in-process: simulated traffic -> alerts and routing corrections, no Kafka.

``skewwatch worker`` runs stage 1 (per input partition: decode, 60 s windows per replica, the
telemetry join, one hand-off record per model and step) and stage 2 (per model: merge the
replicas' summaries, run the :class:`~skewwatch.pipeline.model_decisions.ModelDecider`, publish). Both
are thin glue around pure parts; :class:`LocalPipeline` composes the same parts on the
simulator's chunks, in the order the stages use them:

1. the chunk's telemetry into a :class:`~skewwatch.pipeline.telemetry_join.TelemetryJoin`, its
   requests (batch sizes derived as stage 1 derives them) into one
   :class:`~skewwatch.pipeline.window.PartitionWindows`, whose watermark follows the events as a
   worker partition's does (the newest event time minus the allowed lateness, 5 s), the closed
   steps out;
2. per model and step, each replica's step with its merged telemetry as of the step's end, as
   stage 2 receives them (:class:`~skewwatch.pipeline.replica_step_record.ReplicaStepInput`; the hand-off
   record between the stages decodes to objects equal to these, ``tests/unit/test_replica_step_record.py``, so
   it is not encoded here: that saves a fifth of the time);
3. :func:`~skewwatch.pipeline.model_merge.merge_model_features` and the model's decider, the
   telemetry passed with its age.

It records every alert and every correction the decider returns, as the dicts the worker
publishes on ``llm.alerts`` and ``llm.routing-corrections``, so the detection-quality benchmark
scores both modes with the same code. Used as the simulator's ``on_step`` it can also close the
routing loop (``apply=True``): each step's correction reaches the router ``lag_steps`` later.

Why the result equals the worker's on the simulator's traffic: the simulator releases a chunk
only when no later request can finish before its end, so every event of a step is in before the
step closes (no event is late); the decider is a pure function of the steps in event-time order;
telemetry is joined as of each step's end. One input partition here against the worker's
several changes nothing a decider sees (windows are per replica; the stage 2 assembler waits for
every replica of a model). What may differ: (1) the steps a replica gets *before its first
event* (or its first after its window state was released): a replica is known from the moment
its first event is applied, and the worker applies a poll's events in slices of up to 30 s of
event time before closing the steps they complete, so it may report a replica with an empty
step earlier than here, where a step closes as soon as the next 5 s are in; (2) telemetry the
worker has not read yet when a step closes (a poll that fetched requests ahead of the telemetry
topic) is joined one sample older there; (3) the worker's wall-clock rules: stage 2 releases a
model's pending step after 10 s of wall time without input (and stage 1 moves an idle input
partition's watermark to the others'), so on a loaded machine a step may be decided without the
replicas of a partition that lagged, which then count as silent for it. Once every replica of a
model has reported and the worker keeps up, both give the same records
(``tests/integration/test_quality_modes.py``).

>>> from skewwatch.sim.fleet import FleetConfig, FleetSimulator
>>> from skewwatch.sim.faults import Injection
>>> pipe = LocalPipeline()
>>> config = FleetConfig(replicas=3, load=0.5, seed=1, injections=(Injection("gpu_fault", "r1", 60, 60),))
>>> for chunk in FleetSimulator(config, 1_700_000_000.0, 150).chunks():
...     _ = pipe.feed(chunk)
>>> sorted({a["replica"] for a in pipe.alerts if a["detector"] == "gpu_health" and a["state"] == "open"})
['r1']
>>> pipe.corrections[-1]["model"], sorted(pipe.corrections[-1]["weights"])
('llama-3-70b', ['r0', 'r1', 'r2'])
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from skewwatch.config import Settings, load_settings
from skewwatch.pipeline.derived_batch import derive_batch
from skewwatch.pipeline.model_decisions import ModelDecider
from skewwatch.pipeline.model_merge import merge_model_features
from skewwatch.pipeline.replica_step_record import ReplicaStepInput, record_parts
from skewwatch.pipeline.telemetry_join import TelemetryJoin, history_for
from skewwatch.pipeline.window import PartitionWindows, WindowSummary
from skewwatch.schemas.feature_vector import FeatureVector
from skewwatch.schemas.requests.columns import RequestColumns
from skewwatch.schemas.telemetry_sample import TelemetrySample
from skewwatch.sim.generator import TrafficChunk

if TYPE_CHECKING:
    from skewwatch.sim.fleet import FleetSimulator

#: What the benchmarks run the worker with: a correction every step (the default heartbeat, 30 s,
#: publishes only on change), so the weights can be scored step by step.
EVERY_STEP = {"SKEWWATCH_DETECTORS__CORRECTIONS__HEARTBEAT_S": "5"}


class LocalPipeline:
    """Stage 1 and stage 2 of the worker over simulated chunks, in-process; see the module docstring.

    ``settings``: the worker's settings (windows, detectors); default: :func:`load_settings` of no
    file with :data:`EVERY_STEP` only (the process's environment is not read: what is measured
    must not depend on it). ``apply``: hand each correction to the simulator's router,
    ``lag_steps`` steps after its own (as the real loop, which waits for the allowed lateness).
    """

    def __init__(self, settings: Settings | None = None, *, apply: bool = False, lag_steps: int = 0) -> None:
        self.settings = settings if settings is not None else load_settings(None, env=EVERY_STEP)
        self.detector_settings = self.settings.detectors
        self.windows = PartitionWindows(self.settings.window)
        self.telemetry = TelemetryJoin(history=history_for(self.settings.window))
        self.telemetry_stale_s = self.detector_settings.weights.telemetry_max_age_s
        self.deciders: dict[str, ModelDecider] = {}
        self.alerts: list[dict[str, Any]] = []  # every alert record, in publishing order
        self.corrections: list[dict[str, Any]] = []  # every correction record, in publishing order
        self.apply = apply
        self._pending: deque[dict[str, Any]] = deque()  # corrections not yet applied (lag)
        self._lag = lag_steps

    # ------------------------------------------------------------------ stage 1

    def feed(self, chunk: TrafficChunk) -> list[dict[str, Any]]:
        """Fold one chunk in and decide every step it closes; returns the corrections it produced."""
        for sample in chunk.telemetry:
            self.telemetry.add(sample)
        if len(chunk.requests):
            self.windows.apply(self._derive_batch(chunk.requests))
        by_model: dict[tuple[float, str], tuple[list[FeatureVector], list[WindowSummary]]] = {}
        for batch in self.windows.close_steps().batches:  # as stage 1: vectors, and each model's rows merged
            for model, _, features, summary in record_parts(batch):
                vectors, summaries = by_model.setdefault((batch.window_end, model), ([], []))
                vectors.extend(features)
                summaries.append(summary)
        self.telemetry.release_idle(now=chunk.end_ts)
        made: list[dict[str, Any]] = []
        for (window_end, model), (vectors, summaries) in sorted(by_model.items(), key=lambda kv: kv[0]):
            correction = self._decide(model, window_end, vectors, summaries)
            if correction is not None:
                made.append(correction)
        return made

    def _derive_batch(self, columns: RequestColumns) -> RequestColumns:
        """As stage 1: batch sizes the events lack, from the replica's telemetry as of each event."""
        config = self.settings.derived_batch
        if not config.enabled:
            return columns
        return derive_batch(columns, lambda replica, at: self.telemetry.view(
            replica, at, config.max_telemetry_age_s)[0], config.capacity_for_model).columns

    # ------------------------------------------------------------------ stage 2

    def _decide(self, model: str, window_end: float, vectors: list[FeatureVector],
                summaries: list[WindowSummary]) -> dict[str, Any] | None:
        inputs = {fv.replica or "": ReplicaStepInput(
            fv, self.telemetry.view(fv.replica or "", window_end, self.telemetry_stale_s)[0]) for fv in vectors}
        model_fv = merge_model_features(model, window_end, summaries, self.settings.window)
        telemetry: dict[str, tuple[TelemetrySample, float]] = {
            replica: (p.telemetry, window_end - p.telemetry.ts)
            for replica, p in inputs.items() if p.telemetry is not None}
        decider = self.deciders.get(model)
        if decider is None:
            decider = self.deciders[model] = ModelDecider(self.detector_settings, model=model)
        decision = decider.step(model, window_end, [p.features for p in inputs.values()], model_fv, telemetry)
        self.alerts.extend(alert.to_dict() for alert in decision.alerts)
        if decision.correction is None:
            return None
        correction = decision.correction.to_dict()
        self.corrections.append(correction)
        return correction

    # ------------------------------------------------------------------ the loop

    def __call__(self, sim: FleetSimulator, chunk: TrafficChunk) -> None:
        """``on_step``: feed the chunk; with ``apply``, hand the router the corrections now due."""
        made = self.feed(chunk)
        if not self.apply:
            return
        self._pending.extend(made)
        due = chunk.end_ts - self._lag * self.settings.window.step_s
        while self._pending and float(self._pending[0]["ts"]) <= due:
            sim.apply_correction(self._pending.popleft(), chunk.end_ts)
