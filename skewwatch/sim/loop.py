"""The closed routing loop without Kafka: the pipeline's pure weights computed in-process.

Issue 5's ``dynamic`` policy applies the weights the worker publishes on
``llm.routing-corrections``, in lockstep on event time. The full loop runs the real worker on a
real broker; this module is the same loop with the broker and worker replaced by the pure
functions they run (:func:`skewwatch.pipeline.reference.reference_features` for the 60 s window,
:func:`skewwatch.pipeline.weights.compute_weights` for the seed's formula), so a seeded closed
loop runs in CI in seconds and the simulator's router can be checked on its own.

Use it as the simulator's ``on_step``: after step k's chunk is built, it computes every
replica's features and weights from the events and telemetry of that chunk and the ones before,
and applies them as a routing correction before step k+1 is simulated (lockstep).

>>> from skewwatch.sim.fleet import FleetConfig, FleetSimulator
>>> loop = LocalWeightsLoop()
>>> sim = FleetSimulator(FleetConfig(replicas=2, policy="dynamic", load=0.5), 1_700_000_000.0, 20,
...                      on_step=loop)
>>> _ = list(sim.chunks())
>>> loop.corrections[-1]["model"], sorted(loop.corrections[-1]["weights"])
('llama-3-70b', ['r0', 'r1'])
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from skewwatch.config import WindowSettings
from skewwatch.pipeline.reference import reference_features
from skewwatch.pipeline.telemetry import TelemetrySample
from skewwatch.pipeline.weights import WeightConfig, WeightInput, compute_weights
from skewwatch.sim.generator import TrafficChunk, event_rows

if TYPE_CHECKING:
    from skewwatch.sim.fleet import FleetSimulator


class LocalWeightsLoop:
    """``on_step`` callback: seed-formula weights from the last 60 s, applied to the router."""

    def __init__(self, window: WindowSettings | None = None, weights: WeightConfig | None = None) -> None:
        self.window = window or WindowSettings()
        self.weight_config = weights or WeightConfig()
        self._events: deque[dict[str, Any]] = deque()
        self._telemetry: dict[str, TelemetrySample] = {}
        self._silent: dict[str, int] = {}
        self.corrections: list[dict[str, Any]] = []  # every correction applied, in order

    def __call__(self, sim: FleetSimulator, chunk: TrafficChunk) -> None:
        end = chunk.end_ts
        self._events.extend(event_rows(chunk.requests))
        while self._events and self._events[0]["ts"] < end - self.window.length_s:
            self._events.popleft()
        for sample in chunk.telemetry:
            self._telemetry[sample.replica] = sample
        events = list(self._events)
        for model, pool in sim.pools.items():
            inputs = []
            for replica in pool:
                fv = reference_features(events, model, replica.name, end, self.window)
                silent = 0 if fv.step_count else self._silent.get(replica.name, 0) + 1
                self._silent[replica.name] = silent
                tel = self._telemetry.get(replica.name)
                inputs.append(WeightInput(replica.name, fv, tel,
                                          telemetry_age_s=None if tel is None else end - tel.ts,
                                          silent_steps=silent))
            weights = compute_weights(inputs, self.weight_config)
            record = {"model": model, "ts": end, "weights": {r: w.weight for r, w in weights.items()},
                      "actions": []}
            self.corrections.append(record)
            sim.apply_correction(record, end)
